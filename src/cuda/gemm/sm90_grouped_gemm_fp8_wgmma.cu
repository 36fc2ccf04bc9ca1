// Grouped GEMM instances: fp8_block and fp8_channel with m192_n128_wgmma, m128_n128_wgmma and
// m64_n128_wgmma (see sm90_grouped_gemm_instances.h). moekit's own Hopper kernel for FP8 GEMMs
// whose output is requantized (GEMM1): TMA + WGMMA, warp-specialized, closer to the CPU's f32
// sums than CUTLASS 4.2. A WGMMA sums its products at reduced precision (about 4e-4 from f32 at
// the GEMM output even for one 32-wide K step), and CUTLASS's blockwise mainloop adds three more
// WGMMAs into that accumulator per 128 of K before the f32 promotion (6.4e-4); after GEMM1's bf16
// rounding and the FP8 requantization that puts the layer at 5.2e-3 from the CPU pipeline
// reference (DESIGN §8 allows 5e-3; here 3-4.3e-3). So every WGMMA here starts from zero, sums 32
// of K, and enters the f32 accumulator times the block scales at once (docs/PERF.md).
//   1. block x: the x-th (group, row tile, 128-column tile) of the groups that have rows, in
//      order, row tiles fastest (the tiles that share a W tile run side by side); one warp finds
//      it. Row tiles of 192 (up to a few hundred rows per group: the last tile of a group fits
//      its rows to 64 as its idle warpgroups leave), 128 (many rows: two warpgroups with two part
//      buffers each) or 64 (few rows: half a 128-row tile's MMAs)
//   2. warp 0 (producer): per 128 of K, TMA of the A tile (rows x 128) and the 128x128 W tile
//      into one of the stages (128-byte swizzle), and with block scales the stage's A and W
//      scales copied into shared memory (loaded a block ahead); the stage's full barrier says when
//   3. the consumer warpgroups (the producer gives its registers to them): 64 rows x 128 columns
//      each (192- and 128-row tiles: 3 and 2 warpgroups; those without rows leave) or 64 rows x 64
//      columns (64-row tiles: 2); per 32 of K one WGMMA from zero, then in f32
//      acc += (a_scale * w_scale) * part (block scales) or acc += part (a row's and a channel's
//      one scale, applied at the end as the CPU does); with two part buffers the next WGMMA runs
//      while one is added; the stage goes back through its empty barrier once its WGMMAs are done
//   4. bf16 out for the rows of the group that carry data (counts); nothing else is written
#include <cstdint>

#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90 {
namespace {

using namespace wgmma;

constexpr int kPipelineBytes = 192 * 1024;

// A tile of kRows rows: the consumer warpgroups, what each takes, and the stages that fit.
template <int kRows>
struct Shape {
  static_assert(kRows == 192 || kRows == 128 || kRows == 64, "row tiles of 192, 128 or 64");
  static constexpr int kConsumers = kRows == 192 ? 3 : 2;
  static constexpr int kThreads = (1 + kConsumers) * 128;
  static constexpr int kWarpgroupCols = kRows == 64 ? 64 : 128;  // the WGMMA's N
  // Registers after setmaxnreg: the producer's go to the consumers. Three consumers have room
  // for one part buffer, two for two.
  static constexpr int kProducerRegisters = kConsumers == 3 ? 56 : 40;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 152 : 232;
  static constexpr bool kTwoParts = kConsumers == 2;
  static constexpr int kTileABytes = kRows * kTileK;
  static constexpr int kStageBytes = kTileABytes + kTileN * kTileK;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  // Tiles, then the barriers, the tile's coordinates, and per stage kRows A scales and a W scale.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 32 + kStages * (kRows + 1) * 4;
  // Where warpgroup c's part of the tile starts.
  static constexpr int row_of(int c) { return kRows == 64 ? 0 : c * 64; }
  static constexpr int col_of(int c) { return kRows == 64 ? c * 64 : 0; }
  // The consumers with rows to compute in a tile whose rows [m0, m0 + kRows) hold rows - m0 of the
  // group's: the others leave at once (the busy ones then have the tensor core to themselves).
  static __device__ int busy(int m0, int rows) {
    return kRows == 64 ? kConsumers : min(kConsumers, (rows - m0 + 63) / 64);
  }
};

// d = a (64x32, K-major shared) x b (32xN, K-major shared), from zero; f32, N/2 registers.
template <int kN>
__device__ __forceinline__ void wgmma_k32(float (&d)[kN / 2], std::uint64_t a, std::uint64_t b) {
  static_assert(kN == 128 || kN == 64, "WGMMA N of 128 or 64");
#define MOEKIT_FP8_K32(N, REGS, AB, ZERO) \
  "{\n.reg .pred zero;\nsetp.ne.b32 zero, %" ZERO ", 0;\nwgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 {" REGS "}, " AB ", zero, 1, 1;\n}\n"
  if constexpr (kN == 128)
    asm volatile(MOEKIT_FP8_K32("128", MOEKIT_WGMMA_R64, "%64, %65", "66") : MOEKIT_WGMMA_D64("+f") : "l"(a), "l"(b), "r"(0));
  else
    asm volatile(MOEKIT_FP8_K32("64", MOEKIT_WGMMA_R32, "%32, %33", "34") : MOEKIT_WGMMA_D32("+f") : "l"(a), "l"(b), "r"(0));
#undef MOEKIT_FP8_K32
}

template <bool kChannel, int kRows>
__global__ void __launch_bounds__(Shape<kRows>::kThreads, 1)
    fp8_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p) {
  using S = Shape<kRows>;
  constexpr int kStages = S::kStages, kStageBytes = S::kStageBytes, kCols = S::kWarpgroupCols;
  extern __shared__ std::uint8_t smem_raw[];
  Tile* shared_tile = nullptr;
  const Ring ring = ring_layout<kRows>(smem_raw, kStages, kStageBytes, 0, shared_tile);
  const std::uint32_t tiles = ring.tiles, full = ring.full, empty = ring.empty;
  const float *scale_a = ring.scale_a, *scale_w = ring.scale_w;
  Tile t;
  // empty: every busy consumer thread arrives after its own reads of a stage
  if (!start_tile<kChannel, kRows>(p, ring, shared_tile, [](const Tile& x) { return S::busy(x.m0, x.rows) * 128; }, t)) return;
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int warpgroup = int(threadIdx.x / 128), lane = int(threadIdx.x % 32);

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::kProducerRegisters));
    if (threadIdx.x >= 32) return;
    produce<kChannel, kRows>(map_a, map_w, p, t, ring);
    return;
  }

  if (warpgroup - 1 >= S::busy(t.m0, t.rows)) return;
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::kConsumerRegisters));
  // Consumer c: 64 rows x kCols columns of the tile from (row_of(c), col_of(c)); this thread holds
  // rows lo and lo + 8, and of each 8 columns the two at 2 * (lane % 4).
  const int c = warpgroup - 1, warp = int(threadIdx.x / 32) % 4;
  const int local = S::row_of(c) + warp * 16 + lane / 4;  // row lo within the tile
  const int lo = t.m0 + local;  // and lo + 8
  // Two part buffers: the WGMMA of one 32 of K runs while the one before is added. (Carrying the
  // last one over into the next block makes ptxas serialize every WGMMA: it cannot see that the
  // wait covers it across the loop.)
  constexpr int kRegs = kCols / 2;
  float acc[kRegs], part0[kRegs], part1[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[i] = part0[i] = part1[i] = 0.0f;
  auto issue = [&](float(&part)[kRegs], std::uint32_t a, std::uint32_t b, int j) {
    pin(part);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_k32<kCols>(part, smem_descriptor(a + 32 * j), smem_descriptor(b + 32 * j));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  // Waits for the older WGMMA (into part; the last: for every one) and adds it; part[i]: row lo
  // (i % 4 < 2) or hi, column 8 (i / 4) + 2 (lane % 4) + i % 2.
  auto add = [&](float(&part)[kRegs], float s_lo, float s_hi, bool last) {
    if (last) asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    else asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    pin(part);
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] += kChannel ? part[i] : (i % 4 < 2 ? s_lo : s_hi) * part[i];
  };
  // Channel: a row's one scale (repeated over the K blocks), applied at the end.
  const RowScales scales = row_scales<kChannel>(p, t, lo);
  for (int kb = 0; kb < k_blocks; ++kb) {
    const int s = kb % kStages;
    barrier_wait(full + 8 * s, (kb / kStages) & 1);
    const float s_lo = kChannel ? 1.0f : scale_a[s * kRows + local] * scale_w[s];
    const float s_hi = kChannel ? 1.0f : scale_a[s * kRows + local + 8] * scale_w[s];
    const std::uint32_t a = tiles + std::uint32_t(s * kStageBytes + S::row_of(c) * kTileK);
    const std::uint32_t b = tiles + std::uint32_t(s * kStageBytes + S::kTileABytes + S::col_of(c) * kTileK);
    if constexpr (S::kTwoParts) {
      issue(part0, a, b, 0);
      issue(part1, a, b, 1);
      add(part0, s_lo, s_hi, false);
      issue(part0, a, b, 2);
      add(part1, s_lo, s_hi, false);
      issue(part1, a, b, 3);
      add(part0, s_lo, s_hi, false);
      add(part1, s_lo, s_hi, true);
    } else {
#pragma unroll
      for (int j = 0; j < kTileK / 32; ++j) {
        issue(part0, a, b, j);
        add(part0, s_lo, s_hi, true);
      }
    }
    barrier_arrive(empty + 8 * s);
  }

  store_bf16<kChannel, kCols>(p, t, acc, lo, t.n0 + S::col_of(c) + 2 * (lane % 4), scales);
}

template <bool kChannel, int kRows>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kRows>;
  const TileLaunch l = tile_launch(desc, args, kRows);
  if (l.blocks == 0) return;
  // Every call, as the attribute belongs to the current device (CUTLASS's adapter does the same).
  MOEKIT_CUDA_CHECK(
      cudaFuncSetAttribute(fp8_wgmma<kChannel, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  fp8_wgmma<kChannel, kRows><<<l.blocks, S::kThreads, S::kSmemBytes, stream>>>(l.map_a, l.map_w, l.params);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_wgmma");
}

}  // namespace

MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma192, run<false, 192>)
MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma128, run<false, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma64, run<false, 64>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma192, run<true, 192>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma128, run<true, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma64, run<true, 64>)

}  // namespace moekit::cuda::sm90
