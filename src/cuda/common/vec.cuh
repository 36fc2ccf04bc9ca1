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

// q[i] = fp8(x[i] / scale) for 8 values, packed low byte first. IEEE division, as the CPU.
__device__ __forceinline__ uint2 quantize8(const float (&x)[8], float scale) {
  std::uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const std::uint32_t a = fp8x2(__fdiv_rn(x[4 * i], scale), __fdiv_rn(x[4 * i + 1], scale));
    const std::uint32_t b = fp8x2(__fdiv_rn(x[4 * i + 2], scale), __fdiv_rn(x[4 * i + 3], scale));
    w[i] = a | (b << 16);
  }
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ std::uint8_t quantize1(float x, float scale) {
  return std::uint8_t(__nv_cvt_float_to_fp8(__fdiv_rn(x, scale), __NV_SATFINITE, __NV_E4M3));
}

// The dynamic scale of DESIGN §4: max(amax, 1e-10) / 448, rounded up to a power of two for
// UE8M0 (moekit::fp8_scale). amax is never NaN (fmaxf drops NaN).
__device__ __forceinline__ float fp8_scale(float amax, bool ue8m0) {
  const float scale = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
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

}  // namespace moekit::cuda
