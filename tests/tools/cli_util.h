// Running the moekit CLI from the tests: its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "io/temp_dir.h"

namespace moekit::test {

struct Result {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline Result moekit(const std::string& arguments, const std::string& env = "") {
  static TempDir dir;
  const std::string out = dir.file("stdout"), err = dir.file("stderr");
  const std::string command = env + " " + MOEKIT_CLI_PATH + " " + arguments + " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace moekit::test
