// Split K over the grid (stream-K) for moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh):
// when few experts are hit there are fewer tiles than the grid's blocks, and a block streams W
// only as fast as one SM can. Here the tiles' K blocks, tile after tile, are one list of `units`
// that the grid's blocks share evenly, whatever the tile count, so every SM streams W:
//   1. block b takes the units [b U / G, (b + 1) U / G): whole tiles, and at either end of its
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

// The tiles of kRows rows over every group (as find_tile counts them). One warp.
template <int kRows>
__device__ int count_tiles(const Params& p) {
  const int lane = int(threadIdx.x % 32);
  const int n_tiles = (p.n + wgmma::kTileN - 1) / wgmma::kTileN;
  int total = 0;
  for (int base = 0; base < p.groups; base += 32) {
    const int g = base + lane;
    int tiles = g < p.groups ? (wgmma::rows_of(p, g) + kRows - 1) / kRows * n_tiles : 0;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) tiles += __shfl_xor_sync(~0u, tiles, offset);
    total += tiles;
  }
  return total;
}

// A block's walk over its work: unsplit, the tiles blockIdx.x, + gridDim.x, ... whole; split, its
// share of the units.
struct Walk {
  bool split;
  int k_blocks, index;            // unsplit: the next tile
  std::int64_t units, begin, at;  // split: all units, this block's share [begin, end), the next unit
  std::int64_t end;
};

struct Segment {
  Tile tile;
  int index, kb0, kb1;  // the tile's number, its K blocks [kb0, kb1)
};

__device__ __forceinline__ std::int64_t share_begin(std::int64_t units, int b) { return units * b / int(gridDim.x); }
// The block whose share holds unit u: the largest b with share_begin(b) <= u.
__device__ __forceinline__ int share_owner(std::int64_t units, std::int64_t u) {
  const std::int64_t grid = gridDim.x;
  return int(((u + 1) * grid + units - 1) / units - 1);
}

// One warp, every lane.
template <int kRows>
__device__ Walk start_walk(const Params& p, bool split) {
  Walk w{};
  w.split = split;
  w.k_blocks = (p.k + wgmma::kTileK - 1) / wgmma::kTileK;
  w.index = int(blockIdx.x);
  if (split) {
    w.units = std::int64_t(count_tiles<kRows>(p)) * w.k_blocks;
    w.begin = w.at = share_begin(w.units, int(blockIdx.x));
    w.end = share_begin(w.units, int(blockIdx.x) + 1);
  }
  return w;
}

// The walk's next segment; false past the block's work. One warp, every lane.
template <int kRows>
__device__ bool next_segment(const Params& p, Walk& w, Segment& s) {
  if (!w.split) {
    if (!wgmma::find_tile<kRows>(p, w.index, s.tile)) return false;
    s.index = w.index;
    s.kb0 = 0;
    s.kb1 = w.k_blocks;
    w.index += int(gridDim.x);
    return true;
  }
  if (w.at >= w.end) return false;
  s.index = int(w.at / w.k_blocks);
  s.kb0 = int(w.at % w.k_blocks);
  s.kb1 = int(min(std::int64_t(w.k_blocks), s.kb0 + (w.end - w.at)));
  wgmma::find_tile<kRows>(p, s.index, s.tile);
  w.at += s.kb1 - s.kb0;
  return true;
}

__device__ __forceinline__ bool whole(const Walk& w, const Segment& s) { return s.kb0 == 0 && s.kb1 == w.k_blocks; }

// Block b's slot for the tile whose first unit is `first`: its share's first segment (0) when the
// share begins inside the tile, else its last (1).
__device__ __forceinline__ int slot_of(std::int64_t units, int b, std::int64_t first) {
  return share_begin(units, b) >= first ? 0 : 1;
}

// A split segment's sums acc (this consumer thread's, `thread` of `threads`) meet the tile's other
// contributors': true when this block arrived last, acc then holding the tile's sums in block
// order; false: another block finishes the tile. Every consumer thread; sync() is their barrier,
// last a shared int.
template <int kW, int kR, class Sync>
__device__ bool meet(const Split& split, const Walk& w, const Segment& s, float (&acc)[kW][kR], int thread, int threads,
                     Sync sync, int* last) {
  constexpr int kFloats = kW * kR;
  const std::int64_t first = std::int64_t(s.index) * w.k_blocks;
  const int first_block = share_owner(w.units, first), last_block = share_owner(w.units, first + w.k_blocks - 1);
  const int me = int(blockIdx.x);
  auto slot = [&](int b) {
    return split.partials + (std::size_t(b) * 2 + std::size_t(slot_of(w.units, b, first))) * kFloats * threads + thread;
  };
  float* mine = slot(me);
#pragma unroll
  for (int j = 0; j < kW; ++j)
#pragma unroll
    for (int i = 0; i < kR; ++i) __stcg(mine + (j * kR + i) * threads, acc[j][i]);
  __threadfence();
  sync();
  if (thread == 0) {
    const int arrived = atomicAdd(split.counters + s.index, 1) + 1;
    const bool done = arrived == last_block - first_block + 1;
    if (done) split.counters[s.index] = 0;
    *last = done;
  }
  sync();
  const bool done = *last != 0;
  if (!done) return false;
  __threadfence();
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
