// moekit's FP8 block-scaled grouped GEMM for prefill (fp8_block: 1x128 A scales, 128x128 W scales),
// contiguous layout, problem sizes on the GPU. Instances: sm90_grouped_gemm_fp8_block_n{128,160,192}.cu,
// sm90_grouped_gemm_fp8_block_act.cu (f32 promotion every 128 of K, kSumK 128: DESIGN §8 `fast`) and
// sm90_grouped_gemm_fp8_block_k32.cu (kSumK 32, 128 columns: `exact`, GEMM1 requantized next). Tiles:
//   kN 128-192    128 rows x kN W rows of the group, bf16 out (a 160- or 192-wide W tile straddles
//                 two scale blocks: two W scales per K block)
//   kN 256, kAct  GEMM1 + activation + requantization (activated_fp8): 128 rows x 128 output channels
//                 [n0, n0 + 128), whose gate rows [n0, n0 + 128) and up rows [I + n0, ...) of W come
//                 as two boxes; each warpgroup's rows then hold a whole 128-channel scale block, which
//                 it activates and quantizes (1x128) in registers: FP8 rows and their scales in GEMM2's
//                 layout, no bf16 GEMM1 output and no activation pass
// Steps:
//   1. every block builds the tile table in shared memory: per group its tiles, ceil(rows / 128) x
//      ceil(N / kN), as a running sum; tile i of the walk is found by binary search in it. Row tiles
//      run fastest within a group, so the tiles that share a W tile are neighbours in the walk
//   2. persistent: one block per SM takes tiles b, b + grid, ...; its ring of stages runs on across
//      its tiles, so the next tile's loads overlap this tile's last K blocks and its epilogue
//   3. one producer thread: per 128 of K, TMA of the A tile (128 x 128), the W tile (kN x 128), the
//      128 rows' A scales and the tile's W scales (1-D tensor maps over the scale arrays, boxes from
//      the 16-byte boundary below, zeros past the end), all completing on the stage's full barrier;
//      the tile itself goes to a slot the consumers read. In clusters of two (neighbouring row tiles
//      of one column tile) each block loads half of the W tile into both blocks (TMA multicast)
//   4. two math warpgroups of 64 rows: per stage four WGMMAs m64 n kN k32 chained, then
//      acc += part x a_scale x w_scale (the W scale of the part's columns); the stage goes back once
//      the WGMMAs are done. kN 128: two part buffers, the next stage's WGMMAs run while this one's
//      part is promoted; kSumK 32: each of the four WGMMAs from zero, promoted alone, the parts
//      taking turns by WGMMA. A warpgroup with no rows in the tile (a group's last, short tile) skips it
//   5. out (sm90_grouped_gemm_fp8_block_epilogue.cuh) for the rows of the group that carry data
//      (counts): bf16 through two per-warp staging buffers (stmatrix, then TMA bulk stores, or 16-byte
//      stores of whole rows' sectors), or the activated FP8 rows and their scales (GEMM1's outputs rounded to bf16 first,
//      as the activation stage reads them); nothing else is written
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/log.h"
#include "cuda/activation/activate.cuh"
#include "cuda/common/launch.h"
#include "cuda/gemm/sm90_grouped_gemm_fp8_block_epilogue.cuh"
#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_block {

using namespace wgmma;

constexpr int kRows = 128;                   // a tile's rows: two math warpgroups of 64
constexpr int kMath = 2;                     // math warpgroups
constexpr int kThreads = (kMath + 1) * 128;  // and the producer warpgroup
constexpr int kMaxGroups = 1024;             // the tile table's entries in shared memory
constexpr int kTileSlots = 8;                // tiles the producer may run ahead (> stages)
constexpr int kProducerRegisters = 40;
constexpr int kMathRegisters = 232;
// Scale boxes (TMA boxes start 16 bytes aligned: 4 floats early at most): a tile's 128 A scales, and
// a W scale block with the next (a 192-wide tile's second).
constexpr int kAScaleBox = kRows + 4, kAScaleSlot = 160, kWScaleBox = 8;

template <int kN>
struct Shape {
  static_assert(kN == 128 || kN == 160 || kN == 192 || kN == 256, "column tiles of 128, 160, 192, or 256 (gate and up)");
  static constexpr bool kPaired = kN == 256;              // gate and up halves of 128
  static constexpr int kOutCols = kPaired ? 128 : kN;     // output columns of a tile
  static constexpr int kWgmmaN = kPaired ? 128 : kN;      // one WGMMA's N
  static constexpr int kABytes = kRows * kTileK;
  static constexpr int kStageBytes = kABytes + kN * kTileK;  // whole 1024-byte swizzle atoms
  static constexpr int kStages = kN == 256 ? 4 : kN > 128 ? 5 : 6;
  static_assert(kTileSlots > kStages, "a tile slot is rewritten only after its first stage came back");
  // Shared memory after the 1024-byte alignment: the stages' tiles, their A scales [stages][160] (a
  // box of kAScaleBox) and W scales [stages][2][32] (boxes of kWScaleBox in 128-byte slots: the
  // tile's, and the up half's), the math warps' bf16 staging [8][2][16 rows x 64 bytes] (1024-byte
  // aligned: TMA's swizzle follows the address), the full and empty barriers, the tile slots, the
  // tile table.
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kWScalesOffset = kScalesOffset + kStages * kAScaleSlot * 4;
  static constexpr int kStagingOffset = (kWScalesOffset + kStages * 2 * 128 + 1023) / 1024 * 1024;
  static constexpr int kBarriersOffset = kStagingOffset + kMath * 4 * 2 * kStagingBytes;
  static constexpr int kSlotsOffset = kBarriersOffset + 2 * kStages * 8;
  static constexpr int kTableOffset = kSlotsOffset + kTileSlots * int(sizeof(Tile));
  static constexpr int kSmemBytes = 1024 + kTableOffset + kMaxGroups * 4;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of an H200 block");
};

// The four chained WGMMAs of one 128-K stage into part (from zero), committed as one group.
template <int kN>
__device__ __forceinline__ void issue_stage(float (&part)[kN / 2], std::uint64_t da, std::uint64_t db) {
  pin(part);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int j = 0; j < kTileK / 32; ++j) fp8_wgmma_k32<kN>(part, da + 2 * j, db + 2 * j, j > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  pin(part);
}

// Waits until at most kPending groups are in flight: part, the older group's, is then readable.
template <int kPending, int kRegs>
__device__ __forceinline__ void wait_stages(float (&part)[kRegs]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
  pin(part);
}

// K through two part buffers taking turns: unit u + 1's WGMMAs run while unit u's part is promoted.
// A unit is kSumK of K, kUnits of them a stage. begin(integral_constant<int, i>, into) issues unit i
// of a run into `into` and returns what finishing it needs (a token: its scales, the stage to hand
// back); finish(from, token) promotes a finished unit (and hands its stage back). Runs of whole
// stages (kRun, then 2, then 1), unrolled, so that no WGMMA is in flight where a branch is taken
// (ptxas serializes them otherwise); a run ends with none in flight.
template <int kIndex, int kLen, typename Parts, typename Token, typename Begin, typename Finish>
__device__ __forceinline__ void two_part_step(Parts& parts, Token (&token)[2], Begin& begin, Finish& finish) {
  constexpr int kBuf = kIndex % 2;
  wait_stages<kIndex + 1 < kLen ? 1 : 0>(parts[kBuf]);
  finish(parts[kBuf], token[kBuf]);
  if constexpr (kIndex + 2 < kLen) token[kBuf] = begin(std::integral_constant<int, kIndex + 2>{}, parts[kBuf]);
}

template <int kLen, typename Parts, typename Begin, typename Finish, int... kI>
__device__ __forceinline__ void two_part_run(Parts& parts, Begin& begin, Finish& finish, std::integer_sequence<int, kI...>) {
  using Token = decltype(begin(std::integral_constant<int, 0>{}, parts[0]));
  Token token[2];
  token[0] = begin(std::integral_constant<int, 0>{}, parts[0]);
  if constexpr (kLen > 1) token[1] = begin(std::integral_constant<int, 1>{}, parts[1]);
  (two_part_step<kI, kLen>(parts, token, begin, finish), ...);
}

template <int kUnits, int kRun, typename Parts, typename Begin, typename Finish>
__device__ __forceinline__ void two_part_loop(int k_blocks, Parts& parts, Begin& begin, Finish& finish) {
  auto run = [&](auto stages) {
    constexpr int kLen = decltype(stages)::value * kUnits;
    two_part_run<kLen>(parts, begin, finish, std::make_integer_sequence<int, kLen>{});
  };
  int left = k_blocks;
#pragma unroll 1
  for (; left >= kRun; left -= kRun) run(std::integral_constant<int, kRun>{});
  if constexpr (kRun > 2) {
    if (left >= 2) {
      run(std::integral_constant<int, 2>{});
      left -= 2;
    }
  }
  if (left == 1) run(std::integral_constant<int, 1>{});
}

// A box of a 1-D tensor map (the scale arrays) at element x into shared memory; completes on bar.
__device__ __forceinline__ void tma_load_1d(std::uint32_t dst, const CUtensorMap* map, int x, std::uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(bar)
               : "memory");
}

// A 2-D box of the tensor map into the same shared address of every block in mask (the cluster's
// ranks), each completing its bytes on its own barrier at bar's address.
__device__ __forceinline__ void tma_load_multicast(std::uint32_t dst, const CUtensorMap* map, int x, int y, std::uint32_t bar,
                                                   std::uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(
          dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(mask)
      : "memory");
}

// The cluster: its blocks (1 when the launch had none), this block's rank, an arrival on the barrier
// at bar's address in block `rank`, and a barrier of all the cluster's threads (release / acquire).
__device__ __forceinline__ int cluster_blocks() {
  std::uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return int(n);
}
__device__ __forceinline__ int cluster_rank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return int(r);
}
// Default (block-scope) release, as CUTLASS's cluster barrier: the stage's WGMMA reads completed at
// wait_group. `.release.cluster` halved the cluster tiles' rate (H200: 533 against 1103 TFLOP/s).
__device__ __forceinline__ void barrier_arrive_in(std::uint32_t bar, int rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The scale arrays as 1-D tensor maps, read in boxes of kAScaleBox and kWScaleBox: each map starts
// at the 16-byte boundary at or before its array, `shift` elements earlier.
struct ScaleMaps {
  CUtensorMap a, w;
  int a_shift, w_shift;
};

// Where a tile's scales are in the maps, K block kb: its 128 rows' A scales from element a + kb *
// a_step, its first W scale block at w + kb * w_step, and (paired) the up half's at w_up + kb * w_step.
// A box starts at the element rounded down to 4; the scale sits at element % 4 of it.
struct ScaleIndex {
  int a, a_step, w, w_up, w_step;
  __device__ int a_at(int kb) const { return a + kb * a_step; }
  __device__ int w_at(int kb) const { return w + kb * w_step; }
  __device__ int up_at(int kb) const { return w_up + kb * w_step; }
};
__device__ __forceinline__ ScaleIndex scale_index(const ScaleMaps& m, const Tile& t, int k_blocks, int n_blocks,
                                                  int inter) {
  const int w = m.w_shift + t.group * k_blocks * n_blocks + t.n0 / kTileN;
  return {m.a_shift + t.row0 * k_blocks + t.m0, t.padded, w, w + inter / kTileN, n_blocks};
}

// The tile walk: table[g] = the tiles of groups 0..g (running sum), built by every block at start.
struct TileTable {
  const int* ends;
  int groups, n_tiles, total;

  // Tile `index` (< total) of the walk, kTileRows rows by kCols output columns. Producer thread only:
  // it reads the group's rows. A cluster of `cluster` blocks walking units of `cluster` neighbouring
  // column tiles (the swapped tiles; the table built with tile_cols kCols x cluster): the block of
  // rank `rank` takes the rank-th of its unit's.
  template <int kTileRows, int kCols>
  __device__ Tile find(const Params& p, int index, int cluster = 1, int rank = 0) const {
    int lo = 0, hi = groups - 1;  // the first group whose running sum passes index
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (ends[mid] > index) hi = mid;
      else lo = mid + 1;
    }
    const int before = lo > 0 ? ends[lo - 1] : 0;
    const int m_tiles = (ends[lo] - before) / n_tiles, u = index - before;
    Tile t;
    t.group = lo;
    t.row0 = __ldg(p.offsets + lo);
    t.padded = __ldg(p.offsets + lo + 1) - t.row0;
    t.rows = p.counts ? __ldg(p.counts + lo) : t.padded;
    t.m0 = u % m_tiles * kTileRows;
    t.n0 = (u / m_tiles * cluster + rank) * kCols;
    return t;
  }

  // The same walk in units of two neighbouring row tiles of one column tile (the table built with
  // tile_rows 2 kTileRows): the block of rank `rank` takes the rank-th row tile of its unit, past the
  // group's rows for the second of an odd count (it computes nothing).
  template <int kTileRows, int kCols>
  __device__ Tile find_rows(const Params& p, int index, int rank) const {
    Tile t = find<kTileRows * 2, kCols>(p, index);
    t.m0 += rank * kTileRows;
    return t;
  }
};

// Tiles of tile_rows rows by tile_cols of out_cols columns. Every thread takes part (two block-wide
// barriers); the total is warp-uniform.
__device__ __forceinline__ TileTable build_table(const Params& p, int tile_rows, int out_cols, int tile_cols, int* table) {
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  for (int g = int(threadIdx.x); g < p.groups; g += kThreads) {
    const int rows = p.counts ? __ldg(p.counts + g) : __ldg(p.offsets + g + 1) - __ldg(p.offsets + g);
    table[g] = (rows + tile_rows - 1) / tile_rows * n_tiles;
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // running sum, 32 groups at a time
    const int lane = int(threadIdx.x);
    int carry = 0;
    for (int base = 0; base < p.groups; base += 32) {
      const int g = base + lane;
      int v = g < p.groups ? table[g] : 0;
#pragma unroll
      for (int step = 1; step < 32; step *= 2) {
        const int u = __shfl_up_sync(~0u, v, step);
        if (lane >= step) v += u;
      }
      if (g < p.groups) table[g] = carry + v;
      carry += __shfl_sync(~0u, v, 31);
    }
  }
  __syncthreads();
  return {table, p.groups, n_tiles, warp_uniform(table[p.groups - 1])};
}

template <int kN, Activation kAct, int kSumK>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_block_gemm(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                   const __grid_constant__ ScaleMaps scale_maps, const __grid_constant__ CUtensorMap map_d, bool bulk_out,
                   Params p, ActOut act) {
  using S = Shape<kN>;
  // ---- shared memory
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  const std::uint32_t tiles = smem_address(smem);
  const float* scale_a = reinterpret_cast<const float*>(smem + S::kScalesOffset);   // [stages][160]
  const float* scale_w = reinterpret_cast<const float*>(smem + S::kWScalesOffset);  // [stages][2][32]
  const std::uint32_t full = smem_address(smem + S::kBarriersOffset), empty = full + 8 * S::kStages;
  Tile* slots = reinterpret_cast<Tile*>(smem + S::kSlotsOffset);
  int* table = reinterpret_cast<int*>(smem + S::kTableOffset);

  // ---- barriers: full takes the producer's arrival with the stage's TMA bytes; empty one per math
  // warp of every block of the cluster (the stage's A comes from both), after its WGMMAs read the stage
  const int cluster = cluster_blocks(), rank = cluster_rank();
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      barrier_init(full + 8 * s, 1);
      barrier_init(empty + 8 * s, kMath * 4 * cluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  // ---- scheduler (synchronizes the block): a cluster walks units of `cluster` row tiles; its
  // blocks' barriers are ready before either arrives on or copies into the other's
  const int out_cols = S::kPaired ? act.inter : p.n;
  const TileTable walk = build_table(p, kRows * cluster, out_cols, S::kOutCols, table);
  if (cluster > 1) cluster_sync();
  const int first = int(blockIdx.x) / cluster, step = int(gridDim.x) / cluster;
  const int k_blocks = (p.k + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);
  auto advance = [&](int& stage, std::uint32_t& parity) {
    if (++stage == S::kStages) stage = 0, parity ^= 1;
  };

  // ---- producer
  if (warpgroup == kMath) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x % 128 != 0) return;
    constexpr int kBytes = S::kStageBytes + (kAScaleBox + (S::kPaired ? 2 : 1) * kWScaleBox) * 4;
    int stage = 0, count = 0;
    std::uint32_t parity = 0;
    for (int index = first; index < walk.total; index += step, ++count) {
      const Tile t = cluster == 1 ? walk.find<kRows, S::kOutCols>(p, index) : walk.find_rows<kRows, S::kOutCols>(p, index, rank);
      slots[count % kTileSlots] = t;
      // The A scales of the tile's 128 rows, [k_blocks, padded] from the group's start (past the
      // group's rows: another group's, or zeros). The W rows: [n0, n0 + kN), or the gate rows
      // [n0, n0 + 128) and the up rows I further; their scale blocks: the first and the next (one
      // box), or the gate's and the up's (two).
      const ScaleIndex at = scale_index(scale_maps, t, k_blocks, n_blocks, act.inter);
      const int w_row = t.group * p.n + t.n0;
      for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
        barrier_wait(empty + 8 * stage, parity ^ 1);
        const std::uint32_t bar = full + 8 * stage;
        barrier_expect_bytes(bar, kBytes);
        const std::uint32_t a = tiles + std::uint32_t(stage * S::kStageBytes);
        tma_load(a, &map_a, kb * kTileK, t.row0 + t.m0, bar);
        if (cluster == 1) {
          tma_load(a + S::kABytes, &map_w, kb * kTileK, w_row, bar);
          if constexpr (S::kPaired) tma_load(a + S::kABytes + kTileN * kTileK, &map_w, kb * kTileK, w_row + act.inter, bar);
        } else if constexpr (S::kPaired) {  // this rank's box, the gate's or the up's, into both blocks
          tma_load_multicast(a + std::uint32_t(S::kABytes + rank * kTileN * kTileK), &map_w, kb * kTileK,
                             w_row + rank * act.inter, bar, 0x3);
        } else {  // this rank's half of the W tile (map_w's boxes are that high), into both blocks
          const int half = kN / 2 * rank;
          tma_load_multicast(a + std::uint32_t(S::kABytes + half * kTileK), &map_w, kb * kTileK, w_row + half, bar, 0x3);
        }
        tma_load_1d(smem_address(scale_a + stage * kAScaleSlot), &scale_maps.a, at.a_at(kb) & ~3, bar);
        const std::uint32_t sw = smem_address(scale_w + stage * 64);
        tma_load_1d(sw, &scale_maps.w, at.w_at(kb) & ~3, bar);
        if constexpr (S::kPaired) tma_load_1d(sw + 128, &scale_maps.w, at.up_at(kb) & ~3, bar);
      }
    }
    // The peer's math warps hand this block's stages back too: stay until the last ones have (its
    // arrivals then land on live barriers).
    if (cluster > 1)
      for (int s = 0; s < S::kStages; ++s, advance(stage, parity)) barrier_wait(empty + 8 * stage, parity ^ 1);
    return;
  }

  // ---- math warpgroups: c takes rows [64 c, 64 c + 64) of a tile; this thread rows lo and lo + 8,
  // and of each 8 columns the two at 2 (lane % 4)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegisters));
  // warp is broadcast from lane 0 (warp_uniform) like the tiles: store_staged branches on it, and a
  // branch ptxas cannot prove warp-uniform puts the K loop's stage indices and WGMMA descriptors of
  // every later tile in per-lane registers (an R2UR per descriptor, a WARPSYNC per branch)
  const int c = warpgroup, warp = warp_uniform(int(threadIdx.x / 32) % 4);
  const int local = c * 64 + warp * 16 + lane / 4;
  std::uint8_t* staging = smem + S::kStagingOffset + (c * 4 + warp) * 2 * kStagingBytes;
  constexpr int kRegs = S::kWgmmaN / 2;
  // part[i], acc[i]: row lo (i % 4 < 2) or lo + 8, column 8 (i / 4) + 2 (lane % 4) + i % 2; paired:
  // acc the gate half, acc_up the up half; kN 128: parts[0] and parts[1] take turns
  constexpr bool kTwoParts = kN == 128;
  static_assert(kSumK == 128 || (kSumK == 32 && kTwoParts), "f32 every 32 of K: the 128-column tiles (two parts)");
  constexpr int kUnits = kTileK / kSumK;      // WGMMA groups per stage, each promoted alone
  constexpr int kRun = kSumK == 128 ? 4 : 2;  // stages per unrolled run (two_part_loop)
  float acc[kRegs], acc_up[S::kPaired ? kRegs : 1], parts[2][kRegs];
  float(&part)[kRegs] = parts[0];
  const std::uint64_t desc_a0 = smem_descriptor(tiles + std::uint32_t(c * 64 * kTileK));
  const std::uint64_t desc_b0 = smem_descriptor(tiles + std::uint32_t(S::kABytes));
  constexpr std::uint64_t kUpHalf = kTileN * kTileK / 16;  // the up half's W rows, in descriptor units
  constexpr std::uint64_t kStageDesc = S::kStageBytes / 16;
  int stage = 0, count = 0;
  std::uint32_t parity = 0;
  // A warp's reads of a stage are done when its lanes pass this; then lane 0 hands the stage back.
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) {
      barrier_arrive(empty + 8 * s);
      if (cluster > 1) barrier_arrive_in(empty + 8 * s, rank ^ 1);
    }
  };
  // A stage's scales (every shared read of the stage before its release): s[h][b] for rows lo (h 0)
  // and lo + 8 (h 1) and the first (b 0) and second W scale block.
  struct Scales {
    float s00, s10, s01, s11;
  };
  auto scales_of = [&](const ScaleIndex& at, int s, int kb) {
    const float* a = scale_a + s * kAScaleSlot + (at.a_at(kb) & 3);
    const float a_lo = a[local], a_hi = a[local + 8];
    const float* w = scale_w + s * 64 + (at.w_at(kb) & 3);
    const float w0 = w[0], w1 = S::kPaired ? scale_w[s * 64 + 32 + (at.up_at(kb) & 3)] : w[1];
    return Scales{a_lo * w0, a_hi * w0, a_lo * w1, a_hi * w1};
  };
  for (int index = first; index < walk.total; index += step, ++count) {
    barrier_wait(full + 8 * stage, parity);  // the tile's first stage: its slot is written
    const Tile t = warp_uniform(slots[count % kTileSlots]);
    // No rows of this warpgroup (a group's short last tile, or a unit's row tile past the group's
    // rows): hand the stages back as they fill
    if (c * 64 >= t.rows - t.m0) {
      for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
        barrier_wait(full + 8 * stage, parity);
        release(stage);
      }
      continue;
    }
    // The columns that take the first W scale block (the rest take the second).
    const int split = S::kPaired ? kTileN : kTileN - t.n0 % kTileN;
    const ScaleIndex at = scale_index(scale_maps, t, k_blocks, n_blocks, act.inter);
    auto k_loop = [&](auto first_cols) {
      constexpr int kFirst = decltype(first_cols)::value;
      auto promote = [&](const float(&from)[kRegs], const Scales& sc) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) {
          const bool first = (i / 4) * 8 < kFirst;
          acc[i] += from[i] * (i % 4 < 2 ? (first ? sc.s00 : sc.s01) : (first ? sc.s10 : sc.s11));
        }
      };
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
      if constexpr (S::kPaired) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) acc_up[i] = 0.0f;
      }
      if constexpr (kTwoParts) {
        struct Token {
          Scales sc;
          int done = -1;  // the stage to hand back once the unit is done (its stage's last), or -1
        };
        Scales stage_sc{};  // the current stage's, read at its first unit
        int kb_next = 0;    // the K block of the next unit's stage
        // (into is auto&: nvcc 13's front end crashes on array-typed parameters of a generic lambda
        // nested in another)
        auto begin = [&](auto unit, auto& into) {
          constexpr int kJ = decltype(unit)::value % kUnits;  // the unit's place in its stage
          if constexpr (kJ == 0) {
            barrier_wait(full + 8 * stage, parity);
            stage_sc = scales_of(at, stage, kb_next);
          }
          const std::uint64_t da = desc_a0 + std::uint64_t(stage) * kStageDesc, db = desc_b0 + std::uint64_t(stage) * kStageDesc;
          if constexpr (kUnits == 1) {
            issue_stage<S::kWgmmaN>(into, da, db);
          } else {
            pin(into);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            fp8_wgmma_k32<S::kWgmmaN>(into, da + 2 * kJ, db + 2 * kJ, 0);
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            pin(into);
          }
          Token token{stage_sc, -1};
          if constexpr (kJ == kUnits - 1) {  // the stage's last unit: it goes back once this is done
            token.done = stage;
            ++kb_next;
            advance(stage, parity);
          }
          return token;
        };
        auto finish = [&](auto& from, const Token& token) {
          if (token.done >= 0) release(token.done);
          promote(from, token.sc);
        };
        two_part_loop<kUnits, kRun>(k_blocks, parts, begin, finish);
      } else {
#pragma unroll 1
        for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
          barrier_wait(full + 8 * stage, parity);
          const Scales sc = scales_of(at, stage, kb);
          issue_stage<S::kWgmmaN>(part, desc_a0 + std::uint64_t(stage) * kStageDesc,
                                  desc_b0 + std::uint64_t(stage) * kStageDesc);
          wait_stages<0>(part);
          if constexpr (S::kPaired) {  // the gate half, then the up half, each promoted with its scale
            promote(part, sc);
            issue_stage<kTileN>(part, desc_a0 + std::uint64_t(stage) * kStageDesc,
                                desc_b0 + std::uint64_t(stage) * kStageDesc + kUpHalf);
            wait_stages<0>(part);
            release(stage);
#pragma unroll
            for (int i = 0; i < kRegs; ++i) acc_up[i] += part[i] * (i % 4 < 2 ? sc.s01 : sc.s11);
          } else {
            release(stage);
            promote(part, sc);
          }
        }
      }
    };
    if (kN == 160 && split == 32) k_loop(std::integral_constant<int, 32>{});
    else if (kN > 128 && split == 64) k_loop(std::integral_constant<int, 64>{});
    else if (kN == 160 && split == 96) k_loop(std::integral_constant<int, 96>{});
    else k_loop(std::integral_constant<int, kTileN>{});
    if constexpr (S::kPaired) store_activated<kAct>(p, act, t, acc, acc_up, t.m0 + local);
    else store_staged<kN>(p, bulk_out ? &map_d : nullptr, t, acc, c * 64 + warp * 16, staging);
  }
  if (!S::kPaired && bulk_out && lane == 0)  // the bulk stores done before the block's shared memory goes
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// elements floats from base as a 1-D tensor map read in boxes of box (zeros past the end); the map
// starts at the 16-byte boundary at or before base, shift elements earlier.
inline CUtensorMap scale_map(const float* base, std::int64_t elements, int box, int& shift) {
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  shift = int(address % 16 / 4);
  CUtensorMap map{};
  const cuuint64_t dims[1] = {cuuint64_t(elements + shift)};
  const cuuint64_t strides[1] = {cuuint64_t(4)};  // not read for one dimension
  const cuuint32_t boxes[1] = {cuuint32_t(box)};
  const cuuint32_t element_strides[1] = {1};
  const CUresult r = encode_function()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1, reinterpret_cast<void*>(address - address % 16),
                                       dims, strides, boxes, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, [&] { return "FP8 block GEMM: scale tensor map failed (" + std::to_string(int(r)) + ")"; });
  return map;
}

// D, rows x n bf16 (n % 8 == 0: 16-byte rows), written in boxes of 16 rows x 32 columns from
// buffers in the 64-byte swizzle (columns past n clipped).
inline CUtensorMap out_map(void* d, std::int64_t rows, std::int64_t n) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(n), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(n * 2)};
  const cuuint32_t box[2] = {32, 16};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_function()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, d, dims, strides, box, element_strides,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B,
                                       CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, [&] { return "FP8 block GEMM: output tensor map failed (" + std::to_string(int(r)) + ")"; });
  return map;
}

// A launch of `blocks` blocks of kThreads in clusters of `cluster` blocks (1: none), smem bytes of
// dynamic shared memory each.
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute{};
  ClusterLaunch(unsigned blocks, int smem, int cluster, cudaStream_t stream) {
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = std::size_t(smem);
    config.stream = stream;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = unsigned(cluster), attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
    config.attrs = &attribute, config.numAttrs = cluster > 1 ? 1 : 0;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at attribute
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// The clusters of `cluster` blocks of kernel (smem bytes each) that fit on the device at once,
// asked once per device and kept in cache (one per kernel).
inline int active_clusters(const void* kernel, int smem, int cluster, std::atomic<int> (&cache)[64]) {
  int device = 0;
  MOEKIT_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>& slot = cache[device >= 0 && device < 64 ? device : 0];
  if (slot.load() == 0) {
    const ClusterLaunch l(unsigned(cluster * multiprocessor_count()), smem, cluster, nullptr);
    int clusters = 0;
    MOEKIT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &l.config));
    require(clusters > 0, "FP8 block GEMM: no cluster of " + std::to_string(cluster) + " blocks fits on the device");
    core::log(core::LogLevel::debug, "FP8 block GEMM: " + std::to_string(clusters) + " clusters of " + std::to_string(cluster) +
                                         " blocks of " + std::to_string(smem) + " B resident on " +
                                         std::to_string(multiprocessor_count()) + " SMs");
    slot.store(clusters);
  }
  return slot.load();
}

template <typename... Params, typename... Args>
void launch_in_clusters(void (*kernel)(Params...), unsigned blocks, int smem, int cluster, cudaStream_t stream, Args&&... args) {
  const ClusterLaunch l(blocks, smem, cluster, stream);
  MOEKIT_CUDA_CHECK(cudaLaunchKernelEx(&l.config, kernel, std::forward<Args>(args)...));
}

// kCluster 2: clusters of two blocks on neighbouring row tiles of the same group and column tile,
// each TMA-loading half of the W tile (paired: the gate's or the up's box) into both (multicast); a
// unit's second row tile past the group's rows computes nothing. kBulkOut:
// bf16 rows out by TMA bulk stores (store_staged; the same kernel, a launch argument), where D starts
// 16 bytes aligned (the tensor map's base; else the lanes store, the same bits).
template <int kN, Activation kAct, int kSumK = 128, int kCluster = 1, bool kBulkOut = false>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kN>;
  static_assert(kCluster == 1 || kCluster == 2, "clusters of one or two blocks");
  const std::int64_t rows = args.counts && desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  if (rows == 0) return;
  // At most this many units (of kCluster row tiles) have rows: a unit per kCluster x 128 rows plus a
  // partial one per group.
  const std::int64_t out_cols = S::kPaired ? desc.n / 2 : desc.n;
  const std::int64_t row_units = (rows + kCluster * kRows - 1) / (kCluster * kRows) + std::min(desc.groups, rows);
  const std::int64_t units = row_units * ((out_cols + S::kOutCols - 1) / S::kOutCols);
  const void* kernel = reinterpret_cast<const void*>(&fp8_block_gemm<kN, kAct, kSumK>);
  allow_dynamic_shared(kernel, S::kSmemBytes);
  static std::atomic<int> clusters[64] = {};  // this kernel's, per device (layers may launch from several threads)
  const int resident = kCluster == 1 ? multiprocessor_count() : active_clusters(kernel, S::kSmemBytes, kCluster, clusters);
  const unsigned blocks = unsigned(kCluster * std::min<std::int64_t>(units, resident));
  const std::int64_t k_blocks = (desc.k + kTileK - 1) / kTileK, n_blocks = (desc.n + kTileN - 1) / kTileN;
  const CUtensorMap map_a = tile_map(args.a, desc.max_rows, desc.k, kRows);
  const CUtensorMap map_w = tile_map(args.w, desc.groups * desc.n, desc.k, S::kPaired ? kTileN : kN / kCluster);
  const bool bulk_out = kBulkOut && !S::kPaired && reinterpret_cast<std::uintptr_t>(args.d) % 16 == 0;
  const CUtensorMap map_d = bulk_out ? out_map(args.d, desc.max_rows, desc.n) : CUtensorMap{};
  ScaleMaps scales{};
  scales.a = scale_map(args.a_scales, desc.max_rows * k_blocks, kAScaleBox, scales.a_shift);
  scales.w = scale_map(args.w_scales, desc.groups * k_blocks * n_blocks, kWScaleBox, scales.w_shift);
  const Params params{args.a_scales, args.offsets, args.counts, args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                      int(desc.groups), int(desc.n), int(desc.k)};
  const ActivatedOut& o = args.activated;
  const ActOut act{static_cast<std::uint8_t*>(o.q), o.scales, int(out_cols), o.alpha, o.limit, o.ue8m0};
  launch_in_clusters(fp8_block_gemm<kN, kAct, kSumK>, blocks, S::kSmemBytes, kCluster, stream, map_a, map_w, scales, map_d,
                     bulk_out, params, act);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_block_gemm");
}

inline Status can_implement(const GroupedGemmDesc& desc, GemmOutput output) {
  if (desc.kind != GemmKind::fp8_block) return Status::no("block scales only (fp8-block)");
  if (desc.output != output)
    return Status::no(std::string("this tile writes ") + (output == GemmOutput::bf16 ? "bf16" : "activated FP8") + " out");
  if (output == GemmOutput::activated_fp8 && desc.n % (2 * kTileN) != 0)
    return Status::no("activated out: 2I a multiple of 256, given " + std::to_string(desc.n));
  if (desc.n % 8 != 0) return Status::no("N: a multiple of 8 (16-byte rows out), given " + std::to_string(desc.n));
  const std::int64_t k_blocks = (desc.k + kTileK - 1) / kTileK;
  if ((desc.max_rows + kRows) * k_blocks >= (std::int64_t(1) << 31) ||
      desc.groups * k_blocks * ((desc.n + kTileN - 1) / kTileN) >= (std::int64_t(1) << 31))
    return Status::no("rows or groups x N: too many scales for the scale tensor maps' int coordinates");
  if (desc.groups > kMaxGroups)
    return Status::no("groups: at most " + std::to_string(kMaxGroups) + " (the tile table), given " +
                      std::to_string(desc.groups));
  return wgmma::can_implement(desc);
}

}  // namespace moekit::cuda::sm90::fp8_block

// The entry points of one instance (sm90_grouped_gemm_instances.h): no workspace; RUN(desc, args, stream).
#define MOEKIT_SM90_FP8_BLOCK_INSTANCE(NAME, OUTPUT, ...)                                                 \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                                 \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_block::can_implement(desc, OUTPUT); } \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) { \
    __VA_ARGS__(desc, args, stream);                                                                     \
  }
