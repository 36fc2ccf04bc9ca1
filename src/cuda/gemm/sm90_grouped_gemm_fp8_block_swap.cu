// Grouped GEMM instances: fp8_block with tokens192_n128_persistent and tokens192_n128_persistent_x2 (see
// sm90_grouped_gemm_instances.h).
// moekit's persistent block-scaled kernel (sm90_grouped_gemm_fp8_block.cuh) with the operands swapped,
// for groups of a few hundred rows and fewer (ragged prefill): the tile's 128 W rows are WGMMA's
// 64-row operand (two math warpgroups of 64) and up to 192 of a group's rows its N, fitted to the
// group's rows in steps of 32. A W tile is then read once per 192 rows of its group, where the
// 128-row tiles read it once per 128 rows and run a short group's last tile on one warpgroup; at
// deepseek-v3's T=4096 (96 to 161 rows per expert) every group is one tile per 128 W rows.
// Steps, as in the persistent kernel:
//   1. the tile table: per group ceil(rows / 192) x ceil(N / 128) tiles, row tiles fastest
//   2. persistent, one block per SM, its ring of stages running on across its tiles
//   3. one producer thread: per 128 of K, TMA of the W tile (128 x 128), the tile's rows in boxes of
//      32 (as many as its N), their A scales and the W tile's scale (1-D tensor maps)
//   4. two math warpgroups of 64 W rows: per stage four WGMMAs m64 nN k32 chained into part, then
//      acc += part x a_scale (of the part's row, its column here) x w_scale, then the stage goes back
//   5. out: D[row][channel] is acc transposed: stmatrix .trans into a per-warp staging buffer (32 rows
//      x this warp's 16 channels), then 16-byte stores, two lanes to a row's 32-byte sector
// On clusters of two blocks (_x2): a cluster walks units of two neighbouring W tiles of the same rows,
// each block TMA-loading every other 32-row box of them into both (multicast); a unit's second W tile
// past N computes nothing.
#include "cuda/gemm/sm90_grouped_gemm_fp8_block.cuh"

namespace moekit::cuda::sm90::fp8_block_swap {

using namespace wgmma;
using fp8_block::kMath;
using fp8_block::kThreads;
using fp8_block::kTileSlots;
using fp8_block::kMaxGroups;
using fp8_block::ScaleIndex;
using fp8_block::ScaleMaps;
using fp8_block::TileTable;
using fp8_block::barrier_arrive_in;
using fp8_block::cluster_blocks;
using fp8_block::cluster_rank;
using fp8_block::cluster_sync;
using fp8_block::tma_load_multicast;

constexpr int kWRows = 128;       // a tile's W rows (output channels): two math warpgroups of 64
constexpr int kMaxTokens = 192;   // a tile's rows at most (WGMMA's N): acc and part, 192 registers
constexpr int kTokenStep = 32;    // a tile's N is a multiple: the A tile's TMA box
constexpr int kWBytes = kWRows * kTileK;
constexpr int kStageBytes = kWBytes + kMaxTokens * kTileK;  // whole 1024-byte swizzle atoms
constexpr int kStages = 5;
// Scale boxes (TMA boxes start 16 bytes aligned: 4 floats early at most) into 128-byte aligned slots
// (a bulk tensor copy's shared destination): a tile's rows' A scales, and the W tile's scale.
constexpr int kAScaleBox = kMaxTokens + 4, kAScaleSlot = 224, kWScaleBox = 8, kWScaleSlot = 32;
constexpr int kStagingBytes = kTokenStep * 32;  // a warp's 32 rows x 16 channels of bf16
constexpr int kProducerRegisters = 40;
constexpr int kMathRegisters = 232;
// Shared memory after the 1024-byte alignment: the stages, their A scales [stages][224] and W
// scales [stages][32], the math warps' staging, the full and empty barriers, the tile slots, the
// tile table.
constexpr int kScalesOffset = kStages * kStageBytes;
constexpr int kWScalesOffset = kScalesOffset + kStages * kAScaleSlot * 4;
constexpr int kStagingOffset = kWScalesOffset + kStages * kWScaleSlot * 4;
constexpr int kBarriersOffset = kStagingOffset + kMath * 4 * kStagingBytes;
constexpr int kSlotsOffset = kBarriersOffset + 2 * kStages * 8;
constexpr int kTableOffset = kSlotsOffset + kTileSlots * int(sizeof(Tile));
constexpr int kSmemBytes = 1024 + kTableOffset + kMaxGroups * 4;
static_assert(kSmemBytes <= 227 * 1024, "shared memory of an H200 block");
static_assert(kScalesOffset % 128 == 0 && kAScaleSlot * 4 % 128 == 0 && kWScaleSlot * 4 % 128 == 0,
              "scale slots 128-byte aligned");
static_assert(kTileSlots > kStages, "a tile slot is rewritten only after its first stage came back");

// The tile's N: its rows, at most kMaxTokens, up to a multiple of kTokenStep.
__device__ __forceinline__ int tile_tokens(const Tile& t) {
  const int rows = min(t.rows - t.m0, kMaxTokens);
  return (rows + kTokenStep - 1) / kTokenStep * kTokenStep;
}

// A warp's 16 channels [channel, channel + 16) of the tile (local) for its kN rows out, acc as the
// WGMMA left it (acc[i]: channel lane / 4 (i % 4 < 2) or + 8, row 8 (i / 4) + 2 (lane % 4) + i % 2).
// 32 rows at a time: stmatrix .trans puts each row's 8 channels of an 8 x 8 block in 16 bytes of the
// staging buffer (32 bytes a row: channels 0-7, 8-15, the halves swapped every 4 rows so that the 8
// rows of a matrix fill 32 banks), then each lane stores 16 bytes. Rows past the group's data and
// channels past N are not written.
template <int kN>
__device__ __forceinline__ void store_transposed(const Params& p, const Tile& t, const float (&acc)[kN / 2], int channel,
                                                 std::uint8_t* staging) {
  const int lane = int(threadIdx.x % 32);
  const std::uint32_t buf = smem_address(staging);
  // stmatrix x4: lane l gives the address of row l % 8 of matrix l / 8 (rows 8 (m / 2) + l % 8 of the
  // 32, channel half m % 2)
  const int s_row = 8 * (lane / 16) + lane % 8, s_half = (lane / 8) % 2;
#pragma unroll
  for (int r0 = 0; r0 < kN; r0 += kTokenStep) {
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {  // rows r0 + 16 pair + [0, 16): accumulator groups j, j + 1
      const int j = r0 / 8 + 2 * pair, row = 16 * pair + s_row;
      const std::uint32_t at = buf + std::uint32_t(row * 32 + 16 * (s_half ^ (row / 4 % 2)));
      asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at),
                   "r"(fp8_block::bf16x2_bits(acc[4 * j], acc[4 * j + 1])),
                   "r"(fp8_block::bf16x2_bits(acc[4 * j + 2], acc[4 * j + 3])),
                   "r"(fp8_block::bf16x2_bits(acc[4 * j + 4], acc[4 * j + 5])),
                   "r"(fp8_block::bf16x2_bits(acc[4 * j + 6], acc[4 * j + 7]))
                   : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 2; ++it) {  // 32 rows x 2 halves of 16 bytes
      const int r = (lane + 32 * it) / 2, half = lane % 2;
      const uint4 v = *reinterpret_cast<const uint4*>(staging + r * 32 + 16 * (half ^ (r / 4 % 2)));
      const int row = t.m0 + r0 + r, col = t.n0 + channel + 8 * half;
      if (row < t.rows && col < p.n) *reinterpret_cast<uint4*>(p.d + (std::size_t(t.row0) + row) * p.n + col) = v;
    }
    __syncwarp();
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    fp8_block_swap(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                   const __grid_constant__ ScaleMaps scale_maps, Params p) {
  // ---- shared memory
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  const std::uint32_t tiles = smem_address(smem);
  const float* scale_a = reinterpret_cast<const float*>(smem + kScalesOffset);   // [stages][224]
  const float* scale_w = reinterpret_cast<const float*>(smem + kWScalesOffset);  // [stages][32]
  const std::uint32_t full = smem_address(smem + kBarriersOffset), empty = full + 8 * kStages;
  Tile* slots = reinterpret_cast<Tile*>(smem + kSlotsOffset);
  int* table = reinterpret_cast<int*>(smem + kTableOffset);

  // ---- barriers: full takes the producer's arrival with the stage's TMA bytes; empty one per math
  // warp of every block of the cluster (the stage's rows come from both)
  const int cluster = cluster_blocks(), rank = cluster_rank();
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(full + 8 * s, 1);
      barrier_init(empty + 8 * s, kMath * 4 * cluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  // ---- scheduler (synchronizes the block): a cluster walks units of `cluster` W tiles; its blocks'
  // barriers are ready before either arrives on or copies into the other's
  const TileTable walk = fp8_block::build_table(p, kMaxTokens, p.n, kWRows * cluster, table);
  if (cluster > 1) cluster_sync();
  const int first = int(blockIdx.x) / cluster, step = int(gridDim.x) / cluster;
  const int k_blocks = (p.k + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);
  int stage = 0, count = 0;
  std::uint32_t parity = 0;
  auto advance = [&] {
    if (++stage == kStages) stage = 0, parity ^= 1;
  };

  // ---- producer
  if (warpgroup == kMath) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x % 128 != 0) return;
    for (int index = first; index < walk.total; index += step, ++count) {
      const Tile t = walk.find<kMaxTokens, kWRows>(p, index, cluster, rank);
      slots[count % kTileSlots] = t;
      // The tile's rows [m0, m0 + N) of the group (past its rows: another group's, or zeros) and
      // their A scales; the W rows [n0, n0 + 128) and their scale block. A unit's second W tile past
      // N: the rows alone (its boxes for the other block).
      const int tokens = tile_tokens(t);
      const bool ghost = t.n0 >= p.n;
      const int bytes = tokens * kTileK + (ghost ? 0 : kWBytes + (kAScaleBox + kWScaleBox) * 4);
      const ScaleIndex at = fp8_block::scale_index(scale_maps, t, k_blocks, n_blocks, 0);
      const int w_row = t.group * p.n + t.n0;
      for (int kb = 0; kb < k_blocks; ++kb, advance()) {
        barrier_wait(empty + 8 * stage, parity ^ 1);
        const std::uint32_t bar = full + 8 * stage;
        barrier_expect_bytes(bar, bytes);
        const std::uint32_t w = tiles + std::uint32_t(stage * kStageBytes);
        for (int r = 0; r < tokens; r += kTokenStep) {  // clusters: every other box from each block, into both
          const std::uint32_t to = w + std::uint32_t(kWBytes + r * kTileK);
          if (cluster == 1) tma_load(to, &map_a, kb * kTileK, t.row0 + t.m0 + r, bar);
          else if (r / kTokenStep % 2 == rank) tma_load_multicast(to, &map_a, kb * kTileK, t.row0 + t.m0 + r, bar, 0x3);
        }
        if (ghost) continue;
        tma_load(w, &map_w, kb * kTileK, w_row, bar);
        fp8_block::tma_load_1d(smem_address(scale_a + stage * kAScaleSlot), &scale_maps.a, at.a_at(kb) & ~3, bar);
        fp8_block::tma_load_1d(smem_address(scale_w + stage * kWScaleSlot), &scale_maps.w, at.w_at(kb) & ~3, bar);
      }
    }
    // The peer's math warps hand this block's stages back too: stay until the last ones have (its
    // arrivals then land on live barriers).
    if (cluster > 1)
      for (int s = 0; s < kStages; ++s, advance()) barrier_wait(empty + 8 * stage, parity ^ 1);
    return;
  }

  // ---- math warpgroups: c takes W rows [64 c, 64 c + 64) of a tile; this thread W rows lo and
  // lo + 8, and of each 8 of the tile's rows the two at 2 (lane % 4)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegisters));
  const int c = warpgroup, warp = int(threadIdx.x / 32) % 4;
  std::uint8_t* staging = smem + kStagingOffset + (c * 4 + warp) * kStagingBytes;
  const std::uint64_t desc_w0 = smem_descriptor(tiles + std::uint32_t(c * 64 * kTileK));
  const std::uint64_t desc_t0 = smem_descriptor(tiles + std::uint32_t(kWBytes));
  constexpr std::uint64_t kStageDesc = kStageBytes / 16;
  // A warp's reads of the stage are done when its lanes pass this; then lane 0 hands it back (to
  // both blocks of a cluster).
  auto release = [&] {
    __syncwarp();
    if (lane == 0) {
      barrier_arrive(empty + 8 * stage);
      if (cluster > 1) barrier_arrive_in(empty + 8 * stage, rank ^ 1);
    }
  };
  for (int index = first; index < walk.total; index += step, ++count) {
    barrier_wait(full + 8 * stage, parity);  // the tile's first stage: its slot is written
    const Tile t = warp_uniform(slots[count % kTileSlots]);
    if (t.n0 >= p.n) {  // a unit's W tile past N: hand the stages back as they fill
      for (int kb = 0; kb < k_blocks; ++kb, advance()) {
        barrier_wait(full + 8 * stage, parity);
        release();
      }
      continue;
    }
    const ScaleIndex at = fp8_block::scale_index(scale_maps, t, k_blocks, n_blocks, 0);
    auto k_loop = [&](auto tokens) {
      constexpr int kN = decltype(tokens)::value, kRegs = kN / 2;
      // part[i], acc[i]: W row lo (i % 4 < 2) or lo + 8, tile row 8 (i / 4) + 2 (lane % 4) + i % 2
      float acc[kRegs], part[kRegs];
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
#pragma unroll 1
      for (int kb = 0; kb < k_blocks; ++kb, advance()) {
        barrier_wait(full + 8 * stage, parity);
        fp8_block::issue_stage<kN>(part, desc_w0 + std::uint64_t(stage) * kStageDesc,
                                   desc_t0 + std::uint64_t(stage) * kStageDesc);
        fp8_block::wait_stages<0>(part);
        const float w = scale_w[stage * kWScaleSlot + (at.w_at(kb) & 3)];
        const float* a = scale_a + stage * kAScaleSlot + (at.a_at(kb) & 3) + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
          const float s0 = a[8 * j] * w, s1 = a[8 * j + 1] * w;
          acc[4 * j] += part[4 * j] * s0;
          acc[4 * j + 1] += part[4 * j + 1] * s1;
          acc[4 * j + 2] += part[4 * j + 2] * s0;
          acc[4 * j + 3] += part[4 * j + 3] * s1;
        }
        release();  // every lane's scale reads are done
      }
      store_transposed<kN>(p, t, acc, c * 64 + warp * 16, staging);
    };
    switch (tile_tokens(t) / kTokenStep) {
      case 1: k_loop(std::integral_constant<int, 32>{}); break;
      case 2: k_loop(std::integral_constant<int, 64>{}); break;
      case 3: k_loop(std::integral_constant<int, 96>{}); break;
      case 4: k_loop(std::integral_constant<int, 128>{}); break;
      case 5: k_loop(std::integral_constant<int, 160>{}); break;
      default: k_loop(std::integral_constant<int, 192>{}); break;
    }
  }
}

// kCluster 2: clusters of two blocks on neighbouring W tiles of the same rows (the rows multicast).
template <int kCluster>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  const std::int64_t rows = args.counts && desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  if (rows == 0) return;
  // At most this many tiles (units of kCluster W tiles) have rows: a row tile per 192 rows plus a
  // partial one per group.
  const std::int64_t row_tiles = (rows + kMaxTokens - 1) / kMaxTokens + std::min(desc.groups, rows);
  const std::int64_t units = row_tiles * ((desc.n + kCluster * kWRows - 1) / (kCluster * kWRows));
  const void* kernel = reinterpret_cast<const void*>(&fp8_block_swap);
  allow_dynamic_shared(kernel, kSmemBytes);
  static std::atomic<int> clusters[64] = {};  // per device (layers may launch from several threads)
  const int resident = kCluster == 1 ? multiprocessor_count() : fp8_block::active_clusters(kernel, kSmemBytes, kCluster, clusters);
  const unsigned blocks = unsigned(kCluster * std::min<std::int64_t>(units, resident));
  const std::int64_t k_blocks = (desc.k + kTileK - 1) / kTileK, n_blocks = (desc.n + kTileN - 1) / kTileN;
  const CUtensorMap map_a = tile_map(args.a, desc.max_rows, desc.k, kTokenStep);
  const CUtensorMap map_w = tile_map(args.w, desc.groups * desc.n, desc.k, kWRows);
  ScaleMaps scales{};
  scales.a = fp8_block::scale_map(args.a_scales, desc.max_rows * k_blocks, kAScaleBox, scales.a_shift);
  scales.w = fp8_block::scale_map(args.w_scales, desc.groups * k_blocks * n_blocks, kWScaleBox, scales.w_shift);
  const Params params{args.a_scales, args.offsets, args.counts, args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                      int(desc.groups), int(desc.n), int(desc.k)};
  fp8_block::launch_in_clusters(fp8_block_swap, blocks, kSmemBytes, kCluster, stream, map_a, map_w, scales, params);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_block_swap");
}

}  // namespace moekit::cuda::sm90::fp8_block_swap

namespace moekit::cuda::sm90 {

std::size_t fp8_block_swap_workspace_size(const GroupedGemmDesc&) { return 0; }
Status fp8_block_swap_can_implement(const GroupedGemmDesc& desc) {
  return fp8_block::can_implement(desc, GemmOutput::bf16);
}
void fp8_block_swap_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {
  fp8_block_swap::run<1>(desc, args, stream);
}

std::size_t fp8_block_swap_x2_workspace_size(const GroupedGemmDesc&) { return 0; }
Status fp8_block_swap_x2_can_implement(const GroupedGemmDesc& desc) {
  return fp8_block::can_implement(desc, GemmOutput::bf16);
}
void fp8_block_swap_x2_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {
  fp8_block_swap::run<2>(desc, args, stream);
}

}  // namespace moekit::cuda::sm90
