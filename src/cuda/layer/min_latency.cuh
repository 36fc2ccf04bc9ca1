// The min-latency layer's two kernels (fp8-block), after the one-block permutation plan:
//   gemm1_activation  block (slice, entry): 16 columns of the activation (16 gate and 16 up rows
//                     of w13) for a work entry's rows (<= 32 of one expert), K split over its 4
//                     warps; A rows read by token from the prepared input (no gather); f32 sums ->
//                     bf16 (GEMM1's output) -> activation in f32 -> act; the last of a 128-column
//                     block's 8 slices (a counter the plan zeroed) quantizes the block as the
//                     activation stage does
//   gemm2_combine     block (16 channels of H): every work entry's rows for those channels, a warp
//                     per entry, all of K; then each token's k rows summed in slot order (finalize's
//                     arithmetic), written to the output: no expert_out, no finalize kernel
// Both stream 16-row weight strips with mma.sync m16n8k32 (warp_mma.cuh), weights from every SM
// at once, and are launched as programmatic dependents: gemm2_combine prefetches its weights into
// L2 while gemm1_activation finishes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/quant/quantize.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/gemm/warp_mma.cuh"
#include "cuda/permute/plan_one_block.cuh"
#include "moekit/config.h"

namespace moekit::cuda::min_latency {

constexpr int kChannels = 16;  // weight rows per strip: the MMA's M
constexpr int kPassRows = 8;   // rows per MMA: its N
constexpr int kEntryRows = 32;  // rows of a work entry (the plan cuts larger experts)
constexpr int kPasses = kEntryRows / kPassRows;
constexpr int kGemm1Warps = 4;
constexpr int kGemm2Warps = 8;
constexpr int kSlicesPerBlock = 128 / kChannels;  // activation slices per 128-column quant block

struct Params {
  // The plan (contiguous, alignment 1: rows are the slots that hit a local expert).
  const std::int32_t* work;       // [1 + 3 entries]: n, then (expert, first row, rows)
  const std::int32_t* row_token;  // [rows]
  const std::int32_t* slot_rows;  // [T, k]
  const float* topk_weights;      // [T, k], null when the weights went on the input
  // GEMM1: the prepared tokens and w13
  const std::uint8_t* x;          // [T, H] e4m3
  const float* x_scales;          // [T, H / 128]
  const std::uint8_t* w13;        // [E_local, W, H]
  const float* w13_scales;        // [E_local, H / 128, W / 128]
  // The activation and GEMM2's input
  float* act;                     // [rows, I] f32
  float* act_amax;                // [rows, I / 16]
  std::int32_t* done;             // [max entries, I / 128]
  std::uint8_t* q2;               // [rows, I] e4m3
  float* s2;                      // [rows, I / 128]
  // GEMM2
  const std::uint8_t* w2;         // [E_local, H, I]
  const float* w2_scales;         // [E_local, I / 128, H / 128]
  std::uint16_t* out;             // [T, H] bf16
  int tokens, top_k, hidden, inter;
  float alpha, limit;
  bool ue8m0;
};

struct Entry {
  int expert, row0, rows;
};

__device__ __forceinline__ Entry entry(const Params& p, int j) {
  const std::int32_t* w = p.work + 1 + 3 * j;
  return {w[0], w[1], w[2]};
}

// ---- the input's quantization and the plan, one launch --------------------------------------

struct PrepareParams {
  const std::uint16_t* hidden;  // [T, H] bf16
  const float* weights;         // [T] with the weight on the input (k = 1), else null
  std::uint8_t* x;              // [T, H] e4m3
  float* x_scales;              // [T, H / 128]
  std::int64_t tokens;
  int hidden_size;
  bool ue8m0;
};

// Block 0 builds the plan (plan_in_block); the others quantize the input as the Prepare stage's
// fp8-block kernel does (half a warp per 1x128 group, the same arithmetic): every step in one
// launch, a programmatic dependent of the routing kernel (or of the caller's last one).
__global__ void __launch_bounds__(permute::kOneBlockThreads) prepare_and_plan(PrepareParams q, permute::PlanParams plan) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  grid_dependency_wait();
  launch_dependents();
  if (blockIdx.x == 0) {
    permute::plan_in_block(plan, shared_ints, scan_shared);
    return;
  }
  const int groups = q.hidden_size / 128, pairs = (groups + 1) / 2;
  const int lane = int(threadIdx.x % 32), sub = lane % 16, half = lane / 16;
  const std::int64_t warps = std::int64_t(gridDim.x - 1) * (blockDim.x / 32);
  for (std::int64_t item = std::int64_t(blockIdx.x - 1) * (blockDim.x / 32) + threadIdx.x / 32; item < q.tokens * pairs;
       item += warps) {
    const std::int64_t t = item / pairs;
    const int g = int(item % pairs) * 2 + half;
    const bool active = g < groups;  // the last pair's second half may have no group
    const int col = g * 128 + sub * 8;
    float x[8];
    unpack_bf16x8(active ? __ldg(reinterpret_cast<const uint4*>(q.hidden + t * q.hidden_size + col)) : make_uint4(0, 0, 0, 0), x);
    const float w = q.weights ? __ldg(q.weights + t) : 1.0f;
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (q.weights) x[i] = quant::prepared<true>(x[i], w);
      m = amax_step(m, x[i]);
    }
    const float scale = fp8_scale(group_max<16>(m), q.ue8m0);
    if (active) {
      *reinterpret_cast<uint2*>(q.x + t * q.hidden_size + col) = quantize8(x, ScaleDivision(scale, true));
      if (sub == 0) q.x_scales[t * groups + g] = scale;
    }
  }
}

// ---- GEMM1 + activation + requantization -------------------------------------------------

// One K block of the gate and up strips and of the first 8 rows, with its scales: loaded a
// stage ahead so that no load waits inside the K loop (the first 8 rows are decode's common case).
struct Gemm1Stage {
  uint4 gate_lo[2], gate_hi[2], up_lo[2], up_hi[2], x[2];
  float w_gate, w_up, x0, x1;  // block scales: the strips', rows 2t and 2t + 1
};

template <Activation kAct>
__global__ void __launch_bounds__(kGemm1Warps * 32) gemm1_activation(Params p) {
  constexpr bool kGated = kAct != Activation::relu2;
  constexpr int kStrips = kGated ? 2 : 1;
  __shared__ float partial[kGemm1Warps][kStrips][kPasses][32][4];
  __shared__ int token[kEntryRows];
  __shared__ int last;
  grid_dependency_wait();
  if (int(blockIdx.y) >= p.work[0]) return;
  const Entry en = entry(p, int(blockIdx.y));
  launch_dependents();
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const int c0 = int(blockIdx.x) * kChannels;  // activation columns [c0, c0 + 16)
  const int width = kGated ? 2 * p.inter : p.inter;
  const int k_blocks = p.hidden / 128, w_blocks = width / 128, i_blocks = p.inter / 128;
  if (threadIdx.x < kEntryRows) token[threadIdx.x] = int(threadIdx.x) < en.rows ? p.row_token[en.row0 + threadIdx.x] : 0;
  __syncthreads();

  const std::size_t w_row = std::size_t(en.expert) * width + c0 + g;
  const std::uint8_t* gate = p.w13 + w_row * p.hidden + t * 16;
  const std::uint8_t* up = gate + std::size_t(p.inter) * p.hidden;
  const float* w_scales = p.w13_scales + std::size_t(en.expert) * k_blocks * w_blocks;
  const float* sw_gate = w_scales + c0 / 128;
  const float* sw_up = w_scales + (p.inter + c0) / 128;
  const int passes = (en.rows + kPassRows - 1) / kPassRows;  // warp-uniform, <= kPasses
  // This warp's K blocks.
  const int per_warp = (k_blocks + kGemm1Warps - 1) / kGemm1Warps;
  const int kb0 = min(warp * per_warp, k_blocks), kb1 = min(kb0 + per_warp, k_blocks);

  auto x_row = [&](int pass, int kb) {  // this thread's 16 bytes of A row pass * 8 + g
    return p.x + std::size_t(token[pass * kPassRows + g]) * p.hidden + std::size_t(kb) * 128 + t * 16;
  };
  auto load = [&](int kb, Gemm1Stage& s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::size_t at = std::size_t(kb) * 128 + h * 64;
      s.gate_lo[h] = load_streaming(gate + at);
      s.gate_hi[h] = load_streaming(gate + std::size_t(8) * p.hidden + at);
      if (kGated) {
        s.up_lo[h] = load_streaming(up + at);
        s.up_hi[h] = load_streaming(up + std::size_t(8) * p.hidden + at);
      }
      s.x[h] = g < en.rows ? __ldg(reinterpret_cast<const uint4*>(x_row(0, kb) + h * 64)) : make_uint4(0, 0, 0, 0);
    }
    s.w_gate = __ldg(sw_gate + std::size_t(kb) * w_blocks);
    s.w_up = kGated ? __ldg(sw_up + std::size_t(kb) * w_blocks) : 0.0f;
    s.x0 = 2 * t < en.rows ? __ldg(p.x_scales + std::size_t(token[2 * t]) * k_blocks + kb) : 0.0f;
    s.x1 = 2 * t + 1 < en.rows ? __ldg(p.x_scales + std::size_t(token[2 * t + 1]) * k_blocks + kb) : 0.0f;
  };

  float acc[kStrips][kPasses][4];
#pragma unroll
  for (int s = 0; s < kStrips; ++s)
#pragma unroll
    for (int q = 0; q < kPasses; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[s][q][i] = 0.0f;

  auto compute = [&](int kb, const Gemm1Stage& s) {
    const float w_gate = s.w_gate, w_up = s.w_up;
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      if (q >= passes) break;
      uint4 x[2] = {s.x[0], s.x[1]};
      if (q > 0) {
        const bool has = q * kPassRows + g < en.rows;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          x[h] = has ? __ldg(reinterpret_cast<const uint4*>(x_row(q, kb) + h * 64)) : make_uint4(0, 0, 0, 0);
      }
      const int col = q * kPassRows + 2 * t;  // the two rows this thread's sums belong to
      float sa0 = s.x0, sa1 = s.x1;
      if (q > 0) {
        sa0 = col < en.rows ? __ldg(p.x_scales + std::size_t(token[col]) * k_blocks + kb) : 0.0f;
        sa1 = col + 1 < en.rows ? __ldg(p.x_scales + std::size_t(token[col + 1]) * k_blocks + kb) : 0.0f;
      }
      float sums[4];
      mma_block(s.gate_lo, s.gate_hi, x, sums);
      acc[0][q][0] += sa0 * w_gate * sums[0];
      acc[0][q][1] += sa1 * w_gate * sums[1];
      acc[0][q][2] += sa0 * w_gate * sums[2];
      acc[0][q][3] += sa1 * w_gate * sums[3];
      if (kGated) {
        mma_block(s.up_lo, s.up_hi, x, sums);
        acc[kStrips - 1][q][0] += sa0 * w_up * sums[0];
        acc[kStrips - 1][q][1] += sa1 * w_up * sums[1];
        acc[kStrips - 1][q][2] += sa0 * w_up * sums[2];
        acc[kStrips - 1][q][3] += sa1 * w_up * sums[3];
      }
    }
  };

  // Two K blocks in flight per warp.
  Gemm1Stage ring[2];
  if (kb0 < kb1) load(kb0, ring[0]);
  if (kb0 + 1 < kb1) load(kb0 + 1, ring[1]);
  for (int kb = kb0; kb < kb1; kb += 2) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      if (kb + s >= kb1) break;
      compute(kb + s, ring[s]);
      if (kb + s + 2 < kb1) load(kb + s + 2, ring[s]);
    }
  }
#pragma unroll
  for (int s = 0; s < kStrips; ++s)
#pragma unroll
    for (int q = 0; q < kPasses; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][s][q][lane][i] = acc[s][q][i];
  __syncthreads();

  // Epilogue: thread (row r, half c) of the first 64: columns c0 + 8c .. + 8 of row r.
  const int r = int(threadIdx.x) / 2, c = int(threadIdx.x) % 2;
  if (threadIdx.x < 2 * kEntryRows) {  // warps 0 and 1, whole
    const int q = r / kPassRows, rr = r % kPassRows, i = c * 2 + rr % 2;
    float values[kStrips][8];
#pragma unroll
    for (int s = 0; s < kStrips; ++s)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int l = j * 4 + rr / 2;
        float sum = partial[0][s][q][l][i];
#pragma unroll
        for (int w = 1; w < kGemm1Warps; ++w) sum += partial[w][s][q][l][i];
        values[s][j] = round_to_bf16(sum);  // GEMM1's bf16 output
      }
    float out[8];
    activation::activate_values<kAct>(values[0], values[kStrips - 1], p.alpha, p.limit, out);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = amax_step(m, out[j]);
    m = fmaxf(m, __shfl_xor_sync(kFullMask, m, 1));
    if (r < en.rows) {
      float* a = p.act + std::size_t(en.row0 + r) * p.inter + c0 + 8 * c;
      reinterpret_cast<float4*>(a)[0] = make_float4(out[0], out[1], out[2], out[3]);
      reinterpret_cast<float4*>(a)[1] = make_float4(out[4], out[5], out[6], out[7]);
      if (c == 0) p.act_amax[std::size_t(en.row0 + r) * (p.inter / kChannels) + blockIdx.x] = m;
    }
  }
  // The last slice of this 128-column block to finish quantizes it.
  __threadfence();
  __syncthreads();
  const int block = int(blockIdx.x) / kSlicesPerBlock;
  if (threadIdx.x == 0)
    last = atomicAdd(p.done + std::size_t(blockIdx.y) * i_blocks + block, 1) == kSlicesPerBlock - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int sub = int(threadIdx.x) % 16;  // 16 threads per row, 8 columns each
  for (int row = int(threadIdx.x) / 16; row < en.rows; row += kGemm1Warps * 2) {
    const std::size_t at = std::size_t(en.row0 + row);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kSlicesPerBlock; ++j)
      m = fmaxf(m, __ldcg(p.act_amax + at * (p.inter / kChannels) + block * kSlicesPerBlock + j));
    const float scale = fp8_scale(m, p.ue8m0);
    const float* a = p.act + at * p.inter + block * 128 + sub * 8;
    const float4 lo = __ldcg(reinterpret_cast<const float4*>(a)), hi = __ldcg(reinterpret_cast<const float4*>(a) + 1);
    const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    *reinterpret_cast<uint2*>(p.q2 + at * p.inter + block * 128 + sub * 8) = quantize8(x, ScaleDivision(scale, true));
    if (sub == 0) p.s2[at * i_blocks + block] = scale;
  }
}

// ---- GEMM2 + combine ----------------------------------------------------------------------

// One K block of a strip and of an entry's first 8 rows, with its scales (as Gemm1Stage).
struct Gemm2Stage {
  uint4 w_lo[2], w_hi[2], x[2];
  float w, x0, x1;
};

// Dynamic shared memory: the work list [3 max_entries] ints, then [rows][16] f32: the
// bf16-rounded GEMM2 outputs of this channel strip.
__global__ void __launch_bounds__(kGemm2Warps * 32) gemm2_combine(Params p, int max_entries) {
  extern __shared__ float4 shared4[];
  int* work = reinterpret_cast<int*>(shared4);
  float* strip = reinterpret_cast<float*>(shared4) + 3 * ((max_entries + 3) / 4 * 4);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  const int n0 = int(blockIdx.x) * kChannels;
  const int k_blocks = p.inter / 128, n_blocks = p.hidden / 128;
  // The plan finished before gemm1_activation let this grid launch: its work list can be read
  // now, and this warp's first weight strip fetched into L2 while GEMM1 ends.
  const int entries = p.work[0];
  for (int i = int(threadIdx.x); i < 3 * entries; i += int(blockDim.x)) work[i] = p.work[1 + i];
  if (warp < entries && lane == 0) {
    const Entry en = entry(p, warp);
    const std::uint8_t* w = p.w2 + (std::size_t(en.expert) * p.hidden + n0) * p.inter;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w), "r"(unsigned(kChannels * p.inter)) : "memory");
  }
  __syncthreads();
  grid_dependency_wait();
  auto entry_of = [&](int item) {
    const int* w = work + 3 * (warp + (item / k_blocks) * kGemm2Warps);
    return Entry{w[0], w[1], w[2]};
  };

  const int mine = entries > warp ? (entries - warp - 1) / kGemm2Warps + 1 : 0;
  const int items = mine * k_blocks;  // (entry, K block), entry-major
  Entry en{0, 0, 0};
  auto load = [&](int item, Gemm2Stage& s) {
    const Entry e = entry_of(item);
    const int kb = item % k_blocks;
    const std::uint8_t* w = p.w2 + (std::size_t(e.expert) * p.hidden + n0 + g) * p.inter + std::size_t(kb) * 128 + t * 16;
    const std::uint8_t* x = p.q2 + std::size_t(e.row0 + g) * p.inter + std::size_t(kb) * 128 + t * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      s.w_lo[h] = load_streaming(w + h * 64);
      s.w_hi[h] = load_streaming(w + std::size_t(8) * p.inter + h * 64);
      s.x[h] = g < e.rows ? __ldg(reinterpret_cast<const uint4*>(x + h * 64)) : make_uint4(0, 0, 0, 0);
    }
    s.w = __ldg(p.w2_scales + (std::size_t(e.expert) * k_blocks + kb) * n_blocks + n0 / 128);
    s.x0 = 2 * t < e.rows ? __ldg(p.s2 + std::size_t(e.row0 + 2 * t) * k_blocks + kb) : 0.0f;
    s.x1 = 2 * t + 1 < e.rows ? __ldg(p.s2 + std::size_t(e.row0 + 2 * t + 1) * k_blocks + kb) : 0.0f;
  };
  float acc[kPasses][4];
  auto compute = [&](int item, const Gemm2Stage& s) {
    const int kb = item % k_blocks;
    if (kb == 0) {
      en = entry_of(item);
#pragma unroll
      for (int q = 0; q < kPasses; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[q][i] = 0.0f;
    }
    const int passes = (en.rows + kPassRows - 1) / kPassRows;
    const float sw = s.w;
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      if (q >= passes) break;
      uint4 x[2] = {s.x[0], s.x[1]};
      if (q > 0) {
        const bool has = q * kPassRows + g < en.rows;
        const std::uint8_t* xr = p.q2 + std::size_t(en.row0 + q * kPassRows + g) * p.inter + std::size_t(kb) * 128 + t * 16;
#pragma unroll
        for (int h = 0; h < 2; ++h) x[h] = has ? __ldg(reinterpret_cast<const uint4*>(xr + h * 64)) : make_uint4(0, 0, 0, 0);
      }
      const int col = q * kPassRows + 2 * t;
      float sa0 = s.x0, sa1 = s.x1;
      if (q > 0) {
        sa0 = col < en.rows ? __ldg(p.s2 + std::size_t(en.row0 + col) * k_blocks + kb) : 0.0f;
        sa1 = col + 1 < en.rows ? __ldg(p.s2 + std::size_t(en.row0 + col + 1) * k_blocks + kb) : 0.0f;
      }
      float sums[4];
      mma_block(s.w_lo, s.w_hi, x, sums);
      acc[q][0] += sa0 * sw * sums[0];
      acc[q][1] += sa1 * sw * sums[1];
      acc[q][2] += sa0 * sw * sums[2];
      acc[q][3] += sa1 * sw * sums[3];
    }
    if (kb == k_blocks - 1) {  // the entry's rows are done: bf16, as expert_out would hold them
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int col = q * kPassRows + 2 * t;
        if (col < en.rows) {
          strip[(en.row0 + col) * kChannels + g] = round_to_bf16(acc[q][0]);
          strip[(en.row0 + col) * kChannels + g + 8] = round_to_bf16(acc[q][2]);
        }
        if (col + 1 < en.rows) {
          strip[(en.row0 + col + 1) * kChannels + g] = round_to_bf16(acc[q][1]);
          strip[(en.row0 + col + 1) * kChannels + g + 8] = round_to_bf16(acc[q][3]);
        }
      }
    }
  };

  // Four (entry, K block) items in flight per warp, across entry boundaries.
  constexpr int kStages = 4;
  Gemm2Stage ring[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s)
    if (s < items) load(s, ring[s]);
  for (int base = 0; base < items; base += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int item = base + s;
      if (item >= items) break;
      compute(item, ring[s]);
      if (item + kStages < items) load(item + kStages, ring[s]);
    }
  }
  __syncthreads();

  // Each token's slots in order, as finalize adds them: f32, product rounded, then the sum.
  for (int u = int(threadIdx.x); u < p.tokens * 2; u += int(blockDim.x)) {
    const int token = u / 2, half = u % 2;
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int j = 0; j < p.top_k; ++j) {
      const int row = __ldg(p.slot_rows + std::size_t(token) * p.top_k + j);
      if (row < 0) continue;
      const float w = p.topk_weights ? __ldg(p.topk_weights + std::size_t(token) * p.top_k + j) : 1.0f;
      const float* x = strip + row * kChannels + half * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] = __fadd_rn(sum[i], p.topk_weights ? __fmul_rn(w, x[i]) : x[i]);
    }
    *reinterpret_cast<uint4*>(p.out + std::size_t(token) * p.hidden + n0 + half * 8) = pack_bf16x8(sum);
  }
}

}  // namespace moekit::cuda::min_latency
