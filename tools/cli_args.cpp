#include "cli_args.h"

#include <cerrno>
#include <cstdlib>

namespace moekit::cli {

Args::Args(int argc, char** argv, int first, const std::vector<Flag>& flags) {
  for (int i = first; i < argc; ++i) {
    const std::string word = std::string(argv[i]) == "-h" ? "--help" : argv[i];
    if (word.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + word + "'");
    const std::string name = word.substr(2);
    const Flag* flag = nullptr;
    for (const Flag& f : flags)
      if (f.name == name) flag = &f;
    if (!flag) throw UsageError("unknown flag --" + name);
    if (values_.count(name)) throw UsageError("--" + name + " given twice");
    if (!flag->takes_value) {
      values_[name] = "";
      continue;
    }
    if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
    values_[name] = argv[++i];
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::int64_t Args::get_int(const std::string& name, std::int64_t fallback, std::int64_t lo,
                           std::int64_t hi) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool starts_as_a_number = !text.empty() && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
  if (!starts_as_a_number || *end != '\0' || errno == ERANGE || v < lo || v > hi)
    throw UsageError("--" + name + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], given '" + text + "'");
  return v;
}

std::vector<std::string> Args::get_list(const std::string& name, const std::string& fallback) const {
  const std::string text = get(name, fallback);
  std::vector<std::string> items;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    // "1,,2", "1,2," and "" would otherwise lose an item silently.
    if (item.empty())
      throw UsageError("--" + name + ": expected a comma-separated list without empty items, given '" + text + "'");
    items.push_back(item);
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

std::vector<std::int64_t> Args::get_int_list(const std::string& name, const std::string& fallback, std::int64_t lo,
                                             std::int64_t hi) const {
  std::vector<std::int64_t> values;
  for (const std::string& item : get_list(name, fallback)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || v < lo || v > hi || !(item[0] == '-' || (item[0] >= '0' && item[0] <= '9')))
      throw UsageError("--" + name + ": expected integers in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], given '" + item + "' in '" + get(name, fallback) + "'");
    values.push_back(v);
  }
  return values;
}

std::string usage_of(const std::string& command, const std::vector<Flag>& flags) {
  std::string s = "usage: moekit " + command + " [flags]\n";
  for (const Flag& f : flags) {
    std::string left = "  --" + f.name + (f.takes_value ? " V" : "");
    left.resize(std::max<std::size_t>(left.size() + 1, 26), ' ');
    s += left + f.help + "\n";
  }
  return s;
}

}  // namespace moekit::cli
