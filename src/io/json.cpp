#include "io/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>

#include "moekit/error.h"

namespace moekit::io {

std::string_view JsonValue::kind_name(Kind kind) {
  switch (kind) {
    case Kind::null: return "null";
    case Kind::boolean: return "boolean";
    case Kind::number: return "number";
    case Kind::string: return "string";
    case Kind::array: return "array";
    case Kind::object: return "object";
  }
  return "?";
}

namespace {

[[noreturn]] void kind_error(std::string_view what, std::string_view expected, JsonValue::Kind given) {
  throw Error(std::string(what) + ": expected " + std::string(expected) + ", given " +
              std::string(JsonValue::kind_name(given)));
}

}  // namespace

bool JsonValue::as_bool(std::string_view what) const {
  if (kind_ != Kind::boolean) kind_error(what, "a boolean", kind_);
  return bool_;
}

double JsonValue::as_number(std::string_view what) const {
  if (kind_ != Kind::number) kind_error(what, "a number", kind_);
  return number_;
}

std::int64_t JsonValue::as_int(std::string_view what, std::int64_t lo, std::int64_t hi) const {
  if (kind_ != Kind::number) kind_error(what, "an integer", kind_);
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (exact_integer_) {
    require(integer_ >= lo && integer_ <= hi,
            std::string(what) + ": expected " + range + ", given " + std::to_string(integer_));
    return integer_;
  }
  // Doubles are exact integers only up to 2^53; beyond that the written digits are lost.
  char given[32];
  std::snprintf(given, sizeof given, "%.17g", number_);
  const bool integral = std::isfinite(number_) && std::trunc(number_) == number_ &&
                        std::fabs(number_) <= 9007199254740992.0;
  require(integral, std::string(what) + ": expected " + range + ", given " + given);
  const auto value = static_cast<std::int64_t>(number_);
  require(value >= lo && value <= hi, std::string(what) + ": expected " + range + ", given " + given);
  return value;
}

const std::string& JsonValue::as_string(std::string_view what) const {
  if (kind_ != Kind::string) kind_error(what, "a string", kind_);
  return string_;
}

const std::vector<JsonValue>& JsonValue::as_array(std::string_view what) const {
  if (kind_ != Kind::array) kind_error(what, "an array", kind_);
  return array_;
}

const std::vector<JsonValue::Member>& JsonValue::as_object(std::string_view what) const {
  if (kind_ != Kind::object) kind_error(what, "an object", kind_);
  return object_;
}

const JsonValue* JsonValue::get(std::string_view key) const {
  if (kind_ != Kind::object) return nullptr;
  for (const auto& [name, value] : object_)
    if (name == key) return &value;
  return nullptr;
}

// Recursive descent over a string_view; `pos_` is the byte offset reported in errors.
class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  JsonValue parse_document() {
    skip_whitespace();
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (pos_ != text_.size()) fail("unexpected trailing characters after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(source_ + ": invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c, const char* context) {
    if (at_end()) fail(std::string("unexpected end of input, expected '") + c + "' " + context);
    if (peek() != c) fail(std::string("expected '") + c + "' " + context + ", found " + describe());
    ++pos_;
  }

  std::string describe() const {
    if (at_end()) return "end of input";
    const auto c = static_cast<unsigned char>(peek());
    if (c >= 0x20 && c < 0x7f) return std::string("'") + char(c) + "'";
    char buffer[16];
    std::snprintf(buffer, sizeof buffer, "byte 0x%02x", c);
    return buffer;
  }

  JsonValue parse_value(int depth) {
    if (at_end()) fail("unexpected end of input, expected a value");
    switch (peek()) {
      case '{': return parse_object(depth + 1);
      case '[': return parse_array(depth + 1);
      case '"': {
        JsonValue v;
        v.kind_ = JsonValue::Kind::string;
        v.string_ = parse_string();
        return v;
      }
      case 't': return parse_literal("true", JsonValue::Kind::boolean, true);
      case 'f': return parse_literal("false", JsonValue::Kind::boolean, false);
      case 'n': return parse_literal("null", JsonValue::Kind::null, false);
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail("expected a value, found " + describe());
    }
  }

  JsonValue parse_literal(std::string_view word, JsonValue::Kind kind, bool value) {
    if (text_.substr(pos_, word.size()) != word) fail("invalid literal, expected '" + std::string(word) + "'");
    pos_ += word.size();
    JsonValue v;
    v.kind_ = kind;
    v.bool_ = value;
    return v;
  }

  void check_depth(int depth) const {
    if (depth > kJsonMaxDepth)
      fail("nesting deeper than " + std::to_string(kJsonMaxDepth) + " levels");
  }

  JsonValue parse_object(int depth) {
    check_depth(depth);
    JsonValue v;
    v.kind_ = JsonValue::Kind::object;
    ++pos_;  // '{'
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return v;
    }
    std::vector<std::size_t> key_positions;  // byte offset of each key, for duplicate errors
    for (;;) {
      skip_whitespace();
      if (at_end() || peek() != '"') fail("expected a string key in object, found " + describe());
      key_positions.push_back(pos_);
      std::string key = parse_string();
      skip_whitespace();
      expect(':', "after object key");
      skip_whitespace();
      JsonValue member = parse_value(depth);
      v.object_.emplace_back(std::move(key), std::move(member));
      skip_whitespace();
      if (at_end()) fail("unexpected end of input inside an object");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "to close the object");
      reject_duplicate_keys(v, key_positions);
      return v;
    }
  }

  // One sort per object keeps headers with many thousand tensors linear-logarithmic.
  void reject_duplicate_keys(const JsonValue& object, const std::vector<std::size_t>& key_positions) {
    std::vector<std::size_t> order(object.object_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto key = [&](std::size_t i) -> const std::string& { return object.object_[i].first; };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (key(order[i]) == key(order[i - 1])) {
        pos_ = key_positions[order[i]];
        fail("duplicate key '" + key(order[i]) + "'");
      }
    }
  }

  JsonValue parse_array(int depth) {
    check_depth(depth);
    JsonValue v;
    v.kind_ = JsonValue::Kind::array;
    ++pos_;  // '['
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_whitespace();
      v.array_.push_back(parse_value(depth));
      skip_whitespace();
      if (at_end()) fail("unexpected end of input inside an array");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']', "to close the array");
      return v;
    }
  }

  unsigned parse_hex4() {
    if (text_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') code |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') code |= unsigned(c - 'A' + 10);
      else {
        --pos_;
        fail("invalid hex digit in \\u escape");
      }
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }

  // A \uXXXX escape (pos_ just after the 'u'), joining a surrogate pair into one code point.
  unsigned parse_unicode_escape() {
    const std::size_t start = pos_ - 2;
    unsigned cp = parse_hex4();
    if (cp >= 0xdc00 && cp <= 0xdfff) {
      pos_ = start;
      fail("unpaired low surrogate in \\u escape");
    }
    if (cp >= 0xd800 && cp <= 0xdbff) {
      if (text_.substr(pos_, 2) != "\\u") {
        pos_ = start;
        fail("high surrogate not followed by a \\u low surrogate");
      }
      pos_ += 2;
      const unsigned low = parse_hex4();
      if (low < 0xdc00 || low > 0xdfff) {
        pos_ = start;
        fail("high surrogate not followed by a low surrogate");
      }
      cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
    }
    return cp;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape in string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, parse_unicode_escape()); break;
        default:
          --pos_;
          fail("invalid escape '\\" + std::string(1, e) + "' in string");
      }
    }
  }

  // Grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  JsonValue parse_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t from = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - from;
    };
    if (peek() == '-') ++pos_;
    if (at_end()) fail("truncated number");
    if (peek() == '0') {
      ++pos_;
      if (!at_end() && peek() >= '0' && peek() <= '9') fail("leading zeros are not allowed in numbers");
    } else if (digits() == 0) {
      fail("expected a digit in number");
    }
    bool integral = true;
    if (!at_end() && peek() == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("expected a digit after the decimal point");
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      integral = false;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (digits() == 0) fail("expected a digit in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    JsonValue v;
    v.kind_ = JsonValue::Kind::number;
    const auto [end, ec] = std::from_chars(first, last, v.number_);
    if (ec != std::errc() || end != last || !std::isfinite(v.number_)) {
      pos_ = start;
      fail("number out of range");
    }
    if (integral) {
      const auto [iend, iec] = std::from_chars(first, last, v.integer_);
      v.exact_integer_ = iec == std::errc() && iend == last;
    }
    return v;
  }

  std::string_view text_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

JsonValue parse_json(std::string_view text, const std::string& source) {
  return JsonParser(text, source).parse_document();
}

JsonValue read_json_file(const std::string& path, std::size_t max_bytes) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  require(file != nullptr, path + ": cannot open the JSON file");
  std::string text;
  char buffer[1 << 16];
  std::size_t got;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    text.append(buffer, got);
    require(text.size() <= max_bytes,
            path + ": JSON file larger than " + std::to_string(max_bytes) + " bytes");
  }
  require(!std::ferror(file.get()), path + ": read error");
  return parse_json(text, path);
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (u < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", u);
      out += buffer;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace moekit::io
