// moekit's FP8 grouped GEMM for few rows per group (decode, the masked format): the weights are
// WGMMA's 64-row operand and the group's rows its N of 8, 16 or 32 ("swap AB"), so that a row
// tile of 8 tokens costs 8 rows of A, not 64, and the tensor core never is the limit: the W
// stream is. fp8_block, f32 promotion every 128 of K (four chained WGMMAs; `fast`, the
// tensor_core sums of gemm_sums). Instances: sm90_grouped_gemm_fp8_decode.cu (bf16 out; GEMM2 + the
// weighted combine) and sm90_grouped_gemm_fp8_decode_act.cu (GEMM1 + activation + requantization).
//   1. persistent blocks (two per SM) walk the (group, kN-row tile, kW-column tile) tiles of
//      sm90_wgmma.cuh, b, b + grid, ...; the ring of stages runs on across a block's tiles. A block
//      finds its tiles in a table of each group's first tile and first row that one warp builds in
//      shared memory from one load of every count and offset (a scan over the counts in global memory
//      per tile cost ~3 us before the first load at deepseek-v3's 256 groups; a tile's offsets read
//      from global memory put a round trip between the table and the first TMA)
//   2. warp 0 (producer): per 128 of K, TMA of the rows (kN x 128) and of the 128 x 128 W tile
//      (kAct: two, the gate rows [n0, n0 + 128) and the up rows [I + n0, ...) of the same channels),
//      and cp.async of the stage's block scales (the rows' and the W tiles') into shared memory. W is
//      loaded evict-first (l2_evict_first): the weights must not evict the glue kernels' code and data.
//      Rows by index (GroupedGemmDesc::a_by_index, GEMM1 at decode sizes: no gather pass): each
//      row's 128 bytes by cp.async from its token's row of the prepared input, in the 128-byte
//      swizzle TMA would give them, its scale from the input's k-major scales
//   3. two consumer warpgroups, 64 W rows each (kAct: 64 gate and the 64 up rows of the same
//      channels): per stage four WGMMAs m64 n kN k32 chained (per W tile), then
//      acc += (w_scale * a_scale[row]) * part, the stage handed back once its WGMMAs are done
//   4. out for the rows of the group that carry data (counts), nothing else written: bf16
//      D[row][channel], or (kAct) the activated rows: gate and up rounded to bf16 (as GEMM1's
//      output that the activation stage reads), activated, each row's 128 channels (both
//      warpgroups' 64, their maxima met in shared memory) one 1x128 FP8 block, FP8 q[row][channel]
//      and the scales in GEMM2's layout: no bf16 GEMM1 output, no activation pass
//   5. the combine (GemmOutput::combined): a block that stored a tile counts it for its 128-column
//      block (the stores fenced first); the block whose count completes the column block sums, for
//      those columns, each token's k rows of D in slot order into the output (finalize's
//      arithmetic), then sets the count back to 0. Deterministic: the sums' order is the slots'
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/activation/activate.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_decode {

using namespace wgmma;

constexpr int kConsumers = 2;  // warpgroups of 64 W rows (kAct: 64 channels): the 128 of a tile
constexpr int kThreads = (1 + kConsumers) * 128;
constexpr int kBlocksPerSm = 2;
constexpr int kPipelineBytes = 104 * 1024;  // a block's stages, two blocks to an SM

// A rows read by index (a_by_index): row r of the GEMM is row rows[r] of `a` ([*, K] e4m3, its
// scales k-major [*, K/128] in Params::a_scales); -1: zeros. rows null: A by TMA, as laid out.
struct IndexedA {
  const std::int32_t* rows;
  const std::uint8_t* a;
};

// GEMM1's activated output (kAct): q [rows, I] e4m3, scales in GEMM2's layout (group e's
// [I/128, padded] at offsets[e] * I/128, rows contiguous).
struct ActOut {
  std::uint8_t* q;
  float* scales;
  int inter;
  Activation act;
  float alpha, limit;
  bool ue8m0;
};

// GEMM2's weighted combine (GemmOutput::combined, GroupedGemmArgs::combined): out null, none.
struct CombineOut {
  const std::int32_t* slot_rows;  // [tokens, top_k]
  const float* weights;           // [tokens, top_k] or null (every weight 1)
  std::uint16_t* out;             // [tokens, N] bf16
  std::int32_t* done;             // [ceil(N / 128)] tiles stored per column block: 0 at launch, left 0
  int tokens, top_k;
};

// The instances that may combine (tokens{8,16}_n128_combine): the others are built without it.
template <int kN, bool kAct>
constexpr bool kCombines = !kAct && kN <= 16;

template <int kN, bool kAct>
struct Shape {
  static_assert(kN == 8 || kN == 16 || kN == 32, "row tiles of 8, 16 or 32");
  static constexpr int kWTiles = kAct ? 2 : 1;     // gate and up
  static constexpr int kTileABytes = kN * kTileK;  // the rows: whole 8-row swizzle atoms
  static constexpr int kStageBytes = kTileABytes + kWTiles * kTileN * kTileK;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  // kAct: each consumer warp's row maxima, two tiles' worth (a tile's are read while the next
  // tile's may be written).
  static constexpr int kMaxBytes = kAct ? 2 * kConsumers * 4 * kN * 4 : 0;
  // The 1024-byte alignment, the stages, the row maxima, the barriers (2 per stage), the ring's tile
  // slot and its scale slots ([stages][kN] rows', [stages][kWTiles] W's).
  static constexpr int kSmemBytes =
      1024 + kStages * kStageBytes + kMaxBytes + 2 * kStages * 8 + 32 + kStages * (kN + kWTiles) * 4;
  static constexpr int kTableBytes = 2 * 4 * (1024 + 1);  // fp8_decode's static tile table and row offsets
  static_assert((kSmemBytes + kTableBytes) * kBlocksPerSm <= 228 * 1024 - kBlocksPerSm * 1024, "two blocks to an H200 SM");
};

// The tile table: first[g] the number of group g's first tile (the tiles of kN rows over N's
// 128-column tiles, group after group), first[groups] all tiles; row0[g] = offsets[g] (g <= groups),
// so that a tile's rows come from shared memory too: its first loads need no global round trip after
// the table. One warp, each lane a run of consecutive groups, every count and offset loaded at once.
constexpr int kMaxGroups = 1024;
template <int kN>
__device__ void build_tile_table(const Params& p, int* first, int* row0) {
  const int lane = int(threadIdx.x % 32);
  const int n_tiles = (p.n + kTileN - 1) / kTileN;
  const int per_lane = (p.groups + 31) / 32, g0 = lane * per_lane;
  int tiles[kMaxGroups / 32];
#pragma unroll
  for (int i = 0; i < kMaxGroups / 32; ++i) {
    const int g = g0 + i;
    tiles[i] = i < per_lane && g < p.groups ? (rows_of(p, g) + kN - 1) / kN * n_tiles : 0;
    if (i < per_lane && g < p.groups) row0[g] = p.offsets[g];
  }
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kMaxGroups / 32; ++i) sum += tiles[i];
  int inclusive = sum;
#pragma unroll
  for (int step = 1; step < 32; step *= 2) {
    const int v = __shfl_up_sync(~0u, inclusive, step);
    if (lane >= step) inclusive += v;
  }
  int at = inclusive - sum;
#pragma unroll
  for (int i = 0; i < kMaxGroups / 32; ++i) {
    const int g = g0 + i;
    if (i < per_lane && g < p.groups) first[g] = at;
    at += tiles[i];
  }
  if (lane == 31) {
    first[p.groups] = inclusive;
    row0[p.groups] = p.offsets[p.groups];
  }
}

// The index-th tile (index < first[groups]): its group by binary search in the table. Every lane of
// a warp.
template <int kN>
__device__ __forceinline__ Tile table_tile(const Params& p, const int* first, const int* row0, int index) {
  int lo = 0, hi = p.groups;  // first[lo] <= index < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= index) lo = mid;
    else hi = mid;
  }
  Tile t;
  t.group = lo;
  t.row0 = row0[lo];
  t.padded = row0[lo + 1] - t.row0;
  t.rows = rows_of(p, lo);
  const int m_tiles = (t.rows + kN - 1) / kN, u = index - first[lo];
  t.m0 = u % m_tiles * kN;
  t.n0 = u / m_tiles * kTileN;
  return warp_uniform(t);
}

// Warp 0: per 128 of K, lane 0's TMA of the rows and of the W tile(s), the lanes' cp.async of the
// rows' A scales and the W tiles' scales (produce() of sm90_wgmma.cuh, with kAct's second W tile).
// w_rows: W rows per group (N; kAct 2I), the tile's n0 an output channel.
// 16 bytes from global to shared memory, asynchronously; where !valid, zeros (fallback, a readable
// address, stands in for src).
__device__ __forceinline__ void copy16_async(std::uint32_t dst, const void* src, bool valid, const void* fallback) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(valid ? src : fallback), "r"(valid ? 16 : 0)
               : "memory");
}

template <int kN, bool kAct>
__device__ __forceinline__ void produce_decode(const CUtensorMap& map_a, const CUtensorMap& map_w, const Params& p,
                                               const IndexedA& ia, int w_rows, const Tile& t, const Ring& ring,
                                               int& position) {
  using S = Shape<kN, kAct>;
  const int lane = int(threadIdx.x % 32);
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int n_blocks = (w_rows + kTileN - 1) / kTileN;
  const float* w_scale = p.w_scales + std::size_t(t.group) * k_blocks * n_blocks + t.n0 / kTileN;
  const int up = p.n / kTileN;  // kAct: the up rows' first scale block (I / 128) past the gate's
  const float* a_scale = p.a_scales + std::size_t(t.row0) * k_blocks + t.m0;
  // Rows by index: this lane's 16-byte chunks i = lane + 32 j of the tile's kN x 128 bytes (row
  // i / 8, chunk i % 8), and its row's token for the scales (lane < kN); -1 past the group's data.
  constexpr int kChunks = kN * 8 / 32;
  const bool indexed = ia.rows != nullptr;
  int chunk_token[kChunks], scale_token = -1;
  if (indexed) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int r = (lane + 32 * j) / 8;
      chunk_token[j] = t.m0 + r < t.rows ? __ldg(ia.rows + t.row0 + t.m0 + r) : -1;
    }
    if (lane < kN) scale_token = t.m0 + lane < t.rows ? __ldg(ia.rows + t.row0 + t.m0 + lane) : -1;
  }
  for (int kb = 0; kb < k_blocks; ++kb, ++position) {
    const RingSlot slot = ring_slot(ring, position);
    const int s = slot.stage;
    barrier_wait(ring.empty + 8 * s, slot.parity ^ 1);
    const std::uint32_t a = ring.tiles + std::uint32_t(s * ring.stage_bytes);
    if (lane == 0) {
      barrier_expect_bytes(ring.full + 8 * s, ring.stage_bytes - (indexed ? S::kTileABytes : 0));
      if (!indexed) tma_load(a, &map_a, kb * kTileK, t.row0 + t.m0, ring.full + 8 * s);
      const std::uint64_t policy = l2_evict_first();
      tma_load_hinted(a + ring.a_bytes, &map_w, kb * kTileK, t.group * w_rows + t.n0, ring.full + 8 * s, policy);
      if (kAct)
        tma_load_hinted(a + ring.a_bytes + kTileN * kTileK, &map_w, kb * kTileK, t.group * w_rows + p.n + t.n0,
                        ring.full + 8 * s, policy);
    }
    if (indexed) {
      // Chunk c of row r at chunk c ^ (r % 8) of the row: the 128-byte swizzle of a TMA box.
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int i = lane + 32 * j, r = i / 8, c = i % 8;
        copy16_async(a + std::uint32_t(r * kTileK + ((c ^ (r % 8)) * 16)),
                     ia.a + std::size_t(max(chunk_token[j], 0)) * p.k + kb * kTileK + c * 16, chunk_token[j] >= 0, ia.a);
      }
      if (lane < kN)
        copy4_async(ring.scale_a + s * kN + lane, p.a_scales + std::size_t(max(scale_token, 0)) * k_blocks + kb,
                    scale_token >= 0, p.a_scales);
    } else {
      // rows past the group's (padded) rows get scale 0: the tile's rows there are another group's
#pragma unroll
      for (int r = lane; r < kN; r += 32)
        copy4_async(ring.scale_a + s * kN + r, a_scale + std::size_t(kb) * t.padded + r, t.m0 + r < t.padded, a_scale);
    }
    if (lane < S::kWTiles)
      copy4_async(ring.scale_w + S::kWTiles * s + lane, w_scale + std::size_t(kb) * n_blocks + lane * up, true, w_scale);
    barrier_arrive_when_copied(ring.full + 8 * s);
  }
}

// The activated rows of a tile (kAct): this thread's gate and up sums (rows 8 (i / 4) + 2 (lane % 4)
// + i % 2 of the tile, channels lo and lo + 8 of its 128) rounded to bf16 and activated; each
// row's maximum over the warp's 16 channels, then over the 8 consumer warps' in `maxima`
// ([kConsumers * 4][kN], this tile's buffer), gives its 1x128 scale; FP8 q and the scales out.
template <int kN>
__device__ __forceinline__ void store_activated(const Params& p, const ActOut& out, const Tile& t, const float (&gate)[kN / 2],
                                                const float (&up)[kN / 2], int lo, float* maxima) {
  constexpr int kRegs = kN / 2, kChunks = (kRegs + 7) / 8;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32) - 4;  // consumer warps 0..7
  float x[kChunks * 8];
#pragma unroll
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    float g[8], u[8], a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = chunk * 8 + i;
      g[i] = j < kRegs ? round_to_bf16(gate[j < kRegs ? j : 0]) : 0.0f;
      u[i] = j < kRegs ? round_to_bf16(up[j < kRegs ? j : 0]) : 0.0f;
    }
    switch (out.act) {  // one activation per layer: uniform
      case Activation::silu_and_mul: activation::activate_values<Activation::silu_and_mul>(g, u, out.alpha, out.limit, a); break;
      case Activation::gelu_and_mul: activation::activate_values<Activation::gelu_and_mul>(g, u, out.alpha, out.limit, a); break;
      case Activation::swiglu_oai: activation::activate_values<Activation::swiglu_oai>(g, u, out.alpha, out.limit, a); break;
      case Activation::relu2: activation::activate_values<Activation::relu2>(g, u, out.alpha, out.limit, a); break;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) x[chunk * 8 + i] = a[i];
  }
  // Row r = 8 b + 2 (lane % 4) + h of the tile is this thread's x[4 b + h] and x[4 b + h + 2].
  constexpr int kRowPairs = kN / 8;
#pragma unroll
  for (int b = 0; b < kRowPairs; ++b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = amax_step(amax_step(0.0f, x[4 * b + h]), x[4 * b + h + 2]);
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
      if (lane < 4) maxima[warp * kN + 8 * b + 2 * lane + h] = m;
    }
  }
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 128) : "memory");  // the consumer warpgroups
#pragma unroll
  for (int b = 0; b < kRowPairs; ++b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 8 * b + 2 * (lane % 4) + h;
      float m = 0.0f;
#pragma unroll
      for (int w = 0; w < kConsumers * 4; ++w) m = fmaxf(m, maxima[w * kN + row]);
      if (t.m0 + row >= t.rows) continue;
      const float scale = fp8_scale(m, out.ue8m0);
      const ScaleDivision division(scale, true);
      std::uint8_t* q = out.q + (std::size_t(t.row0) + t.m0 + row) * out.inter + t.n0 + lo;
      q[0] = quantize1(x[4 * b + h], division);
      q[8] = quantize1(x[4 * b + h + 2], division);
      if (warp == 0 && lane < 4)
        out.scales[std::size_t(t.row0) * (out.inter / kTileK) + std::size_t(t.n0 / kTileK) * t.padded + t.m0 + row] = scale;
    }
  }
}

// The consumer warpgroups' part of the combine after a tile's D rows are stored (step 5):
// per_column tiles make a 128-column block; `last` (shared) tells them whether this block's count
// completed it.
__device__ __forceinline__ void combine_after_tile(const Params& p, const CombineOut& cb, const Tile& t, int per_column,
                                                   int& last) {
  __threadfence();  // this thread's D stores, device-wide, before the count
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 128) : "memory");
  const int column = t.n0 / kTileN;
  if (threadIdx.x == 128) last = atomicAdd(cb.done + column, 1) == per_column - 1;
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers * 128) : "memory");
  if (!last) return;
  __threadfence();  // the other blocks' stores, counted before ours
  // Items (token, 8 columns): the column block's 128 columns in 16 vectors per token. The slots come
  // kBatch at a time, their rows' loads all in flight, then are added in slot order. A warp takes 32
  // consecutive items from a start broadcast from lane 0 and every lane runs the slot loop, its loads
  // off where its item is past the block: a loop whose trip count ptxas cannot prove warp-uniform (a
  // loop per lane, or one inside a per-lane branch) makes it keep the tile loop's stage, descriptors
  // and tile in per-lane registers, in the decode GEMMs that never combine too (the same kernels).
  constexpr int kVectors = kTileN / 8, kBatch = 8;
  const int vectors = min(kTileN, p.n - t.n0) / 8, items = cb.tokens * kVectors;
  const int lane = int(threadIdx.x % 32);
  for (int first = warp_uniform(int(threadIdx.x) - 128 - lane); first < items; first += kConsumers * 128) {
    const int item = first + lane;
    const int token = item / kVectors, v = item % kVectors;
    const bool valid = item < items && v < vectors;
    float acc[8] = {};
    for (int j0 = 0; j0 < cb.top_k; j0 += kBatch) {
      int row[kBatch];
      float w[kBatch];
      uint4 raw[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const bool slot_valid = valid && j0 + b < cb.top_k;
        const std::size_t slot = std::size_t(token) * cb.top_k + j0 + b;
        row[b] = slot_valid ? __ldg(cb.slot_rows + slot) : -1;
        w[b] = cb.weights && slot_valid ? __ldg(cb.weights + slot) : 1.0f;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        raw[b] = row[b] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(p.d + std::size_t(row[b]) * p.n + t.n0 + 8 * v))
                             : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (row[b] < 0) continue;
        float x[8];
        unpack_bf16x8(raw[b], x);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], cb.weights ? __fmul_rn(w[b], x[i]) : x[i]);
      }
    }
    if (!valid) continue;
    std::uint16_t* to = cb.out + std::size_t(token) * p.n + t.n0 + 8 * v;
    if (reinterpret_cast<std::uintptr_t>(cb.out) % 16 == 0) {
      *reinterpret_cast<uint4*>(to) = pack_bf16x8(acc);
    } else {  // the caller's output need only be 2-byte aligned
#pragma unroll
      for (int i = 0; i < 8; ++i) to[i] = f32_to_bf16(acc[i]);
    }
  }
  if (threadIdx.x == 128) cb.done[column] = 0;  // every tile of the column block counted: ready for the next launch
}

template <int kN, bool kAct>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    fp8_decode(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p, IndexedA ia,
               ActOut act, CombineOut cb) {
  using S = Shape<kN, kAct>;
  extern __shared__ std::uint8_t smem_raw[];
  Tile* unused = nullptr;
  const Ring ring = ring_layout<kN>(smem_raw, S::kStages, S::kStageBytes, S::kMaxBytes, unused);
  float* maxima = reinterpret_cast<float*>(smem_raw + ((1024 - smem_address(smem_raw) % 1024) % 1024) +
                                           S::kStages * S::kStageBytes);  // [2][kConsumers * 4][kN]
  __shared__ int tile_first[kMaxGroups + 1], tile_row0[kMaxGroups + 1];  // the tile table (build_tile_table)
  __shared__ int combine_last;                 // combine_after_tile's
  if (threadIdx.x == 0) init_ring(ring, true, kConsumers * 128);
  if (threadIdx.x >= 32 && threadIdx.x < 64) build_tile_table<kN>(p, tile_first, tile_row0);
  __syncthreads();
  const int tiles = tile_first[p.groups];
  if (kCombines<kN, kAct> && cb.out && tiles == 0) {  // no slot has a row: every token's sum is 0
    const std::int64_t values = std::int64_t(cb.tokens) * p.n;
    for (std::int64_t i = blockIdx.x * std::int64_t(kThreads) + threadIdx.x; i < values; i += std::int64_t(gridDim.x) * kThreads)
      cb.out[i] = 0;
    return;
  }
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);
  // kAct: the tiles walk I's 128-channel blocks (p.n = I); W has 2I rows per group.
  const int w_rows = kAct ? 2 * p.n : p.n;

  if (warpgroup == 0) {  // the producer: warp 0
    if (threadIdx.x >= 32) return;
    int position = 0;
    for (int index = int(blockIdx.x); index < tiles; index += int(gridDim.x))
      produce_decode<kN, kAct>(map_a, map_w, p, ia, w_rows, table_tile<kN>(p, tile_first, tile_row0, index), ring, position);
    return;
  }

  // Consumer c: W rows c * 64 ... of the tile (kAct: of its gate and of its up tile); this thread
  // holds W rows lo and lo + 8 and, of each 8 rows of the group, the two at 2 * (lane % 4):
  // part[i] is W row lo (i % 4 < 2) or lo + 8, group row 8 (i / 4) + 2 (lane % 4) + i % 2.
  const int c = warpgroup - 1, warp = int(threadIdx.x / 32) % 4;
  const int lo = c * 64 + warp * 16 + lane / 4;
  constexpr int kRegs = kN / 2;
  float acc[S::kWTiles][kRegs], part[S::kWTiles][kRegs] = {};
  const std::uint64_t desc_w0 = smem_descriptor(ring.tiles + std::uint32_t(S::kTileABytes + c * 64 * kTileK));
  const std::uint64_t desc_a0 = smem_descriptor(ring.tiles);
  constexpr std::uint64_t kUpTile = kTileN * kTileK / 16;  // descriptor units
  int position = 0, tiles_done = 0;
  for (int index = int(blockIdx.x); index < tiles; index += int(gridDim.x), ++tiles_done) {
    const Tile t = table_tile<kN>(p, tile_first, tile_row0, index);
#pragma unroll
    for (int w = 0; w < S::kWTiles; ++w)
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[w][i] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb, ++position) {
      const RingSlot slot = ring_slot(ring, position);
      const int s = slot.stage;
      barrier_wait(ring.full + 8 * s, slot.parity);
      // Rows by index came by cp.async (the generic proxy): ordered before the WGMMAs' reads.
      if (ia.rows) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      const std::uint64_t step = std::uint64_t(s) * (S::kStageBytes / 16);
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w) pin(part[w]);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w)
#pragma unroll
        for (int j = 0; j < kTileK / 32; ++j)
          fp8_wgmma_k32<kN>(part[w], desc_w0 + step + w * kUpTile + 2 * j, desc_a0 + step + 2 * j, j > 0);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      float w_scale[S::kWTiles];
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w) w_scale[w] = ring.scale_w[S::kWTiles * s + w];
      const float* a_scale = ring.scale_a + s * kN + 2 * (lane % 4);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w) pin(part[w]);
      float scale[S::kWTiles][kN / 4];  // this thread's rows' w_scale * a_scale, read before the stage goes back
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w)
#pragma unroll
        for (int r = 0; r < kN / 4; ++r) scale[w][r] = w_scale[w] * a_scale[8 * (r / 2) + r % 2];
      barrier_arrive(ring.empty + 8 * s);
#pragma unroll
      for (int w = 0; w < S::kWTiles; ++w)
#pragma unroll
        for (int i = 0; i < kRegs; ++i) acc[w][i] += scale[w][2 * (i / 4) + i % 2] * part[w][i];
    }
    if constexpr (kAct) {
      store_activated<kN>(p, act, t, acc[0], acc[1], lo, maxima + (tiles_done % 2) * kConsumers * 4 * kN);
    } else {
      // D[row][channel]: rows past the group's data and channels past N are not written.
#pragma unroll
      for (int i = 0; i < kRegs; ++i) {
        const int row = t.m0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
        const int channel = t.n0 + lo + (i % 4 < 2 ? 0 : 8);
        if (row < t.rows && channel < p.n)
          p.d[(std::size_t(t.row0) + row) * p.n + channel] = __float2bfloat16_rn(acc[0][i]);
      }
      if constexpr (kCombines<kN, kAct>) {
        if (cb.out) combine_after_tile(p, cb, t, tiles / ((p.n + kTileN - 1) / kTileN), combine_last);
      }
    }
  }
}

// Persistent: at most two blocks per SM, each walking every grid-th tile. kAct: N = 2I (gate
// rows, then up rows), the tiles over I. GemmOutput::combined: workspace holds the column blocks'
// counts (combined_workspace_size).
template <int kN, bool kAct>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, cudaStream_t stream) {
  using S = Shape<kN, kAct>;
  GroupedGemmDesc tiles = desc;
  if (kAct) tiles.n = desc.n / 2;
  TileLaunch l = tile_launch(tiles, args, kN);
  if (l.blocks == 0) {  // no rows: the combine's sums are 0
    if (desc.output == GemmOutput::combined && args.combined.tokens > 0)
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(args.combined.out, 0, sizeof(bf16) * std::size_t(args.combined.tokens * desc.n), stream));
    return;
  }
  l.map_w = tile_map(args.w, desc.groups * desc.n, desc.k, kTileN);
  const unsigned grid = std::min<unsigned>(l.blocks, unsigned(kBlocksPerSm * multiprocessor_count()));
  const ActivatedOut& o = args.activated;
  const ActOut act{static_cast<std::uint8_t*>(o.q), o.scales, int(tiles.n), o.act, o.alpha, o.limit, o.ue8m0};
  // By index, map_a (over max_rows rows of `a`) is never read: the rows come by cp.async.
  require(!desc.a_by_index || args.a_rows, "decode WGMMA GEMM: rows by index need a_rows");
  const IndexedA ia{desc.a_by_index ? args.a_rows : nullptr, static_cast<const std::uint8_t*>(args.a)};
  CombineOut cb{};
  if (desc.output == GemmOutput::combined) {
    require(kCombines<kN, kAct>, "decode WGMMA GEMM: the combine takes the 8- and 16-row tiles");
    const CombinedOut& c = args.combined;
    require(c.slot_rows && c.out && workspace && c.top_k > 0 && c.tokens > 0 && c.tokens < (std::int64_t(1) << 31),
            "decode WGMMA GEMM + combine: slot_rows, out, workspace and tokens, top_k > 0 are required");
    cb = {c.slot_rows, c.weights, reinterpret_cast<std::uint16_t*>(c.out), static_cast<std::int32_t*>(workspace),
          int(c.tokens), c.top_k};
  }
  allow_dynamic_shared(reinterpret_cast<const void*>(&fp8_decode<kN, kAct>), S::kSmemBytes);
  fp8_decode<kN, kAct><<<grid, kThreads, S::kSmemBytes, stream>>>(l.map_a, l.map_w, l.params, ia, act, cb);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_decode");
}

// The combine's counts: one per 128-column block.
inline std::size_t combined_workspace_size(const GroupedGemmDesc& desc) {
  return sizeof(std::int32_t) * std::size_t((desc.n + kTileN - 1) / kTileN);
}

// K in whole 128-blocks (a stage is one); kAct: N = 2I with I a multiple of 128 (a tile's channels
// are one whole scale block), a gated activation; the combine: N a multiple of 8 (16-byte vectors).
inline Status can_implement(const GroupedGemmDesc& desc, bool act) {
  if (desc.groups > kMaxGroups)
    return Status::no("groups: the decode WGMMA kernel's tile table takes at most " + std::to_string(kMaxGroups) + ", given " +
                      std::to_string(desc.groups));
  if (desc.k % kBlock != 0)
    return Status::no("K: the decode WGMMA kernel takes whole 128-K blocks, given " + std::to_string(desc.k));
  if (act && desc.n % (2 * kTileN) != 0)
    return Status::no("activated out: 2I a multiple of 256, given " + std::to_string(desc.n));
  if (desc.output == GemmOutput::combined && desc.n % 8 != 0)
    return Status::no("the combine: N a multiple of 8, given " + std::to_string(desc.n));
  return wgmma::can_implement(desc);
}

}  // namespace moekit::cuda::sm90::fp8_decode
