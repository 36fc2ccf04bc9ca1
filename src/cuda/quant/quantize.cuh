// Quantization kernels: the scale of a group is max(amax, 1e-10)/448, each value becomes
// fp8(x / scale) with IEEE division's quotient (ScaleDivision), so the codes and scales equal
// the CPU's bit for bit.
//   groups   fp8-block: a warp per row, half a warp per 1x128 group, 8 values per lane (16-byte loads)
//   rows     fp8-rowwise: a block per row, the row kept in shared memory between passes
//   tensor   fp8-tensor: amax of everything (order-free integer atomicMax), then quantize
//   weighted bf16 with the weight on the input
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/vec.cuh"

namespace moekit::cuda::quant {

struct KernelParams {
  const std::uint16_t* hidden;  // [T, H] bf16
  const float* weights;         // [T] or null (weight on input)
  const float* given_scale;     // [1] or null
  void* q;                      // [T, H]
  float* scales;
  float* amax;                  // [1] workspace (fp8-tensor dynamic)
  std::int64_t tokens;
  int hidden_size;
  bool ue8m0;
};

// The value the CPU Prepare quantizes: the bf16 input, or bf16(x * w) with the weight on input.
template <bool kOnInput>
__device__ __forceinline__ float prepared(float x, float w) {
  return kOnInput ? round_to_bf16(__fmul_rn(x, w)) : x;
}

template <bool kOnInput>
__device__ __forceinline__ void load8(const KernelParams& p, std::int64_t t, int col, float (&x)[8]) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.hidden + t * p.hidden_size + col));
  unpack_bf16x8(v, x);
  if (kOnInput) {
    const float w = __ldg(p.weights + t);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = prepared<true>(x[i], w);
  }
}

// fp8-block: half a warp per 1x128 group, kUnroll pairs of groups per step; the steps of all
// rows, (row, first group) in row order, are dealt to the warps in turn (finer than whole rows,
// so the last wave is short). The loads of a warp's next kAhead steps are in flight while step
// i is computed, so memory and arithmetic overlap within each warp.
template <bool kOnInput, int kUnroll, int kAhead>
__global__ void __launch_bounds__(256) quantize_groups(KernelParams p) {
  const int groups = (p.hidden_size + 127) / 128;
  const int steps_per_row = (groups + 2 * kUnroll - 1) / (2 * kUnroll);
  const int lane = threadIdx.x & 31, sub = lane & 15, half = lane >> 4;
  const std::int64_t warp = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const std::int64_t warps = std::int64_t(gridDim.x) * blockDim.x / 32;
  const std::int64_t all_steps = p.tokens * steps_per_row;
  const std::int64_t steps = warp < all_steps ? (all_steps - 1 - warp) / warps + 1 : 0;  // warp-uniform

  // A warp's items advance by `warps` each step: (row, step in row) moves by the quotient and
  // remainder of warps / steps_per_row, made once (no 64-bit division per step).
  const std::int64_t row_stride = warps / steps_per_row;
  const int step_stride = int(warps - row_stride * steps_per_row);
  const auto advance = [&](std::int64_t& row, int& in_row, std::int64_t from_row, int from_in_row) {
    row = from_row + row_stride;
    in_row = from_in_row + step_stride;
    if (in_row >= steps_per_row) in_row -= steps_per_row, ++row;
  };
  const auto fetch = [&](std::int64_t t, int s, uint4 (&into)[kUnroll]) {
    const int g0 = s * 2 * kUnroll;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = (g0 + 2 * u + half) * 128 + sub * 8;
      into[u] = col < p.hidden_size ? __ldg(reinterpret_cast<const uint4*>(p.hidden + t * p.hidden_size + col))
                                    : make_uint4(0, 0, 0, 0);
    }
  };
  // Slot i of the ring: the values, row and step in row of step + i.
  uint4 raw[kAhead + 1][kUnroll];
  std::int64_t row[kAhead + 1];
  int in_row[kAhead + 1];
  row[0] = warp / steps_per_row;
  in_row[0] = int(warp - row[0] * steps_per_row);
#pragma unroll
  for (int i = 0; i < kAhead; ++i) {
    if (i < steps) fetch(row[i], in_row[i], raw[i]);
    advance(row[i + 1], in_row[i + 1], row[i], in_row[i]);
  }
  for (std::int64_t step = 0; step < steps; ++step) {
    if (step + kAhead < steps) fetch(row[kAhead], in_row[kAhead], raw[kAhead]);
    const std::int64_t t = row[0];
    const int g0 = in_row[0] * 2 * kUnroll;
    const float w = kOnInput ? __ldg(p.weights + t) : 1.0f;
    std::uint8_t* q = static_cast<std::uint8_t*>(p.q) + t * p.hidden_size;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[8];
      unpack_bf16x8(raw[0][u], x);
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        x[i] = prepared<kOnInput>(x[i], w);
        m = amax_step(m, x[i]);
      }
      const float scale = fp8_scale(group_max<16>(m), p.ue8m0);
      const int g = g0 + 2 * u + half;
      const int col = g * 128 + sub * 8;
      if (col < p.hidden_size) {
        *reinterpret_cast<uint2*>(q + col) = quantize8(x, ScaleDivision(scale, true));
        if (sub == 0) p.scales[t * groups + g] = scale;
      }
    }
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) raw[i][u] = raw[i + 1][u];
      row[i] = row[i + 1];
      in_row[i] = in_row[i + 1];
    }
    advance(row[kAhead], in_row[kAhead], row[kAhead - 1], in_row[kAhead - 1]);
  }
}

// Block-wide max of non-negative values; every thread gets it. `shared` holds 32 floats.
__device__ __forceinline__ float block_max(float v, float* shared) {
  v = group_max<32>(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? shared[lane] : 0.0f;
  return group_max<32>(v);
}

// fp8-rowwise: one block per row; pass 1 keeps the prepared row in shared memory and finds its
// amax, pass 2 quantizes it.
template <bool kOnInput, bool kVector>
__global__ void __launch_bounds__(256) quantize_rows(KernelParams p) {
  extern __shared__ float4 shared4[];
  float* row = reinterpret_cast<float*>(shared4);  // [H]
  __shared__ float reduce[32];
  const int h = p.hidden_size;
  for (std::int64_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    float m = 0.0f;
    if (kVector) {
      for (int c = threadIdx.x * 8; c < h; c += blockDim.x * 8) {
        float x[8];
        load8<kOnInput>(p, t, c, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = amax_step(m, x[i]);
        reinterpret_cast<float4*>(row + c)[0] = make_float4(x[0], x[1], x[2], x[3]);
        reinterpret_cast<float4*>(row + c)[1] = make_float4(x[4], x[5], x[6], x[7]);
      }
    } else {
      const float w = kOnInput ? __ldg(p.weights + t) : 1.0f;
      for (int c = threadIdx.x; c < h; c += blockDim.x) {
        const float x = prepared<kOnInput>(bf16_to_f32(__ldg(p.hidden + t * h + c)), w);
        m = amax_step(m, x);
        row[c] = x;
      }
    }
    const float scale = fp8_scale(block_max(m, reduce), p.ue8m0);
    const ScaleDivision division(scale, true);
    std::uint8_t* q = static_cast<std::uint8_t*>(p.q) + t * h;
    if (kVector) {
      for (int c = threadIdx.x * 8; c < h; c += blockDim.x * 8) {
        const float4 a = reinterpret_cast<const float4*>(row + c)[0], b = reinterpret_cast<const float4*>(row + c)[1];
        const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        *reinterpret_cast<uint2*>(q + c) = quantize8(x, division);
      }
    } else {
      for (int c = threadIdx.x; c < h; c += blockDim.x) q[c] = quantize1(row[c], division);
    }
    if (threadIdx.x == 0) p.scales[t] = scale;
    __syncthreads();  // the row buffer is refilled for the next token
  }
}

// fp8-tensor dynamic, pass 1: amax of every prepared value into *p.amax (zeroed before).
template <bool kOnInput, bool kVector>
__global__ void __launch_bounds__(256) tensor_amax(KernelParams p) {
  __shared__ float reduce[32];
  const std::int64_t n = p.tokens * p.hidden_size;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  float m = 0.0f;
  if (kVector) {
    for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v * 8 < n; v += stride) {
      const std::int64_t t = v * 8 / p.hidden_size;
      float x[8];
      load8<kOnInput>(p, t, int(v * 8 - t * p.hidden_size), x);
#pragma unroll
      for (int i = 0; i < 8; ++i) m = amax_step(m, x[i]);
    }
  } else {
    for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
      const float w = kOnInput ? __ldg(p.weights + i / p.hidden_size) : 1.0f;
      m = amax_step(m, prepared<kOnInput>(bf16_to_f32(__ldg(p.hidden + i)), w));
    }
  }
  m = block_max(m, reduce);
  if (threadIdx.x == 0) atomic_max_nonnegative(p.amax, m);
}

// fp8-tensor pass 2 (and the static case): one scale for everything.
template <bool kOnInput, bool kVector>
__global__ void __launch_bounds__(256) tensor_quantize(KernelParams p) {
  const float scale = p.given_scale ? __ldg(p.given_scale) : fp8_scale(*p.amax, p.ue8m0);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.scales[0] = scale;
  const ScaleDivision division(scale, p.given_scale == nullptr);
  const std::int64_t n = p.tokens * p.hidden_size;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  std::uint8_t* q = static_cast<std::uint8_t*>(p.q);
  if (kVector) {
    for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v * 8 < n; v += stride) {
      const std::int64_t t = v * 8 / p.hidden_size;
      float x[8];
      load8<kOnInput>(p, t, int(v * 8 - t * p.hidden_size), x);
      *reinterpret_cast<uint2*>(q + v * 8) = quantize8(x, division);
    }
  } else {
    for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
      const float w = kOnInput ? __ldg(p.weights + i / p.hidden_size) : 1.0f;
      q[i] = quantize1(prepared<kOnInput>(bf16_to_f32(__ldg(p.hidden + i)), w), division);
    }
  }
}

// bf16 with the weight on the input: q = bf16(x * w[t]).
template <bool kVector>
__global__ void __launch_bounds__(256) weighted_bf16(KernelParams p) {
  const std::int64_t n = p.tokens * p.hidden_size;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  std::uint16_t* q = static_cast<std::uint16_t*>(p.q);
  if (kVector) {
    for (std::int64_t v = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v * 8 < n; v += stride) {
      const std::int64_t t = v * 8 / p.hidden_size;
      float x[8];
      load8<true>(p, t, int(v * 8 - t * p.hidden_size), x);
      *reinterpret_cast<uint4*>(q + v * 8) = pack_bf16x8(x);
    }
  } else {
    for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
      q[i] = f32_to_bf16(prepared<true>(bf16_to_f32(__ldg(p.hidden + i)), __ldg(p.weights + i / p.hidden_size)));
  }
}

}  // namespace moekit::cuda::quant
