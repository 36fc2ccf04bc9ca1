#include "io/json.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "moekit/error.h"

namespace moekit::io {
namespace {

JsonValue parse(std::string_view text) { return parse_json(text, "test.json"); }

TEST(IoJson, ParsesEveryKind) {
  const JsonValue v = parse(R"( {"a": [1, -2.5e2, 0, true, false, null], "s": "x\"\\\/\b\f\n\r\t", "o": {}} )");
  ASSERT_TRUE(v.is_object());
  const auto& a = v.get("a")->as_array("a");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0].as_int("a0", 0, 10), 1);
  EXPECT_TRUE(a[0].is_integer());
  EXPECT_EQ(a[1].as_number("a1"), -250.0);
  EXPECT_FALSE(a[1].is_integer());
  EXPECT_EQ(a[2].as_int("a2", 0, 0), 0);
  EXPECT_TRUE(a[3].as_bool("a3"));
  EXPECT_FALSE(a[4].as_bool("a4"));
  EXPECT_TRUE(a[5].is_null());
  EXPECT_EQ(v.get("s")->as_string("s"), "x\"\\/\b\f\n\r\t");
  EXPECT_TRUE(v.get("o")->as_object("o").empty());
  EXPECT_EQ(v.get("missing"), nullptr);
  EXPECT_EQ(a[0].get("x"), nullptr);  // not an object
}

TEST(IoJson, UnicodeEscapesBecomeUtf8) {
  EXPECT_EQ(parse(R"("\u0041\u00e9\u20ac\ud83d\ude00")").as_string("s"), "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(parse(R"("\u0000")").as_string("s"), std::string(1, '\0'));
}

TEST(IoJson, IntegersAreExactAndRangeChecked) {
  EXPECT_EQ(parse("9223372036854775807").as_int("n", 0, std::numeric_limits<std::int64_t>::max()),
            std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(parse("4.0").as_int("n", 0, 10), 4);  // integral doubles are accepted
  EXPECT_THROW(parse("4.5").as_int("n", 0, 10), Error);
  EXPECT_THROW(parse("11").as_int("n", 0, 10), Error);
  EXPECT_THROW(parse("-1").as_int("n", 0, 10), Error);
  EXPECT_THROW(parse("1e300").as_int("n", 0, 10), Error);
  EXPECT_THROW(parse("99999999999999999999").as_int("n", 0, std::numeric_limits<std::int64_t>::max()), Error);
  EXPECT_THROW(parse("\"3\"").as_int("n", 0, 10), Error);
  try {
    parse("true").as_string("config.json: model_type");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "config.json: model_type: expected a string, given boolean");
  }
}

struct BadCase {
  const char* name;
  std::string text;
  const char* message;  // a substring of the error
  std::size_t offset;   // the byte offset the error reports
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class IoJsonRejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(IoJsonRejects, WithOffset) {
  const BadCase& c = GetParam();
  try {
    parse(c.text);
    FAIL() << "accepted: " << c.text;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test.json: invalid JSON at byte " + std::to_string(c.offset) + ":"), std::string::npos)
        << what;
    EXPECT_NE(what.find(c.message), std::string::npos) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    , IoJsonRejects,
    ::testing::Values(BadCase{"Empty", "", "unexpected end", 0}, BadCase{"Spaces", "   ", "unexpected end", 3},
                      BadCase{"Trailing", "{} x", "trailing", 3}, BadCase{"TwoValues", "1 2", "trailing", 2},
                      BadCase{"UnclosedObject", "{\"a\":1", "inside an object", 6},
                      BadCase{"UnclosedArray", "[1,2", "inside an array", 4},
                      BadCase{"TrailingComma", "[1,]", "expected a value", 3},
                      BadCase{"ObjectTrailingComma", "{\"a\":1,}", "string key", 7},
                      BadCase{"MissingColon", "{\"a\" 1}", "expected ':'", 5},
                      BadCase{"BareKey", "{a:1}", "string key", 1},
                      BadCase{"DuplicateKey", "{\"a\":1,\"b\":2,\"a\":3}", "duplicate key 'a'", 13},
                      BadCase{"UnterminatedString", "\"abc", "unterminated string", 4},
                      BadCase{"ControlInString", "\"a\nb\"", "control character", 2},
                      BadCase{"BadEscape", "\"\\x\"", "invalid escape", 2},
                      BadCase{"BadHexDigit", "\"\\u12x4\"", "invalid hex", 5},
                      BadCase{"TruncatedUnicode", "\"\\u12", "truncated", 3},
                      BadCase{"LoneLowSurrogate", "\"\\udc00\"", "unpaired low surrogate", 1},
                      BadCase{"LoneHighSurrogate", "\"\\ud800x\"", "high surrogate", 1},
                      BadCase{"HighThenNonLow", "\"\\ud800\\u0041\"", "high surrogate", 1},
                      BadCase{"LeadingZero", "012", "leading zeros", 1}, BadCase{"Plus", "+1", "expected a value", 0},
                      BadCase{"BareMinus", "-", "truncated number", 1}, BadCase{"Dot", "1.", "decimal point", 2},
                      BadCase{"Exponent", "1e", "exponent", 2}, BadCase{"Huge", "1e999", "out of range", 0},
                      BadCase{"NaN", "NaN", "expected a value", 0}, BadCase{"BadLiteral", "tru", "invalid literal", 0},
                      BadCase{"Nul", std::string("{\0}", 3), "string key", 1},
                      BadCase{"TooDeep", std::string(65, '[') + std::string(65, ']'), "nesting deeper", 64}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(IoJson, DepthLimitAllowsItsOwnDepth) {
  EXPECT_NO_THROW(parse(std::string(kJsonMaxDepth, '[') + std::string(kJsonMaxDepth, ']')));
  // Deep nesting far past the limit fails early, without exhausting the stack.
  EXPECT_THROW(parse(std::string(1000000, '[')), Error);
}

TEST(IoJson, QuoteRoundTrips) {
  const std::string text = std::string("a\"b\\c\n\t\x01 z", 11);
  EXPECT_EQ(parse(json_quote(text)).as_string("s"), text);
}

}  // namespace
}  // namespace moekit::io
