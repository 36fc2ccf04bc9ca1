// Malformed safetensors files: each must fail with moekit::Error, never crash or hang.
// Run under ASan+UBSan (MOEKIT_SANITIZE=ON) to catch out-of-bounds reads too.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "io/safetensors.h"
#include "moekit/error.h"
#include "temp_dir.h"

namespace moekit::io {
namespace {

using test::TempDir;

std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// A file with the given header text and `data_size` bytes of data.
std::string make_file(const std::string& header, std::size_t data_size) {
  std::string data(data_size, '\0');
  for (std::size_t i = 0; i < data_size; ++i) data[i] = char(i * 7 + 1);
  return le64(header.size()) + header + data;
}

// The valid file every mutation starts from: three tensors, metadata, 8-aligned header.
const std::string kValidHeader =
    R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"c":{"dtype":"U8","shape":[5],"data_offsets":[32,37]}})";
constexpr std::size_t kValidData = 37;

enum class Outcome { ok, error };

// Opens the bytes as a file and reads every tensor. Any exception other than Error fails.
Outcome open_and_read(const TempDir& dir, const std::string& bytes, std::string* message = nullptr) {
  const std::string path = dir.file("m.safetensors");
  test::write_bytes(path, bytes);
  try {
    SafetensorsReader reader(path);
    for (const auto& name : reader.names()) {
      if (reader.info(name).shape.size() <= std::size_t(kMaxRank)) reader.read(name);
    }
    return Outcome::ok;
  } catch (const Error& e) {
    if (message) *message = e.what();
    return Outcome::error;
  }
}

TEST(IoSafetensorsMalformed, TheBaseFileIsValid) {
  TempDir dir;
  const std::string file = make_file(kValidHeader, kValidData);
  ASSERT_EQ(open_and_read(dir, file), Outcome::ok);
  SafetensorsReader reader(dir.file("m.safetensors"));
  EXPECT_EQ(reader.names().size(), 3u);
  EXPECT_EQ(reader.metadata().at("k"), "v");
}

TEST(IoSafetensorsMalformed, EveryTruncationFails) {
  TempDir dir;
  const std::string file = make_file(kValidHeader, kValidData);
  for (std::size_t length = 0; length < file.size(); ++length) {
    std::string message;
    EXPECT_EQ(open_and_read(dir, file.substr(0, length), &message), Outcome::error) << "length " << length;
    EXPECT_NE(message.find("m.safetensors"), std::string::npos) << message;
  }
}

TEST(IoSafetensorsMalformed, CorruptHeaderLengthFails) {
  TempDir dir;
  const std::string file = make_file(kValidHeader, kValidData);
  const std::uint64_t n = kValidHeader.size();
  const std::string body = file.substr(8);
  for (const std::uint64_t bad : {std::uint64_t(0), std::uint64_t(1), n - 1, n + 1, std::uint64_t(file.size()),
                                  kMaxSafetensorsHeader + 1, std::uint64_t(1) << 40, std::uint64_t(1) << 63,
                                  ~std::uint64_t(0)}) {
    EXPECT_EQ(open_and_read(dir, le64(bad) + body), Outcome::error) << "header length " << bad;
  }
}

TEST(IoSafetensorsMalformed, HeaderByteFlipsNeverCrash) {
  TempDir dir;
  const std::string file = make_file(kValidHeader, kValidData);
  int errors = 0;
  for (std::size_t pos = 0; pos < 8 + kValidHeader.size(); ++pos) {
    for (const char replacement : {'\0', '"', '{', '}', '[', ']', ',', ':', '9', '-', '\\', char(0xff)}) {
      if (file[pos] == replacement) continue;
      std::string mutated = file;
      mutated[pos] = replacement;
      errors += open_and_read(dir, mutated) == Outcome::error;
    }
  }
  EXPECT_GT(errors, 0);
}

struct HeaderCase {
  const char* name;
  std::string header;
  std::size_t data_size;
  const char* message;  // a substring of the error
};

void PrintTo(const HeaderCase& c, std::ostream* os) { *os << c.name; }

std::string one(const std::string& entry) { return R"({"t":)" + entry + "}"; }

class IoSafetensorsBadHeader : public ::testing::TestWithParam<HeaderCase> {};

TEST_P(IoSafetensorsBadHeader, FailsWithMessage) {
  const HeaderCase& c = GetParam();
  TempDir dir;
  std::string message;
  ASSERT_EQ(open_and_read(dir, make_file(c.header, c.data_size), &message), Outcome::error) << c.header;
  EXPECT_NE(message.find(c.message), std::string::npos) << message;
  EXPECT_NE(message.find("m.safetensors"), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(
    , IoSafetensorsBadHeader,
    ::testing::Values(
        HeaderCase{"NotJson", "hello", 0, "invalid JSON"}, HeaderCase{"Empty", "", 0, "invalid JSON"},
        HeaderCase{"ArrayRoot", "[]", 0, "expected an object"},
        HeaderCase{"StringRoot", "\"x\"", 0, "expected an object"},
        HeaderCase{"TrailingGarbage", "{}}", 0, "trailing"},
        HeaderCase{"NulPadding", std::string("{}\0\0", 4), 0, "trailing"},
        HeaderCase{"EntryNotObject", one("3"), 0, "tensor 't': expected an object"},
        HeaderCase{"MissingDtype", one(R"({"shape":[1],"data_offsets":[0,4]})"), 4, "missing \"dtype\""},
        HeaderCase{"DtypeNumber", one(R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4, "dtype: expected a string"},
        HeaderCase{"UnknownDtype", one(R"({"dtype":"F33","shape":[1],"data_offsets":[0,4]})"), 4, "unknown dtype 'F33'"},
        HeaderCase{"MissingShape", one(R"({"dtype":"F32","data_offsets":[0,4]})"), 4, "missing \"shape\""},
        HeaderCase{"ShapeNotArray", one(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})"), 4, "shape: expected an array"},
        HeaderCase{"NegativeDim", one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), 4, "shape[0]"},
        HeaderCase{"FractionalDim", one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), 4, "shape[0]"},
        HeaderCase{"StringDim", one(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})"), 4, "shape[0]"},
        HeaderCase{"HugeDim", one(R"({"dtype":"F32","shape":[1e30],"data_offsets":[0,4]})"), 4, "shape[0]"},
        HeaderCase{"ShapeOverflow",
                   one(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]})"), 4,
                   "has more elements than int64 holds"},
        HeaderCase{"BytesOverflow", one(R"({"dtype":"I64","shape":[2305843009213693952],"data_offsets":[0,4]})"),
                   4, "[2305843009213693952] I64: size 2305843009213693952 x 8 overflows int64"},
        HeaderCase{"RankTooLarge",
                   one(R"({"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]})"), 1,
                   "dimensions"},
        HeaderCase{"MissingOffsets", one(R"({"dtype":"F32","shape":[1]})"), 4, "missing \"data_offsets\""},
        HeaderCase{"OneOffset", one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), 4, "expected [begin, end]"},
        HeaderCase{"ThreeOffsets", one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})"), 8,
                   "expected [begin, end]"},
        HeaderCase{"NegativeOffset", one(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), 4,
                   "data_offsets[0]"},
        HeaderCase{"EndBeforeBegin", one(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})"), 8, "end before begin"},
        HeaderCase{"PastData", one(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), 6, "past the data section"},
        HeaderCase{"SizeMismatch", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"), 8, "needs 8"},
        HeaderCase{"Overlap",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   8, "overlap"},
        HeaderCase{"OverlapWithUnsupported",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                   8, "overlap"},
        HeaderCase{"DuplicateName",
                   R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                   2, "duplicate key 'a'"},
        HeaderCase{"MetadataNotObject", R"({"__metadata__":[]})", 0, "__metadata__: expected an object"},
        HeaderCase{"MetadataValueNumber", R"({"__metadata__":{"k":1}})", 0, "__metadata__ 'k': expected a string"},
        HeaderCase{"DeepNesting", "{\"__metadata__\":" + std::string(200, '[') + std::string(200, ']') + "}", 0,
                   "nesting deeper"}),
    [](const auto& info) { return std::string(info.param.name); });

// Random mutations of the valid file: byte sets, inserts, deletes, truncations, with and
// without a matching header length, so some mutants get past the length check into the JSON.
TEST(IoSafetensorsMalformed, RandomMutationsNeverCrash) {
  TempDir dir;
  const std::string file = make_file(kValidHeader, kValidData);
  std::mt19937_64 rng(20260401);
  int errors = 0, accepted = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string header = kValidHeader;
    const int mutations = 1 + int(rng() % 4);
    for (int m = 0; m < mutations && !header.empty(); ++m) {
      const std::size_t pos = rng() % header.size();
      switch (rng() % 4) {
        case 0: header[pos] = char(rng()); break;
        case 1: header.insert(header.begin() + std::ptrdiff_t(pos), char(rng())); break;
        case 2: header.erase(pos, 1); break;
        case 3: header[pos] = "0123456789{}[],:\"-.eE"[rng() % 21]; break;
      }
    }
    const bool fix_length = rng() % 4 != 0;
    std::string mutated = fix_length ? make_file(header, kValidData) : le64(kValidHeader.size()) + header +
                                                                           file.substr(8 + kValidHeader.size());
    if (rng() % 8 == 0) mutated.resize(rng() % (mutated.size() + 1));
    if (open_and_read(dir, mutated) == Outcome::error) ++errors;
    else ++accepted;
  }
  EXPECT_GT(errors, 2000);
  // Mutations of names or padding-neutral bytes keep the file valid now and then.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace moekit::io
