// The division shortcuts of the stage kernels against __fdiv_rn (IEEE division, the CPU's):
//   ScaleDivision (quantization: many values, one scale) on 2^26 random (x, scale) pairs drawn
//   the way the kernels meet them (dynamic scales of amaxes over the whole float range, ue8m0 or
//   not, x within ±amax: zeros, subnormals, the amax, inf, NaN; given scales with any x): the
//   same quotient wherever |x| >= 2^-100 and the same FP8 code everywhere;
//   divide_by_one_plus_exp (silu, swiglu_oai) for every bf16 gate value: the same quotient;
//   the routing sigmoid for every bf16 logit and 2^24 random f32 ones: the same quotient, and
//   its exponential (exp_ref) against exp in double rounded to f32, on the same arguments;
//   fp8_scale (amax / 448) for every non-negative float, both scale formats.
// Everything runs on the GPU; a count of mismatches and the first one come back.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda/activation/activate.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/routing/route_math.cuh"
#include "cuda_test_util.h"

namespace moekit::cuda {
namespace {

using test::have_gpu;

struct Mismatches {
  unsigned long long count;
  float x, divisor, got, want;
};

__device__ std::uint32_t mix(std::uint64_t v) {
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  v *= 0xc4ceb9fe1a85ec53ull;
  v ^= v >> 33;
  return std::uint32_t(v);
}

__device__ bool same_code(std::uint8_t a, std::uint8_t b) {
  return a == b || ((a & 0x7f) == 0x7f && (b & 0x7f) == 0x7f);  // NaN codes of either sign
}

__device__ void record(Mismatches* m, float x, float divisor, float got, float want) {
  if (atomicAdd(&m->count, 1ull) == 0) *m = {1, x, divisor, got, want};
}

__global__ void scale_division_cases(std::uint64_t seed, Mismatches* m) {
  const std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint32_t r0 = mix(seed + 4 * i), r1 = mix(seed + 4 * i + 1), r2 = mix(seed + 4 * i + 2);
  // amax: any positive float bit pattern below inf (infinite amaxes too, now and then).
  float amax = __uint_as_float(r0 & 0x7f7fffffu);
  if ((r2 & 0xff) == 0) amax = __int_as_float(0x7f800000);
  const float scale = fp8_scale(amax, (r2 >> 8) & 1);
  // x: what a dynamic scale divides (|x| <= amax), or any bits with a given scale.
  float x;
  bool dynamic = true;
  switch ((r2 >> 9) & 7) {
    case 0: x = __uint_as_float(r1), dynamic = false; break;                          // any bits
    case 1: x = (r1 & 1) ? -0.0f : 0.0f; break;                                       // zeros
    case 2: x = __uint_as_float((r1 & 0x807fffffu)); break;                           // subnormals
    case 3: x = (r1 & 1) ? -amax : amax; break;                                       // the amax itself
    case 4: x = __uint_as_float(r1 | 0x7f800001u); break;                             // NaN
    default: x = __fmul_rn(amax, __fmul_rn(float(int(r1)), 0x1p-31f)); break;         // within ±amax
  }
  const ScaleDivision division(scale, dynamic);
  const float got = division(x), want = __fdiv_rn(x, scale);
  const bool quotient_kept = isnan(want) ? isnan(got) : __float_as_uint(got) == __float_as_uint(want);
  const bool must_keep = isnan(want) || fabsf(x) >= 0x1p-100f || x == 0.0f;
  const std::uint8_t code_got = __nv_cvt_float_to_fp8(got, __NV_SATFINITE, __NV_E4M3);
  const std::uint8_t code_want = __nv_cvt_float_to_fp8(want, __NV_SATFINITE, __NV_E4M3);
  if ((must_keep && !quotient_kept) || !same_code(code_got, code_want)) record(m, x, scale, got, want);
}

// Thread t: the 8 bf16 gates 8t .. 8t + 7 (every pattern once over 8192 threads).
__global__ void gate_division_cases(float alpha, float limit, bool swiglu, bool refined, Mismatches* m) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  float n[8], z[8], got[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float gate = bf16_to_f32(std::uint16_t(8 * t + i));
    n[i] = swiglu ? fminf(gate, limit) : gate;
    z[i] = swiglu ? __fmul_rn(-alpha, n[i]) : -gate;
  }
  if (refined) activation::divide_by_one_plus_exp<true>(n, z, got);
  else activation::divide_by_one_plus_exp<false>(n, z, got);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float d = __fadd_rn(1.0f, expf(z[i]));
    const float want = __fdiv_rn(n[i], d);
    const bool same = isnan(want) ? isnan(got[i]) : __float_as_uint(got[i]) == __float_as_uint(want);
    if (!same) record(m, n[i], d, got[i], want);
  }
}

// Threads below 65536 take the bf16 patterns, the others random f32 bits.
__global__ void sigmoid_cases(Mismatches* m) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = t < 65536 ? bf16_to_f32(std::uint16_t(t)) : __uint_as_float(mix(t));
  const float got = routing::sigmoid_ref(x);
  const float want = __fdiv_rn(1.0f, __fadd_rn(1.0f, routing::exp_ref(-x)));
  const bool same = isnan(want) ? isnan(got) : __float_as_uint(got) == __float_as_uint(want);
  if (!same) record(m, x, 0.0f, got, want);
}

// exp_ref against the double exp rounded once to f32 (correct unless e^x lies within ~2^-51 of
// a rounding boundary), on the arguments of sigmoid_cases.
__global__ void exp_cases(Mismatches* m) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  const float x = t < 65536 ? bf16_to_f32(std::uint16_t(t)) : __uint_as_float(mix(t));
  const float got = routing::exp_ref(x);
  const float want = isnan(x) ? x : __double2float_rn(exp(double(x)));
  const bool same = isnan(want) ? isnan(got) : __float_as_uint(got) == __float_as_uint(want);
  if (!same) record(m, x, 0.0f, got, want);
}

// Every non-negative float bit pattern as an amax (thread t: patterns 8t .. 8t + 7), both
// scale formats: fp8_scale against the same rule with __fdiv_rn.
__global__ void fp8_scale_cases(Mismatches* m) {
  const std::uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  for (std::uint32_t i = 0; i < 8; ++i) {
    const float amax = __uint_as_float(8 * t + i);  // 8t + i < 2^31
    if (isnan(amax)) continue;
    for (const bool ue8m0 : {false, true}) {
      float want = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
      const std::uint32_t u = __float_as_uint(want);
      if (ue8m0 && (u & 0x007fffffu) != 0) want = __uint_as_float((u & 0x7f800000u) + 0x00800000u);
      const float got = fp8_scale(amax, ue8m0);
      if (__float_as_uint(got) != __float_as_uint(want)) record(m, amax, 448.0f, got, want);
    }
  }
}

std::string describe(const Mismatches& m) {
  auto bits = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    char s[16];
    std::snprintf(s, sizeof s, "0x%08x", u);
    return std::string(s);
  };
  return std::to_string(m.count) + " mismatches; first: x " + bits(m.x) + " / " + bits(m.divisor) + " gave " +
         bits(m.got) + ", IEEE " + bits(m.want);
}

// Blocks of a launch: all of them, or under MOEKIT_CUDA_TEST_SMALL (sanitizer runs) 1/64th, the
// first ones (every bf16 pattern still: they come first).
unsigned blocks(unsigned all) { return test::small_cases() ? std::max(all / 64, 1u) : all; }

// Runs launch(record) on a zeroed mismatch record and expects it to stay empty.
template <class Launch>
void expect_no_mismatches(Launch launch, const std::string& what = "") {
  test::DeviceArray<Mismatches> record(1);
  ASSERT_EQ(cudaMemset(record.data(), 0, sizeof(Mismatches)), cudaSuccess);
  launch(record.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  test::sync_and_check();
  const Mismatches got = record.download()[0];
  EXPECT_EQ(got.count, 0u) << what << describe(got);
}

TEST(CudaDivision, ScaleDivisionGivesIeeeQuotientsAndCodes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_no_mismatches([](Mismatches* m) {
    for (std::uint64_t seed = 0; seed < (test::small_cases() ? 1 : 4); ++seed)
      scale_division_cases<<<blocks((1 << 24) / 256), 256>>>(seed << 40, m);
  });
}

TEST(CudaDivision, GateDivisionGivesIeeeQuotientsForEveryBf16Gate) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    bool swiglu;
    float alpha, limit;
    bool refined;  // silu runs unrefined, swiglu_oai (any alpha) refined
  };
  for (const Case c : {Case{false, 0.0f, 0.0f, false}, Case{false, 0.0f, 0.0f, true}, Case{true, 1.702f, 7.0f, true},
                       Case{true, 1.0f, 1e30f, true}, Case{true, -3.5f, 100.0f, true}}) {
    expect_no_mismatches(
        [&](Mismatches* m) { gate_division_cases<<<65536 / 8 / 256, 256>>>(c.alpha, c.limit, c.swiglu, c.refined, m); },
        (c.swiglu ? "swiglu_oai alpha " + std::to_string(c.alpha) : std::string("silu")) +
            (c.refined ? " (refined): " : " (unrefined): "));
  }
}

TEST(CudaDivision, RoutingSigmoidGivesIeeeQuotients) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_no_mismatches([](Mismatches* m) { sigmoid_cases<<<blocks((1 << 24) / 256), 256>>>(m); });
}

TEST(CudaDivision, RoutingExpIsCorrectlyRounded) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_no_mismatches([](Mismatches* m) { exp_cases<<<blocks((1 << 24) / 256), 256>>>(m); });
}

TEST(CudaDivision, Fp8ScaleGivesIeeeQuotientsForEveryAmax) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_no_mismatches([](Mismatches* m) { fp8_scale_cases<<<blocks((1u << 31) / 8 / 256), 256>>>(m); });
}

}  // namespace
}  // namespace moekit::cuda
