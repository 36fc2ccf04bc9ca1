// The JSON parser (src/io/json.h) on arbitrary text. A document it accepts must survive a
// round trip: written back (json_quote for strings, %.17g for numbers) and parsed again, it
// is the same value. Only moekit::Error may come out.
#include <cmath>
#include <cstdio>
#include <string>

#include "fuzz_util.h"
#include "io/json.h"
#include "moekit/error.h"

namespace {

using moekit::io::JsonValue;

std::string write(const JsonValue& v) {
  switch (v.kind()) {
    case JsonValue::Kind::null: return "null";
    case JsonValue::Kind::boolean: return v.as_bool("v") ? "true" : "false";
    case JsonValue::Kind::number: {
      char buffer[40];
      std::snprintf(buffer, sizeof buffer, "%.17g", v.as_number("v"));
      return buffer;
    }
    case JsonValue::Kind::string: return moekit::io::json_quote(v.as_string("v"));
    case JsonValue::Kind::array: {
      std::string s = "[";
      for (const JsonValue& item : v.as_array("v")) s += (s.size() > 1 ? "," : "") + write(item);
      return s + "]";
    }
    case JsonValue::Kind::object: {
      std::string s = "{";
      for (const auto& [key, item] : v.as_object("v"))
        s += (s.size() > 1 ? "," : "") + moekit::io::json_quote(key) + ":" + write(item);
      return s + "}";
    }
  }
  return "";
}

bool same(const JsonValue& a, const JsonValue& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case JsonValue::Kind::null: return true;
    case JsonValue::Kind::boolean: return a.as_bool("a") == b.as_bool("b");
    case JsonValue::Kind::number: return a.as_number("a") == b.as_number("b");
    case JsonValue::Kind::string: return a.as_string("a") == b.as_string("b");
    case JsonValue::Kind::array: {
      const auto &x = a.as_array("a"), &y = b.as_array("b");
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!same(x[i], y[i])) return false;
      return true;
    }
    case JsonValue::Kind::object: {
      const auto &x = a.as_object("a"), &y = b.as_object("b");
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (x[i].first != y[i].first || !same(x[i].second, y[i].second)) return false;
      return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  JsonValue first;
  try {
    first = moekit::io::parse_json(text, "fuzz");
  } catch (const moekit::Error&) {
    return 0;
  }
  // Accepted: the integer accessor must answer (value or Error) for any number.
  if (first.is_number()) {
    try {
      (void)first.as_int("n", INT64_MIN, INT64_MAX);
    } catch (const moekit::Error&) {
    }
  }
  const std::string again = write(first);
  JsonValue second;
  try {
    second = moekit::io::parse_json(again, "round trip");
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "round trip refused: %s\n%s\n", e.what(), again.c_str());
    __builtin_trap();
  }
  if (!same(first, second)) {
    std::fprintf(stderr, "round trip changed the value:\n%s\n", again.c_str());
    __builtin_trap();
  }
  return 0;
}
