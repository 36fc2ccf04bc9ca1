// Activation + requantization kernels.
//   groups  a warp per 256 columns of a row, half a warp per 128-column group, 8 outputs per lane:
//           load gate and up (16 bytes each), activate in f32, then per the output: fp8 with the
//           group's own scale, fp8 with the tensor scale, bf16, or only the amax (fp8-tensor
//           dynamic pass 1)
//   rows    fp8-rowwise: a block per row, the activated row kept in shared memory
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rows.cuh"
#include "cuda/common/vec.cuh"
#include "moekit/config.h"

namespace moekit::cuda::activation {

enum class Emit : std::uint8_t { group_fp8, tensor_fp8, bf16, amax };

struct ActParams {
  RowsParams rows;
  const std::uint16_t* in;  // [max_rows, W]
  int in_width;             // W
  int inter;                // I
  int groups;               // ceil(I / 128)
  int max_rows;
  Activation act;
  float alpha;
  float limit;
  bool ue8m0;
  ScaleLayout layout;
  const float* given_scale;
  float* amax;              // [1] workspace
  void* q;                  // [max_rows, I]
  float* scales;
};

// The scalar functions of cpu/activation.cpp, rounding every step as it does (no FMA).
__device__ __forceinline__ float gelu(float x) {
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erff(__fmul_rn(x, 0.70710678118654752f))));
}
__device__ __forceinline__ float relu2(float x) {
  const float r = fmaxf(x, 0.0f);
  return __fmul_rn(r, r);
}

// n[i] / (1 + e^z[i]) for 8 values: silu's x / (1 + e^-x) and swiglu_oai's gate·σ(alpha·gate).
// The quotients of IEEE division: for z < 64 the denominator lies in [1, 2^93), and n, a bf16
// value (or the clamp limit), is 0, at least 2^-100, or so small that z = -n or -alpha·n is too
// (|z| < 2^-25: e^z rounds to 1, the denominator is 2 and the quotient exact), so divide_steps
// gives __fdiv_rn's result without its range check; a larger z (or NaN) anywhere among the 8
// takes __fdiv_rn for all of them. kRefined: the steps start from refined_reciprocal(d), exact
// for any such n and d; otherwise from approximate_reciprocal(d), two instructions fewer, which
// is exact for silu's n = gate, z = -gate: every bf16 gate is checked (with both) in
// tests/cuda/division_test.cu.
template <bool kRefined>
__device__ __forceinline__ void divide_by_one_plus_exp(const float (&n)[8], const float (&z)[8], float (&out)[8]) {
  float d[8];
  bool steps = true;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    d[i] = __fadd_rn(1.0f, expf(z[i]));
    steps &= z[i] < 64.0f;
  }
  if (steps) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = divide_steps(n[i], d[i], kRefined ? refined_reciprocal(d[i]) : approximate_reciprocal(d[i]));
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __fdiv_rn(n[i], d[i]);
  }
}

// The activation of 8 (gate, up) pairs already in f32 (bf16 values); relu2 reads gate only. The
// activation is a template argument: each kernel holds one function's code (a runtime switch
// kept all four live, and their constants in registers).
template <Activation kAct>
__device__ __forceinline__ void activate_values(float (&gate)[8], float (&up)[8], float alpha, float limit,
                                                float (&out)[8]) {
  if constexpr (kAct == Activation::relu2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = relu2(gate[i]);
  } else if constexpr (kAct == Activation::gelu_and_mul) {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __fmul_rn(gelu(gate[i]), up[i]);
  } else if constexpr (kAct == Activation::swiglu_oai) {
    // gate clamped to <= limit, up to [-limit, limit] (std::clamp: NaN passes through);
    // out = gate·σ(alpha·gate)·(up + 1).
    float z[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      gate[i] = fminf(gate[i], limit);
      up[i] = up[i] < -limit ? -limit : (limit < up[i] ? limit : up[i]);
      z[i] = __fmul_rn(-alpha, gate[i]);
    }
    divide_by_one_plus_exp<true>(gate, z, out);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __fmul_rn(out[i], __fadd_rn(up[i], 1.0f));
  } else {  // silu(gate)·up
    float z[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) z[i] = -gate[i];
    divide_by_one_plus_exp<false>(gate, z, out);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = __fmul_rn(out[i], up[i]);
  }
}

// Outputs [col, col + 8) of a row of GEMM1's bf16 output (gate at `at`, up I columns later).
template <Activation kAct>
__device__ __forceinline__ void activate8(const ActParams& p, const std::uint16_t* at, float (&out)[8]) {
  float gate[8], up[8] = {};
  unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(at)), gate);
  if constexpr (kAct != Activation::relu2) unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(at + p.inter)), up);
  activate_values<kAct>(gate, up, p.alpha, p.limit, out);
}

// Block-wide max of non-negative values; every thread gets it. `shared` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* shared) {
  v = group_max<32>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : 0.0f;
  return group_max<32>(v);
}

// Work items of 256 columns (a row's 128-column groups two at a time, a half warp each), spread
// over the warps in contiguous runs of at least kItemsPerWarp; kUnroll items in flight per warp.
// Every item is one round trip, so few rows (decode: 8 rows of 4096 columns at T=1) still spread
// over many warps: a warp per row walked its row's pairs and its run of rows one load after the
// other (22 µs for deepseek-v3's 8 rows at T=1, docs/perf-log/decode.md). Five blocks per SM (48
// registers): more warps to cover the loads' latency, faster on the H200 than four (docs/PERF.md).
constexpr int kItemsPerWarp = 2;

template <Emit kEmit, Activation kAct>
__global__ void __launch_bounds__(256, 5) activate_groups(ActParams p) {
  constexpr int kUnroll = kItemsPerWarp;
  __shared__ float reduce[32];
  const int lane = threadIdx.x & 31, sub = lane & 15, half = lane >> 4;
  const std::int64_t warp = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * blockDim.x / 32;
  float tensor_scale = 0.0f;
  if (kEmit == Emit::tensor_fp8) {
    tensor_scale = p.given_scale ? __ldg(p.given_scale) : fp8_scale(*p.amax, p.ue8m0);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.scales[0] = tensor_scale;
  }
  const ScaleDivision tensor_division(tensor_scale, p.given_scale == nullptr);
  float running_max = 0.0f;
  const int pairs = (p.groups + 1) / 2;
  const std::int64_t items = std::int64_t(p.max_rows) * pairs;
  const std::int64_t per_warp = (items + warps - 1) / warps;
  const std::int64_t first = min(warp * per_warp, items), last = min(first + per_warp, items);
  int located = -1;  // the row `info` describes: a run's items mostly share their row
  RowInfo info{RowKind::unused, 0, 0, 0, 0};
  for (std::int64_t item0 = first; item0 < last; item0 += kUnroll) {
    float x[kUnroll][8];
    RowInfo at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      at[u] = RowInfo{RowKind::unused, 0, 0, 0, 0};
      if (item0 + u >= last) break;  // warp-uniform
      const int row = int((item0 + u) / pairs), col = (int((item0 + u) % pairs) * 2 + half) * 128 + sub * 8;
      if (row != located) {
        info = locate_row(p.rows, row);
        located = row;
      }
      at[u] = info;
      if (info.kind == RowKind::token && col < p.inter) {
        activate8<kAct>(p, p.in + std::int64_t(row) * p.in_width + col, x[u]);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (at[u].kind == RowKind::unused) continue;  // warp-uniform: the shuffles need all lanes
      const bool token = at[u].kind == RowKind::token;
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = amax_step(m, x[u][i]);
      if (kEmit == Emit::amax) {
        running_max = fmaxf(running_max, m);
        continue;
      }
      float scale = tensor_scale;
      if (kEmit == Emit::group_fp8) scale = fp8_scale(group_max<16>(m), p.ue8m0);
      const int row = int((item0 + u) / pairs), g = int((item0 + u) % pairs) * 2 + half;
      const int col = g * 128 + sub * 8;
      if (col >= p.inter) continue;
      const std::int64_t out = std::int64_t(row) * p.inter + col;
      if (kEmit == Emit::bf16) {
        *reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(p.q) + out) = token ? pack_bf16x8(x[u]) : make_uint4(0, 0, 0, 0);
        continue;
      }
      const ScaleDivision division = kEmit == Emit::group_fp8 ? ScaleDivision(scale, true) : tensor_division;
      *reinterpret_cast<uint2*>(static_cast<std::uint8_t*>(p.q) + out) = token ? quantize8(x[u], division) : make_uint2(0, 0);
      if (kEmit == Emit::group_fp8 && sub == 0)
        p.scales[scale_index(p.layout, at[u], row, g, p.groups)] = token ? scale : 0.0f;
    }
  }
  if (kEmit == Emit::amax) {
    running_max = block_max(running_max, reduce);
    if (threadIdx.x == 0) atomic_max_nonnegative(p.amax, running_max);
  }
}

// fp8-rowwise: a block per row; the activated row waits in shared memory for its scale.
template <Activation kAct>
__global__ void __launch_bounds__(256) activate_rows(ActParams p) {
  extern __shared__ float4 shared4[];
  float* act = reinterpret_cast<float*>(shared4);  // [I]
  __shared__ float reduce[32];
  for (std::int64_t row64 = blockIdx.x; row64 < p.max_rows; row64 += gridDim.x) {  // 64-bit: no wrap near 2^31 rows
    const int row = int(row64);
    const RowInfo info = locate_row(p.rows, row);  // the same for the whole block
    if (info.kind == RowKind::unused) continue;
    std::uint8_t* q = static_cast<std::uint8_t*>(p.q) + std::int64_t(row) * p.inter;
    if (info.kind == RowKind::padding) {
      for (int c = threadIdx.x * 8; c < p.inter; c += blockDim.x * 8) *reinterpret_cast<uint2*>(q + c) = make_uint2(0, 0);
      if (threadIdx.x == 0) p.scales[row] = 0.0f;
      continue;
    }
    float m = 0.0f;
    for (int c = threadIdx.x * 8; c < p.inter; c += blockDim.x * 8) {
      float x[8];
      activate8<kAct>(p, p.in + std::int64_t(row) * p.in_width + c, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) m = amax_step(m, x[i]);
      reinterpret_cast<float4*>(act + c)[0] = make_float4(x[0], x[1], x[2], x[3]);
      reinterpret_cast<float4*>(act + c)[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
    const float scale = fp8_scale(block_max(m, reduce), p.ue8m0);
    const ScaleDivision division(scale, true);
    for (int c = threadIdx.x * 8; c < p.inter; c += blockDim.x * 8) {
      const float4 a = reinterpret_cast<const float4*>(act + c)[0], b = reinterpret_cast<const float4*>(act + c)[1];
      const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      *reinterpret_cast<uint2*>(q + c) = quantize8(x, division);
    }
    if (threadIdx.x == 0) p.scales[row] = scale;
    __syncthreads();  // the row buffer is refilled for the next row
  }
}

}  // namespace moekit::cuda::activation
