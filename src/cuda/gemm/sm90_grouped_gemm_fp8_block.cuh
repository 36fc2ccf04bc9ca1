// moekit's FP8 block-scaled grouped GEMM for prefill (fp8_block: 1x128 A scales, 128x128 W scales),
// contiguous layout, problem sizes on the GPU. Instances: sm90_grouped_gemm_fp8_block_n{128,192}.cu
// and sm90_grouped_gemm_fp8_block_act.cu. f32 promotion every 128 of K (DESIGN §8 `fast`). Tiles:
//   kN 128, 192   128 rows x kN W rows of the group, bf16 out (a 192-wide W tile straddles two scale
//                 blocks: two W scales per K block)
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
//   3. warp 0 of the producer warpgroup: per 128 of K, TMA of the A tile (128 x 128) and the W tile
//      (kN x 128), and the stage's scales (the 128 rows' A scales by one bulk copy where aligned, else
//      by the lanes' cp.async; the tile's one or two W scales by cp.async), all completing on the
//      stage's full barrier; the tile itself goes to a slot the consumers read
//   4. two math warpgroups of 64 rows: per stage four WGMMAs m64 n kN k32 chained, then
//      acc += part x a_scale x w_scale (the W scale of the part's columns); the stage goes back once
//      the WGMMAs are done. The two warpgroups drift half a stage apart, so one's promotion overlaps
//      the other's WGMMAs. A warpgroup with no rows in the tile (a group's last, short tile) skips it
//   5. out for the rows of the group that carry data (counts): bf16, or the activated FP8 rows and
//      their scales (GEMM1's outputs rounded to bf16 first, as the activation stage reads them);
//      nothing else is written
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/common/launch.h"
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

// GEMM1's activated FP8 output (kN 256 with an activation): q [rows, I], scales in GEMM2's layout
// (group e's [I/128, padded] at offsets[e] * I/128, rows contiguous).
struct ActOut {
  std::uint8_t* q;
  float* scales;
  int inter;
  float alpha, limit;
  bool ue8m0;
};

template <int kN>
struct Shape {
  static_assert(kN == 128 || kN == 192 || kN == 256, "column tiles of 128, 192, or 256 (gate and up)");
  static constexpr bool kPaired = kN == 256;              // gate and up halves of 128
  static constexpr int kOutCols = kPaired ? 128 : kN;     // output columns of a tile
  static constexpr int kWgmmaN = kPaired ? 128 : kN;      // one WGMMA's N
  static constexpr int kABytes = kRows * kTileK;
  static constexpr int kStageBytes = kABytes + kN * kTileK;  // whole 1024-byte swizzle atoms
  static constexpr int kStages = kN == 256 ? 4 : kN == 192 ? 5 : 6;
  static_assert(kTileSlots > kStages, "a tile slot is rewritten only after its first stage came back");
  // Shared memory after the 1024-byte alignment: the stages' tiles, their A scales [stages][128] and
  // W scales [stages][4], the full and empty barriers, the tile slots, the tile table.
  static constexpr int kScalesOffset = kStages * kStageBytes;
  static constexpr int kWScalesOffset = kScalesOffset + kStages * kRows * 4;
  static constexpr int kBarriersOffset = kWScalesOffset + kStages * 4 * 4;
  static constexpr int kSlotsOffset = kBarriersOffset + 2 * kStages * 8;
  static constexpr int kTableOffset = kSlotsOffset + kTileSlots * int(sizeof(Tile));
  static constexpr int kSmemBytes = 1024 + kTableOffset + kMaxGroups * 4;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of an H200 block");
};

// The four chained WGMMAs of one 128-K stage into part (from zero), waited for.
template <int kN>
__device__ __forceinline__ void stage_product(float (&part)[kN / 2], std::uint64_t da, std::uint64_t db) {
  pin(part);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int j = 0; j < kTileK / 32; ++j) fp8_wgmma_k32<kN>(part, da + 2 * j, db + 2 * j, j > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  pin(part);
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// The tile walk: table[g] = the tiles of groups 0..g (running sum), built by every block at start.
struct TileTable {
  const int* ends;
  int groups, n_tiles, total;

  // Tile `index` (< total) of the walk, kCols output columns wide. Producer warp only: it reads the
  // group's rows.
  template <int kCols>
  __device__ Tile find(const Params& p, int index) const {
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
    t.m0 = u % m_tiles * kRows;
    t.n0 = u / m_tiles * kCols;
    return t;
  }
};

// Every thread takes part (two block-wide barriers).
__device__ __forceinline__ TileTable build_table(const Params& p, int out_cols, int tile_cols, int* table) {
  const int n_tiles = (out_cols + tile_cols - 1) / tile_cols;
  for (int g = int(threadIdx.x); g < p.groups; g += kThreads) {
    const int rows = p.counts ? __ldg(p.counts + g) : __ldg(p.offsets + g + 1) - __ldg(p.offsets + g);
    table[g] = (rows + kRows - 1) / kRows * n_tiles;
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
  return {table, p.groups, n_tiles, table[p.groups - 1]};
}

// The bulk copy engine: bytes (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory, completing on bar.
__device__ __forceinline__ void bulk_load(std::uint32_t dst, const void* src, int bytes, std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// GEMM1's activated rows lo and lo + 8 of the tile (gate and up accumulators of the same 64 x 128
// channels): each row's 128 channels are one 1x128 block, held by the 4 lanes of a quad. gate is
// overwritten by the activated values.
template <Activation kAct>
__device__ __forceinline__ void store_activated(const Params& p, const ActOut& out, const Tile& t, float (&gate)[64],
                                                const float (&up)[64], int lo) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float m = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // 8 values at a time: 4 column groups of 8, 2 values each
      float g[8], u[8], x[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int r = 4 * (4 * c + i / 2) + 2 * half + i % 2;
        g[i] = round_to_bf16(gate[r]);
        u[i] = round_to_bf16(up[r]);
      }
      activation::activate_values<kAct>(g, u, out.alpha, out.limit, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        gate[4 * (4 * c + i / 2) + 2 * half + i % 2] = x[i];
        m = amax_step(m, x[i]);
      }
    }
    const float scale = fp8_scale(group_max<4>(m), out.ue8m0);
    const int row = lo + 8 * half;
    if (row >= t.rows) continue;
    const ScaleDivision division(scale, true);
    std::uint8_t* q = out.q + (std::size_t(t.row0) + row) * out.inter + t.n0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<std::uint16_t*>(q + 8 * j) = fp8x2(division(gate[4 * j + 2 * half]), division(gate[4 * j + 2 * half + 1]));
    if (lane % 4 == 0)
      out.scales[std::size_t(t.row0) * (out.inter / kTileK) + std::size_t(t.n0 / kTileK) * t.padded + row] = scale;
  }
}

template <int kN, Activation kAct>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_block_gemm(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p,
                   ActOut act) {
  using S = Shape<kN>;
  // ---- shared memory
  extern __shared__ std::uint8_t smem_raw[];
  std::uint8_t* smem = smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024);
  const std::uint32_t tiles = smem_address(smem);
  float* scale_a = reinterpret_cast<float*>(smem + S::kScalesOffset);   // [stages][128]
  float* scale_w = reinterpret_cast<float*>(smem + S::kWScalesOffset);  // [stages][4]
  const std::uint32_t full = smem_address(smem + S::kBarriersOffset), empty = full + 8 * S::kStages;
  Tile* slots = reinterpret_cast<Tile*>(smem + S::kSlotsOffset);
  int* table = reinterpret_cast<int*>(smem + S::kTableOffset);

  // ---- barriers: full takes lane 0's arrival with the TMA bytes and each producer lane's once its
  // cp.async copies landed; empty one per math warp, after its WGMMAs read the stage
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      barrier_init(full + 8 * s, 1 + 32);
      barrier_init(empty + 8 * s, kMath * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
  }
  // ---- scheduler (synchronizes the block)
  const TileTable walk = build_table(p, S::kPaired ? act.inter : p.n, S::kOutCols, table);
  const int k_blocks = (p.k + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  const int warpgroup = int(threadIdx.x / 128), lane = int(threadIdx.x % 32);
  auto advance = [&](int& stage, std::uint32_t& parity) {
    if (++stage == S::kStages) stage = 0, parity ^= 1;
  };

  // ---- producer
  if (warpgroup == kMath) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x % 128 >= 32) return;
    int stage = 0, count = 0;
    std::uint32_t parity = 0;
    for (int index = int(blockIdx.x); index < walk.total; index += int(gridDim.x), ++count) {
      const Tile t = walk.find<S::kOutCols>(p, index);
      // The A scales of the tile's 128 rows, [k_blocks, padded] from the group's start: one bulk copy
      // per stage when they are 16-byte aligned and inside the group, else the lanes' 4-byte copies
      // (zeros past the group's rows: another group's).
      const float* a_scale = p.a_scales + std::size_t(t.row0) * k_blocks + t.m0;
      const bool bulk = t.m0 + kRows <= t.padded && t.padded % 4 == 0 &&
                        (reinterpret_cast<std::uintptr_t>(a_scale) & 15) == 0;
      // The W rows: [n0, n0 + kN), or the gate rows [n0, n0 + 128) and the up rows I further. Their
      // scale blocks: the first and the next, or the gate's and the up's.
      const int w_row = t.group * p.n + t.n0;
      const int nb = t.n0 / kTileN, nb_second = S::kPaired ? (act.inter + t.n0) / kTileN : nb + 1;
      const float* w_scale = p.w_scales + std::size_t(t.group) * k_blocks * n_blocks;
      if (lane == 0) slots[count % kTileSlots] = t;
      for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
        barrier_wait(empty + 8 * stage, parity ^ 1);
        const std::uint32_t bar = full + 8 * stage;
        float* sa = scale_a + stage * kRows;
        if (lane == 0) {
          barrier_expect_bytes(bar, S::kStageBytes + (bulk ? kRows * 4 : 0));
          const std::uint32_t a = tiles + std::uint32_t(stage * S::kStageBytes);
          tma_load(a, &map_a, kb * kTileK, t.row0 + t.m0, bar);
          tma_load(a + S::kABytes, &map_w, kb * kTileK, w_row, bar);
          if (S::kPaired) tma_load(a + S::kABytes + kTileN * kTileK, &map_w, kb * kTileK, w_row + act.inter, bar);
          if (bulk) bulk_load(smem_address(sa), a_scale + std::size_t(kb) * t.padded, kRows * 4, bar);
        }
        if (!bulk) {
#pragma unroll
          for (int r = lane; r < kRows; r += 32)
            copy4_async(sa + r, a_scale + std::size_t(kb) * t.padded + r, t.m0 + r < t.padded, a_scale);
        }
        if (lane < 2) {
          const int block = lane == 0 ? nb : nb_second;
          copy4_async(scale_w + stage * 4 + lane, w_scale + std::size_t(kb) * n_blocks + block, block < n_blocks, w_scale);
        }
        barrier_arrive_when_copied(bar);
      }
    }
    return;
  }

  // ---- math warpgroups: c takes rows [64 c, 64 c + 64) of a tile; this thread rows lo and lo + 8,
  // and of each 8 columns the two at 2 (lane % 4)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kMathRegisters));
  const int c = warpgroup, warp = int(threadIdx.x / 32) % 4;
  const int local = c * 64 + warp * 16 + lane / 4;
  constexpr int kRegs = S::kWgmmaN / 2;
  // part[i], acc[i]: row lo (i % 4 < 2) or lo + 8, column 8 (i / 4) + 2 (lane % 4) + i % 2; paired:
  // acc the gate half, acc_up the up half
  float acc[kRegs], acc_up[S::kPaired ? kRegs : 1], part[kRegs];
  const std::uint64_t desc_a0 = smem_descriptor(tiles + std::uint32_t(c * 64 * kTileK));
  const std::uint64_t desc_b0 = smem_descriptor(tiles + std::uint32_t(S::kABytes));
  constexpr std::uint64_t kUpHalf = kTileN * kTileK / 16;  // the up half's W rows, in descriptor units
  int stage = 0, count = 0;
  std::uint32_t parity = 0;
  for (int index = int(blockIdx.x); index < walk.total; index += int(gridDim.x), ++count) {
    barrier_wait(full + 8 * stage, parity);  // the tile's first stage: its slot is written
    const Tile t = slots[count % kTileSlots];
    // A warp's reads of a stage are done when its lanes pass this; then lane 0 hands the stage back.
    auto release = [&] {
      __syncwarp();
      if (lane == 0) barrier_arrive(empty + 8 * stage);
    };
    if (c * 64 >= t.rows - t.m0) {  // no rows of this warpgroup: hand the stages back as they fill
      for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
        barrier_wait(full + 8 * stage, parity);
        release();
      }
      continue;
    }
    // The columns that take the first W scale block (the rest take the second).
    const int split = S::kPaired ? kTileN : kTileN - t.n0 % kTileN;
    auto k_loop = [&](auto first_cols) {
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
      if constexpr (S::kPaired) {
#pragma unroll
        for (int i = 0; i < kRegs; ++i) acc_up[i] = 0.0f;
      }
#pragma unroll 1
      for (int kb = 0; kb < k_blocks; ++kb, advance(stage, parity)) {
        barrier_wait(full + 8 * stage, parity);
        // every shared read of the stage before its release
        const float a_lo = scale_a[stage * kRows + local], a_hi = scale_a[stage * kRows + local + 8];
        const float w0 = scale_w[stage * 4], w1 = scale_w[stage * 4 + 1];
        const std::uint64_t da = desc_a0 + std::uint64_t(stage) * (S::kStageBytes / 16);
        const std::uint64_t db = desc_b0 + std::uint64_t(stage) * (S::kStageBytes / 16);
        const float s00 = a_lo * w0, s10 = a_hi * w0, s01 = a_lo * w1, s11 = a_hi * w1;
        if constexpr (S::kPaired) {  // the gate half, then the up half, each promoted with its scale
          stage_product<kTileN>(part, da, db);
#pragma unroll
          for (int i = 0; i < kRegs; ++i) acc[i] += part[i] * (i % 4 < 2 ? s00 : s10);
          stage_product<kTileN>(part, da, db + kUpHalf);
          release();
#pragma unroll
          for (int i = 0; i < kRegs; ++i) acc_up[i] += part[i] * (i % 4 < 2 ? s01 : s11);
        } else {
          constexpr int kFirst = decltype(first_cols)::value;
          stage_product<kN>(part, da, db);
          release();
#pragma unroll
          for (int i = 0; i < kRegs; ++i) {
            const bool first = (i / 4) * 8 < kFirst;
            acc[i] += part[i] * (i % 4 < 2 ? (first ? s00 : s01) : (first ? s10 : s11));
          }
        }
      }
    };
    if (kN == 192 && split == 64) k_loop(std::integral_constant<int, 64>{});
    else k_loop(std::integral_constant<int, kTileN>{});
    if constexpr (S::kPaired) store_activated<kAct>(p, act, t, acc, acc_up, t.m0 + local);
    else store_bf16<false, kN>(p, t, acc, t.m0 + local, t.n0 + 2 * (lane % 4), RowScales{0.0f, 0.0f});
  }
}

template <int kN, Activation kAct>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kN>;
  const std::int64_t rows = args.counts && desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  if (rows == 0) return;
  // At most this many tiles have rows: a row tile per 128 rows plus a partial one per group.
  const std::int64_t out_cols = S::kPaired ? desc.n / 2 : desc.n;
  const std::int64_t row_tiles = (rows + kRows - 1) / kRows + std::min(desc.groups, rows);
  const std::int64_t tiles = row_tiles * ((out_cols + S::kOutCols - 1) / S::kOutCols);
  const unsigned blocks = unsigned(std::min<std::int64_t>(tiles, multiprocessor_count()));
  const CUtensorMap map_a = tile_map(args.a, desc.max_rows, desc.k, kRows);
  const CUtensorMap map_w = tile_map(args.w, desc.groups * desc.n, desc.k, S::kPaired ? kTileN : kN);
  const Params params{args.a_scales, args.offsets, args.counts, args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                      int(desc.groups), int(desc.n), int(desc.k)};
  const ActivatedOut& o = args.activated;
  const ActOut act{static_cast<std::uint8_t*>(o.q), o.scales, int(out_cols), o.alpha, o.limit, o.ue8m0};
  allow_dynamic_shared(reinterpret_cast<const void*>(&fp8_block_gemm<kN, kAct>), S::kSmemBytes);
  fp8_block_gemm<kN, kAct><<<blocks, kThreads, S::kSmemBytes, stream>>>(map_a, map_w, params, act);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_block_gemm");
}

inline Status can_implement(const GroupedGemmDesc& desc, GemmOutput output) {
  if (desc.kind != GemmKind::fp8_block) return Status::no("block scales only (fp8-block)");
  if (desc.output != output)
    return Status::no(std::string("this tile writes ") + (output == GemmOutput::bf16 ? "bf16" : "activated FP8") + " out");
  if (output == GemmOutput::activated_fp8 && desc.n % (2 * kTileN) != 0)
    return Status::no("activated out: 2I a multiple of 256, given " + std::to_string(desc.n));
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
