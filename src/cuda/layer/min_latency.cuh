// The min-latency layer's kernels (bf16 weights and rows), after the input's preparation and the
// one-block permutation plan (permute::run_prepared, one launch):
//   gemm1_activation  block (slice, entry): 16 columns of the activation (16 gate and 16 up rows
//                     of w13) for a work entry's rows (<= 32 of one expert), K split over its 4
//                     warps; A rows read by token from the prepared input (no gather); f32 sums ->
//                     bf16 (GEMM1's output) -> activation in f32 -> bf16 act
//   gemm2_combine     block (16 channels of H): every work entry's rows for those channels, a warp
//                     per entry, all of K; then each token's k rows summed in slot order (finalize's
//                     arithmetic), written to the output: no expert_out, no finalize kernel
// Both stream 16-row weight strips with mma.sync m16n8k16 (warp_mma.cuh), weights from every SM
// at once, and are launched as programmatic dependents: gemm2_combine prefetches its weights into
// L2 while gemm1_activation finishes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/gemm/warp_mma.cuh"
#include "cuda/permute/plan.cuh"
#include "moekit/config.h"

namespace moekit::cuda::min_latency {

constexpr int kChannels = 16;  // weight rows per strip: the MMA's M
constexpr int kPassRows = 8;   // rows per MMA: its N
constexpr int kEntryRows = 32;  // rows of a work entry (the plan cuts larger experts)
constexpr int kPasses = kEntryRows / kPassRows;
constexpr int kGemm1Warps = 4;
constexpr int kGemm2Warps = 8;

struct Params {
  // The plan (contiguous, alignment 1: rows are the slots that hit a local expert).
  const std::int32_t* work;       // [1 + 3 entries]: n, then (expert, first row, rows)
  const std::int32_t* row_token;  // [rows]
  const std::int32_t* slot_rows;  // [T, k]
  const float* topk_weights;      // [T, k], null when the weights went on the input
  // bf16 values, addressed by byte: 128-byte K blocks of 64 values
  const std::uint8_t* x;          // [T, H] the prepared tokens
  const std::uint8_t* w13;        // [E_local, W, H]
  std::uint8_t* act;              // [rows, I]: the activation, GEMM2's input
  const std::uint8_t* w2;         // [E_local, H, I]
  std::uint16_t* out;             // [T, H] bf16
  int tokens, top_k, hidden, inter;
  float alpha, limit;
};

struct Entry {
  int expert, row0, rows;
};

__device__ __forceinline__ Entry entry(const Params& p, int j) {
  const std::int32_t* w = p.work + 1 + 3 * j;
  return {w[0], w[1], w[2]};
}

// ---- a warp's ring of K blocks in shared memory ------------------------------------------
// Each stage holds one 128-byte K block: kStrips 16-row weight strips and the first 8 activation
// rows, copied by the warp's own lanes with cp.async (16-byte copies through L2, no registers held
// while in flight), kStages - 1 blocks ahead of the MMAs. A 128-byte row
// is 8 chunks of 16; chunk c of row r sits at chunk c ^ 4 (r & 1), so that the 8 lanes of a
// shared-memory phase (rows g, g + 1; chunks t, or t + 4) hit distinct banks.

template <int kStrips>
struct Ring {
  static constexpr int kStrip = kChannels * 128;
  static constexpr int kRows = kStrips * kStrip;  // the x rows' offset in a stage
  static constexpr int kStage = kRows + kPassRows * 128;
};

__device__ __forceinline__ int swizzled(int row, int chunk) { return row * 128 + ((chunk ^ ((row & 1) << 2)) << 4); }

__device__ __forceinline__ void copy16(std::uint8_t* shared, const void* global, bool valid) {
  const unsigned at = unsigned(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(global), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }

// One strip's K block (16 rows of `stride` bytes from `rows`) into a stage: 4 chunks per lane.
__device__ __forceinline__ void copy_strip(std::uint8_t* stage, const std::uint8_t* rows, std::size_t stride, int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int id = lane + 32 * j, row = id / 8, chunk = id % 8;
    copy16(stage + swizzled(row, chunk), rows + row * stride + chunk * 16, true);
  }
}

__device__ __forceinline__ uint4 load_shared(const std::uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// This lane's MMA operands of a stage's strip (rows g, g + 8) or x rows (row g).
__device__ __forceinline__ void strip_operand(const std::uint8_t* strip, int g, int t, uint4 (&lo)[2], uint4 (&hi)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lo[h] = load_shared(strip + swizzled(g, h * 4 + t));
    hi[h] = load_shared(strip + swizzled(g + 8, h * 4 + t));
  }
}
__device__ __forceinline__ void rows_operand(const std::uint8_t* rows, int g, int t, uint4 (&x)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) x[h] = load_shared(rows + swizzled(g, h * 4 + t));
}
// The same operand of a row past the first 8, from global memory (`row` at its K block; null:
// a row past the entry's, zeros).
__device__ __forceinline__ void row_operand(const std::uint8_t* row, int t, uint4 (&x)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) x[h] = row ? __ldg(reinterpret_cast<const uint4*>(row + h * 64 + t * 16)) : make_uint4(0, 0, 0, 0);
}

// Runs items [0, n) through a warp's ring: load(i, stage) issues item i's copies, compute(i,
// stage) consumes them.
template <int kStages, int kStageBytes, class Load, class Compute>
__device__ __forceinline__ void stream_items(std::uint8_t* ring, int n, Load&& load, Compute&& compute) {
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n) load(i, ring + i * kStageBytes);
    commit_copies();
  }
  int fill = kStages - 1, use = 0;  // the stages item i + kStages - 1 fills and item i uses
  for (int i = 0; i < n; ++i) {
    if (i + kStages - 1 < n) load(i + kStages - 1, ring + fill * kStageBytes);
    commit_copies();
    wait_copies<kStages - 1>();
    __syncwarp();
    compute(i, ring + use * kStageBytes);
    __syncwarp();  // the stage is refilled by the next iteration's copies
    fill = fill + 1 == kStages ? 0 : fill + 1;
    use = use + 1 == kStages ? 0 : use + 1;
  }
}

// ---- GEMM1 + activation + requantization -------------------------------------------------

constexpr int kGemm1Stages = 3;

// The warps' partial sums, [warp][strip][pass][lane][4] f32, once the rings are drained.
template <int kStrips>
constexpr std::size_t gemm1_partial_bytes() {
  return std::size_t(kGemm1Warps) * kStrips * kPasses * 32 * 4 * sizeof(float);
}

template <Activation kAct>
constexpr std::size_t gemm1_shared() {
  constexpr int kStrips = kAct != Activation::relu2 ? 2 : 1;
  const std::size_t rings = std::size_t(kGemm1Warps) * kGemm1Stages * Ring<kStrips>::kStage;
  return rings > gemm1_partial_bytes<kStrips>() ? rings : gemm1_partial_bytes<kStrips>();
}

// Dynamic shared memory: gemm1_shared<kAct>(), each warp's ring, then the partial sums in the
// same bytes. Three blocks per SM (12 warps), so that more warps keep the loads flowing.
template <Activation kAct>
__global__ void __launch_bounds__(kGemm1Warps * 32, 3) gemm1_activation(Params p) {
  constexpr bool kGated = kAct != Activation::relu2;
  constexpr int kElement = 2;  // bytes per value
  constexpr int kStrips = kGated ? 2 : 1;
  using R = Ring<kStrips>;
  extern __shared__ float4 shared4[];
  auto partial = reinterpret_cast<float (*)[kStrips][kPasses][32][4]>(shared4);
  __shared__ int token[kEntryRows];
  grid_dependency_wait();
  if (int(blockIdx.y) >= p.work[0]) return;
  const Entry en = entry(p, int(blockIdx.y));
  launch_dependents();
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  std::uint8_t* ring = reinterpret_cast<std::uint8_t*>(shared4) + std::size_t(warp) * kGemm1Stages * R::kStage;
  const int c0 = int(blockIdx.x) * kChannels;  // activation columns [c0, c0 + 16)
  const int width = kGated ? 2 * p.inter : p.inter;
  const int k_blocks = p.hidden * kElement / 128;  // 128-byte K blocks of 64 values
  const std::size_t row_bytes = std::size_t(p.hidden) * kElement;
  if (threadIdx.x < kEntryRows) token[threadIdx.x] = int(threadIdx.x) < en.rows ? p.row_token[en.row0 + threadIdx.x] : 0;
  __syncthreads();

  const std::uint8_t* gate = p.w13 + (std::size_t(en.expert) * width + c0) * row_bytes;
  const std::uint8_t* up = gate + std::size_t(p.inter) * row_bytes;
  const int passes = (en.rows + kPassRows - 1) / kPassRows;  // warp-uniform, <= kPasses
  // This warp's K blocks.
  const int per_warp = (k_blocks + kGemm1Warps - 1) / kGemm1Warps;
  const int kb0 = min(warp * per_warp, k_blocks), kb1 = min(kb0 + per_warp, k_blocks);

  auto x_row = [&](int row, int kb) {  // row `row` of the entry at K block kb
    return p.x + std::size_t(token[row]) * row_bytes + std::size_t(kb) * 128;
  };
  auto load = [&](int i, std::uint8_t* stage) {
    const int kb = kb0 + i;
    copy_strip(stage, gate + std::size_t(kb) * 128, row_bytes, lane);
    if (kGated) copy_strip(stage + R::kStrip, up + std::size_t(kb) * 128, row_bytes, lane);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int id = lane + 32 * j, row = id / 8, chunk = id % 8;
      const bool valid = row < en.rows;
      copy16(stage + R::kRows + swizzled(row, chunk), valid ? x_row(row, kb) + chunk * 16 : p.x, valid);
    }
  };

  float acc[kStrips][kPasses][4];
#pragma unroll
  for (int s = 0; s < kStrips; ++s)
#pragma unroll
    for (int q = 0; q < kPasses; ++q)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[s][q][i] = 0.0f;

  auto compute = [&](int i, const std::uint8_t* stage) {
    const int kb = kb0 + i;
    uint4 gate_lo[2], gate_hi[2], up_lo[2], up_hi[2];
    strip_operand(stage, g, t, gate_lo, gate_hi);
    if (kGated) strip_operand(stage + R::kStrip, g, t, up_lo, up_hi);
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      if (q >= passes) break;
      uint4 x[2];
      if (q == 0) rows_operand(stage + R::kRows, g, t, x);
      else row_operand(q * kPassRows + g < en.rows ? x_row(q * kPassRows + g, kb) : nullptr, t, x);
      float sums[4];
      mma_block<false>(gate_lo, gate_hi, x, sums);
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[0][q][v] += sums[v];
      if (kGated) {
        mma_block<false>(up_lo, up_hi, x, sums);
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[kStrips - 1][q][v] += sums[v];
      }
    }
  };
  stream_items<kGemm1Stages, R::kStage>(ring, kb1 - kb0, load, compute);
  wait_copies<0>();
  __syncthreads();  // every ring drained: the partial sums take their bytes

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
    if (r < en.rows)  // GEMM2's input: the bf16 activation
      *reinterpret_cast<uint4*>(reinterpret_cast<std::uint16_t*>(p.act) + std::size_t(en.row0 + r) * p.inter + c0 + 8 * c) =
          pack_bf16x8(out);
  }
}

// ---- GEMM2 + combine ----------------------------------------------------------------------

constexpr int kGemm2Stages = 4;
// Bytes of W2 the blocks together fetch into L2 ahead of GEMM1's end (more would evict itself).
constexpr std::size_t kPrefetchBudget = std::size_t(16) << 20;

// Dynamic shared memory: the warps' rings, the work list [3 max_entries] ints, then [rows][16]
// f32: the bf16-rounded GEMM2 outputs of this channel strip.
constexpr std::size_t gemm2_ring_bytes() { return std::size_t(kGemm2Warps) * kGemm2Stages * Ring<1>::kStage; }

// Two blocks per SM (16 warps), as gemm1_activation.
__global__ void __launch_bounds__(kGemm2Warps * 32, 2) gemm2_combine(Params p, int max_entries) {
  using R = Ring<1>;
  constexpr int kElement = 2;
  extern __shared__ float4 shared4[];
  std::uint8_t* base = reinterpret_cast<std::uint8_t*>(shared4);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  std::uint8_t* ring = base + std::size_t(warp) * kGemm2Stages * R::kStage;
  int* work = reinterpret_cast<int*>(base + gemm2_ring_bytes());
  float* strip = reinterpret_cast<float*>(work + 3 * ((max_entries + 3) / 4 * 4));
  const int n0 = int(blockIdx.x) * kChannels;
  const int k_blocks = p.inter * kElement / 128;
  const std::size_t row_bytes = std::size_t(p.inter) * kElement;
  // The plan finished before gemm1_activation let this grid launch: its work list can be read
  // now, and the first weight strips fetched into L2 while GEMM1 ends (within the budget).
  const int entries = p.work[0];
  for (int i = int(threadIdx.x); i < 3 * entries; i += int(blockDim.x)) work[i] = p.work[1 + i];
  const std::size_t strip_bytes = kChannels * row_bytes;
  const int prefetched = int(kPrefetchBudget / (strip_bytes * gridDim.x));
  if (warp < min(entries, prefetched) && lane == 0) {
    const Entry en = entry(p, warp);
    const std::uint8_t* w = p.w2 + (std::size_t(en.expert) * p.hidden + n0) * row_bytes;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w), "r"(unsigned(strip_bytes)) : "memory");
  }
  __syncthreads();
  grid_dependency_wait();
  auto entry_of = [&](int local) {  // this warp's local-th entry
    const int* w = work + 3 * (warp + local * kGemm2Warps);
    return Entry{w[0], w[1], w[2]};
  };

  const int mine = entries > warp ? (entries - warp - 1) / kGemm2Warps + 1 : 0;
  const int items = mine * k_blocks;  // (entry, K block), entry-major
  // Items arrive in order at each lambda: (entry, K block) advance as counters, no division.
  int load_entry = 0, load_kb = 0;
  Entry e = mine > 0 ? entry_of(0) : Entry{0, 0, 0};
  auto load = [&](int, std::uint8_t* stage) {
    const int kb = load_kb;
    copy_strip(stage, p.w2 + (std::size_t(e.expert) * p.hidden + n0) * row_bytes + std::size_t(kb) * 128, row_bytes, lane);
    const std::uint8_t* x = p.act + std::size_t(e.row0) * row_bytes + std::size_t(kb) * 128;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int id = lane + 32 * j, row = id / 8, chunk = id % 8;
      const bool valid = row < e.rows;
      copy16(stage + R::kRows + swizzled(row, chunk), valid ? x + row * row_bytes + chunk * 16 : p.act, valid);
    }
    if (++load_kb == k_blocks) {
      load_kb = 0;
      if (++load_entry < mine) e = entry_of(load_entry);
    }
  };
  Entry en{0, 0, 0};
  float acc[kPasses][4];
  int compute_entry = 0, compute_kb = 0;
  auto compute = [&](int, const std::uint8_t* stage) {
    const int kb = compute_kb;
    if (++compute_kb == k_blocks) compute_kb = 0;
    if (kb == 0) {
      en = entry_of(compute_entry++);
#pragma unroll
      for (int q = 0; q < kPasses; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[q][i] = 0.0f;
    }
    const int passes = (en.rows + kPassRows - 1) / kPassRows;
    uint4 w_lo[2], w_hi[2];
    strip_operand(stage, g, t, w_lo, w_hi);
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      if (q >= passes) break;
      uint4 x[2];
      const int row = q * kPassRows + g;
      if (q == 0) rows_operand(stage + R::kRows, g, t, x);
      else row_operand(row < en.rows ? p.act + std::size_t(en.row0 + row) * row_bytes + std::size_t(kb) * 128 : nullptr, t, x);
      float sums[4];
      mma_block<false>(w_lo, w_hi, x, sums);
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[q][v] += sums[v];
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
  stream_items<kGemm2Stages, R::kStage>(ring, items, load, compute);
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
