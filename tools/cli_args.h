// Command-line flags: "--name value" and "--switch", checked against what a command declares.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace moekit::cli {

// A bad command line: printed as one line, exit code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

struct Flag {
  std::string name;  // without the leading "--"
  bool takes_value;
  std::string help;
};

class Args {
 public:
  // Parses argv[first..argc) against flags; unknown flags, missing values and repeats are UsageErrors.
  // "-h" is "--help".
  Args(int argc, char** argv, int first, const std::vector<Flag>& flags);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  // An integer in [lo, hi]; UsageError naming the flag otherwise.
  std::int64_t get_int(const std::string& name, std::int64_t fallback, std::int64_t lo, std::int64_t hi) const;
  // A comma-separated list ("a,b"); an empty item ("a,,b", "a,", "") is a UsageError naming the flag.
  std::vector<std::string> get_list(const std::string& name, const std::string& fallback) const;
  // The same of integers in [lo, hi] each.
  std::vector<std::int64_t> get_int_list(const std::string& name, const std::string& fallback, std::int64_t lo,
                                         std::int64_t hi) const;

 private:
  std::map<std::string, std::string> values_;
};

std::string usage_of(const std::string& command, const std::vector<Flag>& flags);

}  // namespace moekit::cli
