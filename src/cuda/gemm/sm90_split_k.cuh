// Split K over the grid (stream-K) for moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh):
// when few experts are hit there are fewer tiles than the grid's blocks, and a block streams W
// only as fast as one SM can. Here the tiles' K blocks, tile after tile, are one list of `units`
// that the grid's blocks share evenly, whatever the tile count, so every SM streams W:
//   1. block b takes the units [b U / G, (b + 1) U / G) (G: the grid, at most U): whole tiles, and at either end of its
//      share a segment of one tile's K blocks (a tile's contributors are consecutive blocks)
//   2. a segment short of its tile's K: the block's sums into its slot (its share's first or last
//      segment), then a count of the tile's arrivals; the last contributor to arrive adds every
//      contributor's sums in block order (the same bits whoever arrives last) and runs the epilogue
// Counters: zero on entry, and the last contributor sets its tile's back to zero (left zero).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::split_k {

using wgmma::Params;
using wgmma::Tile;

struct Split {
  bool on = false;
  std::int32_t* counters = nullptr;  // [tiles] arrivals per tile
  float* partials = nullptr;         // [grid][2][floats per slot]: a block's first and last segment's sums
};

// The decode kernel's tile table: first[g] the number of the group's first tile (the tiles of kRows
// rows over N's 128-column tiles, group after group, as find_tile counts them), first[groups] all
// tiles. Built once per block in shared memory (one warp: a load of every count at once), so that a
// tile is found by a binary search there, not by a scan over the counts in global memory per tile.
constexpr int kMaxGroups = 1024;
template <int kRows>
__device__ void build_tile_table(const Params& p, int* first) {
  const int lane = int(threadIdx.x % 32);
  const int n_tiles = (p.n + wgmma::kTileN - 1) / wgmma::kTileN;
  const int per_lane = (p.groups + 31) / 32, g0 = lane * per_lane;  // this lane's groups, consecutive
  int tiles[kMaxGroups / 32];
#pragma unroll
  for (int i = 0; i < kMaxGroups / 32; ++i) {
    const int g = g0 + i;
    tiles[i] = i < per_lane && g < p.groups ? (wgmma::rows_of(p, g) + kRows - 1) / kRows * n_tiles : 0;
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
  if (lane == 31) first[p.groups] = inclusive;
}

// The index-th tile (index < first[groups]) from the table: the group by binary search.
template <int kRows>
__device__ __forceinline__ Tile table_tile(const Params& p, const int* first, int index) {
  int lo = 0, hi = p.groups;  // first[lo] <= index < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= index) lo = mid;
    else hi = mid;
  }
  Tile t;
  t.group = lo;
  t.row0 = p.offsets[lo];
  t.padded = p.offsets[lo + 1] - t.row0;
  t.rows = wgmma::rows_of(p, lo);
  const int m_tiles = (t.rows + kRows - 1) / kRows, u = index - first[lo];
  t.m0 = u % m_tiles * kRows;
  t.n0 = u / m_tiles * wgmma::kTileN;
  return t;
}

// A block's walk over its work: unsplit, the tiles blockIdx.x, + gridDim.x, ... whole; split, its
// share of the units, the first min(grid, units) blocks sharing them (every share non-empty).
struct Walk {
  bool split;
  int k_blocks, tiles, index;     // all tiles; unsplit: the next tile
  int blocks;                     // split: the blocks that share the units
  std::int64_t units, begin, at;  // split: all units, this block's share [begin, end), the next unit
  std::int64_t end;
};

struct Segment {
  Tile tile;
  int index, kb0, kb1;  // the tile's number, its K blocks [kb0, kb1)
};

__device__ __forceinline__ std::int64_t share_begin(const Walk& w, int b) { return w.units * b / w.blocks; }
// The block whose share holds unit u: the largest b with share_begin(b) <= u.
__device__ __forceinline__ int share_owner(const Walk& w, std::int64_t u) {
  return int(((u + 1) * w.blocks + w.units - 1) / w.units - 1);
}

// Every thread of the block, after the table is built.
__device__ inline Walk start_walk(const Params& p, const int* first, bool split) {
  Walk w{};
  w.split = split;
  w.k_blocks = (p.k + wgmma::kTileK - 1) / wgmma::kTileK;
  w.tiles = first[p.groups];
  w.index = int(blockIdx.x);
  if (split) {
    w.units = std::int64_t(w.tiles) * w.k_blocks;
    w.blocks = int(min(std::int64_t(gridDim.x), w.units));
    const int b = int(blockIdx.x);
    w.begin = w.at = b < w.blocks ? share_begin(w, b) : 0;
    w.end = b < w.blocks ? share_begin(w, b + 1) : 0;
  }
  return w;
}

// The walk's next segment; false past the block's work.
template <int kRows>
__device__ bool next_segment(const Params& p, const int* first, Walk& w, Segment& s) {
  if (!w.split) {
    if (w.index >= w.tiles) return false;
    s.index = w.index;
    s.kb0 = 0;
    s.kb1 = w.k_blocks;
    w.index += int(gridDim.x);
  } else {
    if (w.at >= w.end) return false;
    s.index = int(w.at / w.k_blocks);
    s.kb0 = int(w.at % w.k_blocks);
    s.kb1 = int(min(std::int64_t(w.k_blocks), s.kb0 + (w.end - w.at)));
    w.at += s.kb1 - s.kb0;
  }
  s.tile = wgmma::warp_uniform(table_tile<kRows>(p, first, s.index));
  return true;
}

__device__ __forceinline__ bool whole(const Walk& w, const Segment& s) { return s.kb0 == 0 && s.kb1 == w.k_blocks; }

// Block b's slot for the tile whose first unit is `first`: its share's first segment (0) when the
// share begins inside the tile, else its last (1).
__device__ __forceinline__ int slot_of(const Walk& w, int b, std::int64_t first) { return share_begin(w, b) >= first ? 0 : 1; }

// A split segment's sums acc (this consumer thread's, `thread` of `threads`) meet the tile's other
// contributors': true when this block arrived last, acc then holding the tile's sums in block
// order; false: another block finishes the tile. Every consumer thread; sync() is their barrier,
// last a shared int.
template <int kW, int kR, class Sync>
__device__ bool meet(const Split& split, const Walk& w, const Segment& s, float (&acc)[kW][kR], int thread, int threads,
                     Sync sync, int* last) {
  constexpr int kFloats = kW * kR;
  const std::int64_t first = std::int64_t(s.index) * w.k_blocks;
  const int first_block = share_owner(w, first), last_block = share_owner(w, first + w.k_blocks - 1);
  const int me = int(blockIdx.x);
  auto slot = [&](int b) {
    return split.partials + (std::size_t(b) * 2 + std::size_t(slot_of(w, b, first))) * kFloats * threads + thread;
  };
  float* mine = slot(me);
#pragma unroll
  for (int j = 0; j < kW; ++j)
#pragma unroll
    for (int i = 0; i < kR; ++i) __stcg(mine + (j * kR + i) * threads, acc[j][i]);
  // The block's stores, then one arrival that releases them at GPU scope (and acquires the earlier
  // arrivals' sums); the barrier passes the answer, and what it acquired, to every thread.
  sync();
  if (thread == 0) {
    int arrived;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(arrived) : "l"(split.counters + s.index) : "memory");
    const bool done = arrived + 1 == last_block - first_block + 1;
    if (done) split.counters[s.index] = 0;
    *last = done;
  }
  sync();
  if (*last == 0) return false;
  float sum[kW][kR] = {};
  for (int b = first_block; b <= last_block; ++b) {
    const float* theirs = slot(b);
#pragma unroll
    for (int j = 0; j < kW; ++j)
#pragma unroll
      for (int i = 0; i < kR; ++i) sum[j][i] += b == me ? acc[j][i] : __ldcg(theirs + (j * kR + i) * threads);
  }
#pragma unroll
  for (int j = 0; j < kW; ++j)
#pragma unroll
    for (int i = 0; i < kR; ++i) acc[j][i] = sum[j][i];
  return true;
}

}  // namespace moekit::cuda::sm90::split_k
