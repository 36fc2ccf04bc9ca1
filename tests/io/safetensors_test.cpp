#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "moekit/error.h"
#include "temp_dir.h"
#include "test_util.h"

namespace moekit::io {
namespace {

using test::TempDir;

Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937_64& rng) {
  Tensor t(dtype, std::move(shape));
  auto* bytes = t.ptr<unsigned char>();
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.view().data, b.view().data, a.nbytes()) == 0;
}

struct DTypeCase {
  DType dtype;
  const char* spelling;
};
void PrintTo(const DTypeCase& c, std::ostream* os) { *os << c.spelling; }

class IoSafetensorsRoundTrip : public ::testing::TestWithParam<DTypeCase> {};

TEST_P(IoSafetensorsRoundTrip, EveryShapeKeepsBytes) {
  const DTypeCase c = GetParam();
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::vector<std::vector<std::int64_t>> shapes{{}, {0}, {1}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 4, 5}};
  std::vector<Tensor> tensors;
  std::vector<NamedTensor> named;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    tensors.push_back(random_tensor(c.dtype, shapes[i], rng));
  }
  for (std::size_t i = 0; i < shapes.size(); ++i) named.push_back({"t" + std::to_string(i), tensors[i].view()});
  const std::string path = dir.file("round_trip.safetensors");
  write_safetensors(path, named, {{"kind", "test"}, {"quote\"d", "line\nbreak"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata().at("kind"), "test");
  EXPECT_EQ(reader.metadata().at("quote\"d"), "line\nbreak");
  ASSERT_EQ(reader.names().size(), shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "t" + std::to_string(i);
    ASSERT_TRUE(reader.contains(name));
    EXPECT_EQ(reader.info(name).dtype, c.dtype);
    EXPECT_EQ(reader.info(name).shape, shapes[i]);
    const Tensor back = reader.read(name);
    EXPECT_EQ(back.shape(), shapes[i]);
    EXPECT_TRUE(same_bytes(back, tensors[i])) << name;
  }
  // The dtype is spelled as the format says, and the data section starts 8-byte aligned.
  const std::string bytes = test::read_bytes(path);
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_NE(bytes.find(std::string("\"") + c.spelling + "\""), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(, IoSafetensorsRoundTrip,
                         ::testing::Values(DTypeCase{DType::f32, "F32"}, DTypeCase{DType::bf16, "BF16"},
                                           DTypeCase{DType::f16, "F16"}, DTypeCase{DType::fp8_e4m3, "F8_E4M3"},
                                           DTypeCase{DType::i32, "I32"}, DTypeCase{DType::i64, "I64"},
                                           DTypeCase{DType::u8, "U8"}),
                         [](const auto& info) { return std::string(info.param.spelling); });

TEST(IoSafetensors, NamesAreSortedAndReadIntoChecksSize) {
  std::mt19937_64 rng(1);
  TempDir dir;
  const Tensor b = random_tensor(DType::f32, {4}, rng);
  const Tensor a = random_tensor(DType::u8, {3}, rng);
  const std::string path = dir.file("x.safetensors");
  write_safetensors(path, {{"b", b.view()}, {"a", a.view()}}, {});
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(reader.metadata().empty());
  float out[4];
  reader.read_into("b", out, sizeof out);
  EXPECT_EQ(std::memcmp(out, b.view().data, sizeof out), 0);
  EXPECT_THROW(reader.read_into("b", out, 8), Error);
  try {
    reader.info("missing");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(reader.contains("missing"));
}

TEST(IoSafetensors, MovedReaderStillReads) {
  std::mt19937_64 rng(2);
  TempDir dir;
  const Tensor t = random_tensor(DType::i32, {5}, rng);
  write_safetensors(dir.file("m.safetensors"), {{"t", t.view()}}, {});
  SafetensorsReader first(dir.file("m.safetensors"));
  SafetensorsReader second(std::move(first));
  EXPECT_TRUE(same_bytes(second.read("t"), t));
}

TEST(IoSafetensors, WriterRejectsBadInputAndLeavesNothing) {
  TempDir dir;
  Tensor t(DType::f32, {4, 4});
  TensorView strided = t.view();
  std::swap(strided.strides[0], strided.strides[1]);  // a transposed view
  const std::string path = dir.file("bad.safetensors");
  EXPECT_THROW(write_safetensors(path, {{"t", strided}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"t", t.view()}, {"t", t.view()}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"", t.view()}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t.view()}}, {}), Error);
  EXPECT_THROW(write_safetensors(path, {{"absent", TensorView{}}}, {}), Error);
  TensorView on_gpu = t.view();
  on_gpu.device = Device::cuda;
  EXPECT_THROW(write_safetensors(path, {{"t", on_gpu}}, {}), Error);
  EXPECT_THROW(write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"t", t.view()}}, {}), Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(IoSafetensors, UnsupportedDtypeIsListedButNotRead) {
  TempDir dir;
  const std::string header = R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                             R"("u":{"dtype":"U8","shape":[2],"data_offsets":[16,18]}})";
  std::string bytes(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header + std::string(18, '\x01');
  test::write_bytes(dir.file("f64.safetensors"), bytes);
  SafetensorsReader reader(dir.file("f64.safetensors"));
  EXPECT_EQ(reader.names(), std::vector<std::string>{"u"});
  try {
    reader.read("d");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F64"), std::string::npos) << e.what();
  }
}

TEST(IoSafetensors, GoldenFp8FileReads) {
  SafetensorsReader reader(test::data_path("golden/fp8_e4m3fn.safetensors"));
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"decode_codes", "decode_values", "encode_in", "encode_out"}));
  EXPECT_EQ(reader.info("decode_codes").dtype, DType::u8);
  EXPECT_EQ(reader.info("decode_codes").shape, std::vector<std::int64_t>{256});
  EXPECT_EQ(reader.info("decode_values").dtype, DType::f32);
  EXPECT_EQ(reader.info("decode_values").shape, std::vector<std::int64_t>{256});
  const auto n = reader.info("encode_in").shape;
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(reader.info("encode_in").dtype, DType::f32);
  EXPECT_EQ(reader.info("encode_out").dtype, DType::u8);
  EXPECT_EQ(reader.info("encode_out").shape, n);
  EXPECT_FALSE(reader.metadata().at("about").empty());
  // Spot-check the content: code i decodes to the e4m3fn value of i.
  const Tensor codes = reader.read("decode_codes");
  const Tensor values = reader.read("decode_values");
  for (int i = 0; i < 256; ++i) EXPECT_EQ(codes.ptr<std::uint8_t>()[i], i);
  EXPECT_EQ(values.ptr<float>()[0x38], 1.0f);   // exponent 7 = bias, mantissa 0
  EXPECT_EQ(values.ptr<float>()[0x7e], 448.0f);  // the largest finite value
  EXPECT_TRUE(std::isnan(values.ptr<float>()[0x7f]));
  EXPECT_EQ(values.ptr<float>()[0xb8], -1.0f);
}

}  // namespace
}  // namespace moekit::io
