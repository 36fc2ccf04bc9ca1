// The CPU FP8 codec against the GPU's own conversion (__NV_SATFINITE, e4m3) for every one
// of the 2^32 float bit patterns and all 256 codes. Skips without a GPU.
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "cuda_test_util.h"
#include "moekit/quant.h"

namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

__global__ void encode_patterns(std::uint64_t base, std::uint32_t n, std::uint8_t* out) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __uint_as_float(std::uint32_t(base + i));
  out[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__global__ void decode_codes(float* out) {
  const int c = threadIdx.x;
  __nv_fp8_e4m3 v;
  v.__x = std::uint8_t(c);
  out[c] = float(v);
}

bool is_nan_code(std::uint8_t c) { return (c & 0x7f) == 0x7f; }

TEST(CudaFp8Codec, EncodeMatchesTheGpuForEveryFloat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr std::uint32_t kChunk = 1u << 28;
  std::uint8_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kChunk), cudaSuccess);
  std::vector<std::uint8_t> gpu(kChunk);
  std::atomic<std::uint64_t> mismatches{0};
  std::atomic<std::uint64_t> first_bad{~0ull};
  // MOEKIT_CUDA_TEST_SMALL (sanitizer runs): two chunks, the positive floats in [2^-31, 2^33)
  // (the FP8 range, its subnormals, and saturation).
  const bool reduced = moekit::test::small_cases();
  for (std::uint64_t base = reduced ? 0x30000000ull : 0; base < (reduced ? 0x50000000ull : (1ull << 32)); base += kChunk) {
    cudaMemset(device, 0xAB, kChunk);
    encode_patterns<<<kChunk / 256, 256>>>(base, kChunk, device);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(gpu.data(), device, kChunk, cudaMemcpyDeviceToHost), cudaSuccess);
    moekit::core::parallel_for(kChunk, 1 << 20, [&](std::int64_t b, std::int64_t e) {
      std::uint64_t bad = 0;
      for (std::int64_t i = b; i < e; ++i) {
        const std::uint32_t bits = std::uint32_t(base + std::uint64_t(i));
        float x;
        std::memcpy(&x, &bits, sizeof x);
        const std::uint8_t cpu = moekit::fp8_e4m3_encode(x);
        const std::uint8_t ref = gpu[std::size_t(i)];
        const bool same = std::isnan(x) ? is_nan_code(cpu) && is_nan_code(ref) : cpu == ref;
        if (!same) {
          ++bad;
          std::uint64_t expected = ~0ull;
          first_bad.compare_exchange_strong(expected, bits);
        }
      }
      mismatches += bad;
    });
  }
  cudaFree(device);
  EXPECT_EQ(mismatches.load(), 0u) << "first mismatching float bits 0x" << std::hex << first_bad.load();
}

TEST(CudaFp8Codec, DecodeMatchesTheGpuForEveryCode) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 256 * sizeof(float)), cudaSuccess);
  decode_codes<<<1, 256>>>(device);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  float gpu[256];
  ASSERT_EQ(cudaMemcpy(gpu, device, sizeof gpu, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(device);
  for (int c = 0; c < 256; ++c) {
    const float cpu = moekit::fp8_e4m3_decode(std::uint8_t(c));
    if (std::isnan(gpu[c])) EXPECT_TRUE(std::isnan(cpu)) << "code " << c;
    else EXPECT_EQ(cpu, gpu[c]) << "code " << c;
  }
}

}  // namespace
