// What the fuzz targets share: a scratch folder of this process (the readers take paths), and
// the rule that only moekit::Error may come out of a parser. Any other exception escapes the
// target, and libFuzzer reports it as a crash (an uncaught exception aborts).
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace moekit::fuzz {

// A folder under TMPDIR (else /tmp) made once per process, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/moekit_fuzz_XXXXXX";
    if (!::mkdtemp(pattern.data())) std::abort();
    return pattern;
  }();
  return dir;
}

// Replaces `name` in the scratch folder with exactly `bytes`.
inline std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) std::abort();
    done += std::size_t(n);
  }
  ::close(fd);
  return path;
}

inline void remove_file(const std::string& name) { std::remove((scratch_dir() + "/" + name).c_str()); }

// The parsers' threads: one, so that a crash reproduces in one stack and runs stay fast.
inline void single_thread() { ::setenv("MOEKIT_NUM_THREADS", "1", 1); }

}  // namespace moekit::fuzz
