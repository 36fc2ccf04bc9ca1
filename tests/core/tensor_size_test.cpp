// The checked size arithmetic of include/moekit/tensor.h (issue #19): a size that does not fit
// is an Error naming what was being sized, never a wrapped allocation.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "moekit/tensor.h"

#if defined(__SANITIZE_ADDRESS__)
// ASan aborts on an allocation larger than it supports unless told to fail it like malloc does;
// then operator new throws std::bad_alloc, as in a plain build.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace moekit {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

struct SizeCase {
  const char* name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::int64_t numel;  // -1: the element count overflows
  std::int64_t bytes;  // -1: the byte size overflows
};

class CoreTensorSize : public ::testing::TestWithParam<SizeCase> {};

TEST_P(CoreTensorSize, NumelAndBytesAreExactOrAnError) {
  const SizeCase& c = GetParam();
  if (c.numel >= 0) {
    EXPECT_EQ(checked_numel(c.shape, "t"), c.numel);
  } else {
    EXPECT_THROW(checked_numel(c.shape, "t"), Error);
  }
  if (c.bytes >= 0) {
    EXPECT_EQ(checked_nbytes(c.dtype, c.shape, "t"), std::size_t(c.bytes));
    return;
  }
  try {
    checked_nbytes(c.dtype, c.shape, "w13 of expert 7");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w13 of expert 7"), std::string::npos) << e.what();
  }
  // An owning tensor of that shape is refused before anything is allocated.
  EXPECT_THROW(Tensor(c.dtype, c.shape), Error);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CoreTensorSize,
    ::testing::Values(SizeCase{"scalar", DType::f32, {}, 1, 4}, SizeCase{"empty_dim", DType::f32, {0, kMax, kMax}, 0, 0},
                      SizeCase{"small", DType::bf16, {3, 5}, 15, 30},
                      SizeCase{"int64_max_bytes", DType::u8, {kMax}, kMax, kMax},
                      SizeCase{"bytes_overflow", DType::f32, {std::int64_t(1) << 62}, std::int64_t(1) << 62, -1},
                      SizeCase{"numel_overflow", DType::u8, {std::int64_t(1) << 32, std::int64_t(1) << 31}, -1, -1},
                      // 2^32 experts x 2^32 rows x 2^32: wraps to 0 in unsigned 64-bit arithmetic.
                      SizeCase{"wraps_to_zero", DType::fp8_e4m3, {std::int64_t(1) << 32, std::int64_t(1) << 16, std::int64_t(1) << 16}, -1, -1},
                      SizeCase{"negative", DType::f32, {-1, 4}, -1, -1}),
    [](const ::testing::TestParamInfo<SizeCase>& info) { return std::string(info.param.name); });

TEST(CoreTensorSize, CheckedMulNamesWhatItSizes) {
  EXPECT_EQ(checked_mul(0, kMax, "x"), 0);
  EXPECT_EQ(checked_mul(kMax, 1, "x"), kMax);
  EXPECT_EQ(checked_mul(std::int64_t(1) << 31, std::int64_t(1) << 31, "x"), std::int64_t(1) << 62);
  for (const auto& [a, b] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {std::int64_t(1) << 32, std::int64_t(1) << 31}, {kMax, 2}, {-1, 3}, {3, -1}}) {
    try {
      checked_mul(a, b, "--tokens x hidden_size");
      ADD_FAILURE() << a << " x " << b << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--tokens x hidden_size"), std::string::npos) << e.what();
    }
  }
}

// Memory that is not there is an Error naming the tensor, not std::bad_alloc. (2^62 bytes is
// below the int64 limit, above any machine's memory.)
TEST(CoreTensorSize, UnavailableMemoryIsAnErrorNamingTheTensor) {
  try {
    Tensor t(DType::u8, {std::int64_t(1) << 62}, "w13");
    ADD_FAILURE() << "allocated 2^62 bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w13: cannot allocate"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit
