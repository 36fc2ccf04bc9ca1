// Device helpers shared by the stage kernels: bf16/fp8 conversions that match the CPU
// reference bit for bit, the dynamic scale rule, vector loads, warp reductions.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moekit::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- bf16 (raw bits) ------------------------------------------------------------------

__device__ __forceinline__ float bf16_to_f32(std::uint16_t bits) { return __uint_as_float(std::uint32_t(bits) << 16); }

// Round to nearest even; a NaN keeps its sign and payload with the quiet bit set, exactly as
// moekit::float_to_bf16 does on the host.
__device__ __forceinline__ std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

__device__ __forceinline__ float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// 8 bf16 in a 16-byte word -> 8 floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&out)[8]) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&in)[8]) {
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = std::uint32_t(f32_to_bf16(in[2 * i])) | (std::uint32_t(f32_to_bf16(in[2 * i + 1])) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// ---- fp8 e4m3 -------------------------------------------------------------------------

// Round to nearest even, saturate to ±448, NaN stays NaN (moekit::fp8_e4m3_encode).
__device__ __forceinline__ std::uint16_t fp8x2(float lo, float hi) {
  return std::uint16_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// ---- division by IEEE's steps ----------------------------------------------------------
// __fdiv_rn(a, b) checks its operands' range (FCHK, a branch) and then runs its fast path:
// y = rcp.approx(b) refined by one Newton step, q = a·y, one correction with the exact residual
// b·q − a. Where the caller knows the range, the steps alone give the same quotient at 5 FMA-pipe
// instructions and no branch; where b is shared, its reciprocal is made once. The steps are
// exact (the residual is a float) for 2^-100 <= b <= 2^100, |a| >= 2^-100 and no overflow; the
// correction subtracts the residual from q (rather than adding its negation), which leaves a
// zero a's sign on the quotient. tests/cuda/division_test.cu compares them with __fdiv_rn on
// random and edge values.

// rcp.approx(b), within an ulp of 1/b. With divide_steps it gives __fdiv_rn's quotient only
// where a caller has checked that for every input it can be given (silu's bf16 gates).
__device__ __forceinline__ float approximate_reciprocal(float b) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(b));
  return y;
}

// y ≈ 1/b as __fdiv_rn makes it.
__device__ __forceinline__ float refined_reciprocal(float b) {
  const float y = approximate_reciprocal(b);
  return __fmaf_rn(y, __fmaf_rn(-b, y, 1.0f), y);
}

// a / b from y ≈ 1/b: __fdiv_rn's quotient in the range above when y = refined_reciprocal(b).
__device__ __forceinline__ float divide_steps(float a, float b, float y) {
  const float q = __fmul_rn(a, y);
  return __fmaf_rn(-y, __fmaf_rn(b, q, -a), q);
}

// x / scale for many x and one scale, bit for bit __fdiv_rn(x, scale), for a dynamic scale:
// one made from the amax of the values divided, so |x / scale| <= 448 and nothing overflows.
// For |x| < 2^-100 the quotient (below 2^-57: every dynamic scale is >= 1e-10 / 448) may differ
// in its last bits but gets FP8 code ±0 either way, with x's sign. A given (static) scale, whose
// quotients may overflow, and scales outside [2^-100, 2^100] (an infinite amax) take __fdiv_rn.
class ScaleDivision {
 public:
  __device__ ScaleDivision(float scale, bool dynamic)
      : scale_(scale), inverse_(refined_reciprocal(scale)),
        steps_(dynamic && scale >= 0x1p-100f && scale <= 0x1p100f) {}
  __device__ float scale() const { return scale_; }
  __device__ bool steps() const { return steps_; }
  __device__ float stepped(float x) const { return divide_steps(x, scale_, inverse_); }  // when steps()
  __device__ float operator()(float x) const { return steps_ ? stepped(x) : __fdiv_rn(x, scale_); }

 private:
  float scale_;
  float inverse_;
  bool steps_;
};

// q[i] = fp8(x[i] / scale) for 8 values, packed low byte first; the quotients of IEEE division,
// as the CPU. The branch is taken per 8 values (uniform across a group's lanes).
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], const ScaleDivision& d) {
  float q[8];
  if (d.steps()) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = d.stepped(x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __fdiv_rn(x[i], d.scale());
  }
  std::uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) w[i] = std::uint32_t(fp8x2(q[4 * i], q[4 * i + 1])) | (std::uint32_t(fp8x2(q[4 * i + 2], q[4 * i + 3])) << 16);
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ std::uint8_t quantize1(float x, const ScaleDivision& d) {
  return std::uint8_t(__nv_cvt_float_to_fp8(d(x), __NV_SATFINITE, __NV_E4M3));
}

// The dynamic scale of DESIGN §4: max(amax, 1e-10) / 448, rounded up to a power of two for
// UE8M0 (moekit::fp8_scale). amax is never NaN (fmaxf drops NaN). The division by 448 runs by
// IEEE's steps for every finite amax (>= 1e-10 > 2^-100, no overflow); an infinite one divides.
__device__ __forceinline__ float fp8_scale(float amax, bool ue8m0) {
  const float a = fmaxf(amax, 1e-10f);
  constexpr float kInverse448 = 0x1.24924ap-9f;  // 1/448 rounded to nearest, as refined_reciprocal(448) gives it
  const float scale = a <= 0x1.fffffep127f ? divide_steps(a, 448.0f, kInverse448) : __fdiv_rn(a, 448.0f);
  if (!ue8m0) return scale;
  const std::uint32_t u = __float_as_uint(scale);
  if ((u & 0x007fffffu) == 0) return scale;  // already a power of two (scale is normal)
  return __uint_as_float((u & 0x7f800000u) + 0x00800000u);
}

// |x| folded into a running maximum the way the CPU's amax does (NaN ignored).
__device__ __forceinline__ float amax_step(float m, float x) { return fmaxf(m, fabsf(x)); }

// ---- warp reductions ------------------------------------------------------------------

// Max over `Width` consecutive lanes (a power of two <= 32); every lane of the group gets it.
template <int Width>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset, Width));
  return v;
}

// Order-free atomic maximum of non-negative floats: their bit patterns order as integers.
__device__ __forceinline__ void atomic_max_nonnegative(float* address, float value) {
  atomicMax(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
}

// ---- programmatic dependent launch (sm_90) ----------------------------------------------

// Wait for the grid this one depends on to finish (and its memory to be visible); let the next
// grid start launching. No-ops without the launch attribute (cuda/common/dependent_launch.cuh).
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace moekit::cuda
