// A small JSON reader for the files moekit reads: safetensors headers, config.json,
// model.safetensors.index.json. Defensive by design: a depth limit, strict grammar,
// duplicate keys rejected, and every error names the source and the byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moekit::io {

class JsonValue {
 public:
  enum class Kind : std::uint8_t { null, boolean, number, string, array, object };
  using Member = std::pair<std::string, JsonValue>;

  JsonValue() = default;

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  // True for a number written without fraction or exponent that fits in int64.
  bool is_integer() const { return kind_ == Kind::number && exact_integer_; }

  // Typed accessors. `what` names the value in the error thrown on a kind mismatch,
  // e.g. "config.json: hidden_size".
  bool as_bool(std::string_view what) const;
  double as_number(std::string_view what) const;
  // An integer in [lo, hi]; integral doubles such as 4.0 are accepted too.
  std::int64_t as_int(std::string_view what, std::int64_t lo, std::int64_t hi) const;
  const std::string& as_string(std::string_view what) const;
  const std::vector<JsonValue>& as_array(std::string_view what) const;
  // Members in file order; keys are unique.
  const std::vector<Member>& as_object(std::string_view what) const;

  // The member named key, or nullptr when absent or when this is not an object.
  const JsonValue* get(std::string_view key) const;

  // "number", "string", ... for error messages.
  static std::string_view kind_name(Kind kind);

 private:
  friend class JsonParser;
  Kind kind_ = Kind::null;
  bool bool_ = false;
  bool exact_integer_ = false;
  double number_ = 0.0;
  std::int64_t integer_ = 0;
  std::string string_;
  std::vector<JsonValue> array_;
  std::vector<Member> object_;
};

inline constexpr int kJsonMaxDepth = 64;

// Parses one JSON document (surrounding whitespace allowed). `source` names the text in
// errors ("model.safetensors: header"). Throws moekit::Error with the byte offset.
JsonValue parse_json(std::string_view text, const std::string& source);

// Reads and parses a JSON file of at most max_bytes. Throws moekit::Error naming the path.
JsonValue read_json_file(const std::string& path, std::size_t max_bytes = 64u << 20);

// `text` as a JSON string literal, quotes included (for writers).
std::string json_quote(std::string_view text);

}  // namespace moekit::io
