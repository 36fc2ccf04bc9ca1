// moekit's FP8 grouped GEMM on Hopper: TMA + WGMMA, warp-specialized, for the
// contiguous layout (fp8_block and fp8_channel). Instances: sm90_grouped_gemm_fp8_wgmma.cu
// (kSumK = 32) and sm90_grouped_gemm_fp8_wgmma_k128.cu (kSumK = 128).
// kSumK is how much of K the tensor core sums before the f32 promotion times the block scales:
//   128  four WGMMAs of 32 chained per 128-K block, one promotion: DeepSeek-V3's recipe, what
//        DeepGEMM and CUTLASS's blockwise mainloop compute (DESIGN §8 `fast`, the default)
//   32   every WGMMA from zero and promoted at once (`exact`): closer to the CPU's f32 sums (the
//        FP8 tensor core keeps about 13 bits), an FFMA per accumulator per 32 of K
// Steps:
//   1. block b takes tiles b, b + grid, ... of the (group, row tile, 128-column tile) walk of
//      sm90_wgmma.cuh (row tiles fastest, so the tiles that share a W tile run side by side);
//      every warp finds its tile itself. run launches a block per tile; a block given several
//      keeps its ring running across them. Row tiles of 192 (3 consumer warpgroups; on a group's
//      last tile those without rows skip it, so tiles fit a group's rows to 64), 128 (2
//      warpgroups) or 64 (2 warpgroups of 64 columns)
//   2. warp 0 (producer): per 128 of K, TMA of the A tile (rows x 128) and the 128x128 W tile into
//      a ring of stages
//   3. consumer warpgroups (the producer's registers go to them): 64 rows x kCols columns each;
//      per stage the WGMMAs, then acc += (a_scale * w_scale) * part (block scales, which each
//      thread loads from global memory one or two K blocks ahead) or acc += part (channel scales
//      enter at the store, as the CPU applies them); the stage goes back once its WGMMAs are done.
//      kSumK = 32 with two part buffers: the next WGMMA runs while one is added
//   4. bf16 out for the rows of the group that carry data (counts); nothing else is written
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_wgmma {

using namespace wgmma;

constexpr int kPipelineBytes = 224 * 1024;  // 192-row tiles: 5 stages, 128: 7, 64: 9

// A tile of kRows rows: the consumer warpgroups, what each takes, and the stages that fit.
template <int kRows, int kSumK>
struct Shape {
  static_assert(kRows == 192 || kRows == 128 || kRows == 64, "row tiles of 192, 128 or 64");
  static_assert(kSumK == 32 || kSumK == 128, "f32 promotion every 32 or every 128 of K");
  static constexpr int kConsumers = kRows == 192 ? 3 : 2;
  static constexpr int kThreads = (1 + kConsumers) * 128;
  static constexpr int kWarpgroupCols = kRows == 64 ? 64 : 128;  // the WGMMA's N
  // Registers after setmaxnreg: the producer's go to the consumers. Three consumers have room
  // for one part buffer, two for two.
  static constexpr int kProducerRegisters = kConsumers == 3 ? 32 : 40;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : 232;
  static constexpr bool kTwoParts = kConsumers == 2 && kSumK == 32;
  static constexpr int kTileABytes = kRows * kTileK;
  static constexpr int kStageBytes = kTileABytes + kTileN * kTileK;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  // The 1024-byte alignment, the tiles, then the barriers (the ring's scale slots stay unused: the
  // consumers load their scales themselves).
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of an H200 block");
  // Where warpgroup c's part of the tile starts.
  static constexpr int row_of(int c) { return kRows == 64 ? 0 : c * 64; }
  static constexpr int col_of(int c) { return kRows == 64 ? c * 64 : 0; }
  // The consumers with rows to compute in a tile whose rows [m0, m0 + kRows) hold rows - m0 of the
  // group's; the others skip the tile (the busy ones then have the tensor core to themselves).
  static __device__ int busy(int m0, int rows) {
    return kRows == 64 ? kConsumers : min(kConsumers, (rows - m0 + 63) / 64);
  }
};

template <bool kChannel, int kRows, int kSumK>
__global__ void __launch_bounds__(Shape<kRows, kSumK>::kThreads, 1)
    fp8_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p) {
  using S = Shape<kRows, kSumK>;
  constexpr int kStageBytes = S::kStageBytes, kCols = S::kWarpgroupCols;
  // ---- shared memory and barriers: full waits for the TMA's bytes alone; empty counts every
  // consumer thread (each arrives after its own reads of a stage, also in a tile it skips)
  extern __shared__ std::uint8_t smem_raw[];
  Tile* unused = nullptr;
  const Ring ring = ring_layout<kRows>(smem_raw, S::kStages, kStageBytes, 0, unused);
  if (threadIdx.x == 0) init_ring(ring, false, S::kConsumers * 128);
  __syncthreads();
  const int k_blocks = (p.k + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);

  // ---- producer
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegisters));
    if (threadIdx.x >= 32) return;
    int position = 0;
    Tile t;
    for (int index = int(blockIdx.x); find_tile<kRows>(p, index, t); index += int(gridDim.x))
      produce<false, kRows>(map_a, map_w, p, t, ring, position);
    return;
  }

  // ---- consumers: c takes 64 rows x kCols columns of a tile from (row_of(c), col_of(c)); this
  // thread holds rows lo and lo + 8, and of each 8 columns the two at 2 * (lane % 4)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegisters));
  const int c = warpgroup - 1, warp = int(threadIdx.x / 32) % 4;
  const int local = S::row_of(c) + warp * 16 + lane / 4;  // row lo within the tile
  constexpr int kRegs = kCols / 2;
  // part[i], acc[i]: row lo (i % 4 < 2) or lo + 8, column 8 (i / 4) + 2 (lane % 4) + i % 2
  float acc[kRegs], part0[kRegs], part1[kRegs];
  // The WGMMA descriptors of this warpgroup's A rows and W columns in stage 0; stage s is
  // kStageBytes / 16 further, K step j 32 / 16 (the descriptor counts 16-byte units).
  const std::uint64_t desc_a0 = smem_descriptor(ring.tiles + std::uint32_t(S::row_of(c) * kTileK));
  const std::uint64_t desc_b0 = smem_descriptor(ring.tiles + std::uint32_t(S::kTileABytes + S::col_of(c) * kTileK));
  auto issue = [&](float(&part)[kRegs], std::uint64_t da, std::uint64_t db, int j, int accumulate) {
    fp8_wgmma_k32<kCols>(part, da + 2 * j, db + 2 * j, accumulate);
  };
  auto wait = [](int pending) {
    if (pending == 0) asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    else asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  };
  // acc += scale * part, once part's WGMMAs are done.
  auto add = [&](float(&part)[kRegs], float s_lo, float s_hi) {
    pin(part);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] += kChannel ? part[i] : (i % 4 < 2 ? s_lo : s_hi) * part[i];
  };
  auto fence = [] { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); };
  auto commit = [] { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); };

  // A K block's block scales for this thread: its rows' A scales and the tile's W scale, loaded
  // from global memory kAhead K blocks before their use (with 2, even and odd blocks in their own
  // registers, so that no load is waited for early; the slower 32-K blocks hide a load in one, and
  // three warpgroups have no registers for more); channel scales enter at the store.
  constexpr int kAhead = kSumK == 128 ? 2 : 1;
  struct BlockScales {
    float a_lo = 0.0f, a_hi = 0.0f, w = 0.0f;
  };
  int position = 0;
  Tile t;
  for (int index = int(blockIdx.x); find_tile<kRows>(p, index, t); index += int(gridDim.x)) {
    RingSlot slot = ring_slot(ring, position);  // of the tile's first K block, then the next ones
    position += k_blocks;
    auto next_slot = [&] {
      if (++slot.stage == S::kStages) slot.stage = 0, slot.parity ^= 1;
    };
    if (c >= S::busy(t.m0, t.rows)) {  // no rows here: hand the stages back as they fill
      for (int kb = 0; kb < k_blocks; ++kb, next_slot()) {
        barrier_wait(ring.full + 8 * slot.stage, slot.parity);
        barrier_arrive(ring.empty + 8 * slot.stage);
      }
      continue;
    }
    const float* w_scale = tile_w_scales<false>(p, t);
    const float* a_scale = p.a_scales + std::size_t(t.row0) * k_blocks + t.m0 + local;
    const bool lo_valid = t.m0 + local < t.padded, hi_valid = t.m0 + local + 8 < t.padded;
    auto fetch = [&](int kb, BlockScales& into) {
      if (kChannel || kb >= k_blocks) return;
      const std::size_t at = std::size_t(kb) * t.padded;
      into.w = __ldg(w_scale + std::size_t(kb) * n_blocks);
      into.a_lo = lo_valid ? __ldg(a_scale + at) : 0.0f;  // rows past the group's: another group's
      into.a_hi = hi_valid ? __ldg(a_scale + at + 8) : 0.0f;
    };
    // Block kb from its stage into acc; the stage goes back as soon as its WGMMAs are done; then
    // the scale registers take block kb + kAhead's.
    auto block = [&](int kb, BlockScales& scales) {
      const int s = slot.stage;
      barrier_wait(ring.full + 8 * s, slot.parity);
      const std::uint64_t da = desc_a0 + std::uint64_t(s) * (kStageBytes / 16);
      const std::uint64_t db = desc_b0 + std::uint64_t(s) * (kStageBytes / 16);
      const std::uint32_t empty = ring.empty + 8 * s;
      // the scales are needed once the first WGMMAs are on their way (not before: their loads
      // may still be in flight)
      float s_lo = 1.0f, s_hi = 1.0f;
      auto scale = [&] {
        asm volatile("" : "+f"(scales.a_lo), "+f"(scales.a_hi), "+f"(scales.w));
        s_lo = scales.a_lo * scales.w;
        s_hi = scales.a_hi * scales.w;
      };
      if constexpr (kSumK == 128) {
        pin(part0);
        fence();
#pragma unroll
        for (int j = 0; j < kTileK / 32; ++j) issue(part0, da, db, j, j > 0);
        commit();
        scale();
        wait(0);
        barrier_arrive(empty);  // every thread, after its WGMMAs read the stage
        add(part0, s_lo, s_hi);
      } else if constexpr (S::kTwoParts) {
        pin(part0);
        fence();
        issue(part0, da, db, 0, 0);
        commit();
        pin(part1);
        fence();
        issue(part1, da, db, 1, 0);
        commit();
        scale();
        wait(1);
        add(part0, s_lo, s_hi);
        fence();
        issue(part0, da, db, 2, 0);
        commit();
        wait(1);
        add(part1, s_lo, s_hi);
        fence();
        issue(part1, da, db, 3, 0);
        commit();
        wait(1);
        add(part0, s_lo, s_hi);
        wait(0);
        barrier_arrive(empty);
        add(part1, s_lo, s_hi);
      } else {
#pragma unroll
        for (int j = 0; j < kTileK / 32; ++j) {
          pin(part0);
          fence();
          issue(part0, da, db, j, 0);
          commit();
          if (j == 0) scale();
          wait(0);
          if (j == kTileK / 32 - 1) barrier_arrive(empty);
          add(part0, s_lo, s_hi);
        }
      }
      fetch(kb + kAhead, scales);
      next_slot();
    };
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] = part0[i] = part1[i] = 0.0f;
    BlockScales even, odd;
    BlockScales& second = kAhead == 2 ? odd : even;
    fetch(0, even);
    if (kAhead == 2) fetch(1, odd);
    int kb = 0;
    for (; kb + 1 < k_blocks; kb += 2) {
      block(kb, even);
      block(kb + 1, second);
    }
    if (kb < k_blocks) block(kb, even);
    const int lo = t.m0 + local;  // and lo + 8
    store_bf16<kChannel, kCols>(p, t, acc, lo, t.n0 + S::col_of(c) + 2 * (lane % 4), row_scales<kChannel>(p, t, lo));
  }
}

// A block per tile that may have rows. The kernel walks tiles b, b + grid, ... so one block per
// SM could take them all, but on the layer's routing the hardware's block scheduler balances the
// uneven tiles (1 to 3 busy warpgroups) better: deepseek-v3 T=4096 exact 6855 against 7117 us,
// llama4-scout T=4096 1416 against 1670 (docs/PERF.md).
template <bool kChannel, int kRows, int kSumK>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kRows, kSumK>;
  const TileLaunch l = tile_launch(desc, args, kRows);
  if (l.blocks == 0) return;
  allow_dynamic_shared(reinterpret_cast<const void*>(&fp8_wgmma<kChannel, kRows, kSumK>), S::kSmemBytes);
  fp8_wgmma<kChannel, kRows, kSumK><<<l.blocks, S::kThreads, S::kSmemBytes, stream>>>(l.map_a, l.map_w, l.params);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_wgmma");
}

}  // namespace moekit::cuda::sm90::fp8_wgmma
