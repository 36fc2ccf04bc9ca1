// What moekit's TMA + WGMMA grouped GEMM kernels share (sm90_grouped_gemm_fp8_{wgmma,f16}.cu): the
// tile walk over the groups, mbarriers, TMA loads, shared-memory descriptors, and the host's
// tensor maps. Tiles are (group, rows, 128 columns); a stage is one 128-wide K block.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/gemm/grouped_gemm.h"
#include "moekit/quant.h"

namespace moekit::cuda::sm90::wgmma {

constexpr int kTileN = 128;
constexpr int kTileK = 128;  // one scale block per stage
static_assert(kBlock == kTileK, "a stage is one 128-K scale block");

struct Params {
  const float* a_scales;        // group e: [K/128, M_e] at offsets[e] * K/128
  const std::int32_t* offsets;  // [groups + 1]
  const std::int32_t* counts;   // [groups] rows that carry data; null: all of M_e
  const float* w_scales;        // block: [groups, K/128, ceil(N/128)]; channel: [groups, K/128, N]
  __nv_bfloat16* d;             // [rows, N]
  int groups, n, k;
};

struct Tile {
  int group, row0, m0, n0, rows, padded;  // row0 = offsets[group]; m0, n0 within the group
};

// A value all lanes of a warp hold alike, broadcast from lane 0 so that ptxas knows it is: what is
// computed from it (stage indices, barrier addresses, WGMMA descriptors, the branches on it) then
// stays in uniform registers, without a move to them per use or a reconvergence around each branch.
// Every lane of the warp calls it.
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(~0u, v, 0); }
__device__ __forceinline__ int warpgroup_index() { return warp_uniform(int(threadIdx.x / 128)); }
__device__ __forceinline__ Tile warp_uniform(const Tile& t) {
  return {warp_uniform(t.group), warp_uniform(t.row0), warp_uniform(t.m0),
          warp_uniform(t.n0),    warp_uniform(t.rows), warp_uniform(t.padded)};
}

__device__ __forceinline__ int rows_of(const Params& p, int group) {
  return p.counts ? p.counts[group] : p.offsets[group + 1] - p.offsets[group];
}

// The index-th tile of kRows rows, counting the tiles of every group in order; false when there
// are fewer. One warp.
template <int kRows>
__device__ bool find_tile(const Params& p, int index, Tile& tile) {
  const int lane = int(threadIdx.x % 32);
  const int n_tiles = (p.n + kTileN - 1) / kTileN;
  int seen = 0;
  for (int base = 0; base < p.groups; base += 32) {
    const int g = base + lane;
    const int rows = g < p.groups ? rows_of(p, g) : 0;
    const int tiles = (rows + kRows - 1) / kRows * n_tiles;
    int inclusive = tiles;
#pragma unroll
    for (int step = 1; step < 32; step *= 2) {
      const int v = __shfl_up_sync(~0u, inclusive, step);
      if (lane >= step) inclusive += v;
    }
    const int total = __shfl_sync(~0u, inclusive, 31);
    if (seen + total > index) {
      const unsigned past = __ballot_sync(~0u, seen + inclusive > index);
      const int owner = __ffs(int(past)) - 1;
      const int before = __shfl_sync(~0u, inclusive - tiles, owner);
      const int owner_rows = __shfl_sync(~0u, rows, owner);
      const int m_tiles = (owner_rows + kRows - 1) / kRows;
      const int u = index - seen - before;
      tile.group = base + owner;
      tile.row0 = p.offsets[tile.group];
      tile.padded = p.offsets[tile.group + 1] - tile.row0;
      tile.rows = owner_rows;
      tile.m0 = u % m_tiles * kRows;
      tile.n0 = u / m_tiles * kTileN;
      tile = warp_uniform(tile);
      return true;
    }
    seen += total;
  }
  return false;
}

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// With MOEKIT_BARRIER_WATCHDOG (a CMake option for device debugging) a wait that has failed 2^26
// times (seconds) prints the block, thread, barrier and phase, then traps: a hang becomes an error
// that says who waits where.
__device__ __forceinline__ void barrier_wait(std::uint32_t bar, std::uint32_t parity) {
  std::uint32_t done = 0;
#ifdef MOEKIT_BARRIER_WATCHDOG
  std::uint32_t tries = 0;
#endif
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#ifdef MOEKIT_BARRIER_WATCHDOG
    if (!done && ++tries == (1u << 26)) {
      printf("moekit barrier watchdog: block %d thread %d waits on shared 0x%x for parity %u\n", int(blockIdx.x),
             int(threadIdx.x), bar, parity);
      __trap();
    }
#endif
  } while (!done);
}

__device__ __forceinline__ void barrier_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void barrier_expect_bytes(std::uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// A box of the 2-D tensor map at (x = K, y = row) into shared memory; completes bytes on bar.
__device__ __forceinline__ void tma_load(std::uint32_t dst, const CUtensorMap* map, int x, int y, std::uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// An L2 policy under which the lines a load brings are the first to go: for the decode GEMMs' weights, so
// that their stream does not push out what the next layer's kernels reuse — their code, the routing's
// tables, ids and rows. At decode sizes the kernels around the GEMMs spend their time missing on those
// (docs/perf-log/decode.md, twenty-second and twenty-third sessions). Measured against evict-normal for the
// groups whose W several row tiles read: evict-first everywhere was faster there too.
__device__ __forceinline__ std::uint64_t l2_evict_first() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// tma_load with an L2 cache policy (l2_evict_first).
__device__ __forceinline__ void tma_load_hinted(std::uint32_t dst, const CUtensorMap* map, int x, int y, std::uint32_t bar,
                                                std::uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], "
      "%5;\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}

// WGMMA shared-memory descriptor of a K-major tile with 128-byte rows, 128-byte swizzle:
// 8-row atoms of 1024 bytes one after another (stride byte offset 1024).
__device__ __forceinline__ std::uint64_t smem_descriptor(std::uint32_t address) {
  return std::uint64_t((address & 0x3FFFF) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}

// The accumulator operands of a WGMMA: C is the constraint ("+f" in and out, "=f" out only); the
// register lists for its instruction text.
#define MOEKIT_WGMMA_D8(C, I) C(d[I]), C(d[I + 1]), C(d[I + 2]), C(d[I + 3]), C(d[I + 4]), C(d[I + 5]), C(d[I + 6]), C(d[I + 7])
#define MOEKIT_WGMMA_D16(C, I) MOEKIT_WGMMA_D8(C, I), MOEKIT_WGMMA_D8(C, I + 8)
#define MOEKIT_WGMMA_D32(C, I) MOEKIT_WGMMA_D16(C, I), MOEKIT_WGMMA_D16(C, I + 16)
#define MOEKIT_WGMMA_D48(C) MOEKIT_WGMMA_D32(C, 0), MOEKIT_WGMMA_D16(C, 32)
#define MOEKIT_WGMMA_D64(C) MOEKIT_WGMMA_D32(C, 0), MOEKIT_WGMMA_D32(C, 32)
#define MOEKIT_WGMMA_D80(C) MOEKIT_WGMMA_D64(C), MOEKIT_WGMMA_D16(C, 64)
#define MOEKIT_WGMMA_D96(C) MOEKIT_WGMMA_D64(C), MOEKIT_WGMMA_D32(C, 64)
#define MOEKIT_WGMMA_R8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define MOEKIT_WGMMA_R16 MOEKIT_WGMMA_R8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define MOEKIT_WGMMA_R32 MOEKIT_WGMMA_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MOEKIT_WGMMA_R48 MOEKIT_WGMMA_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define MOEKIT_WGMMA_R64 MOEKIT_WGMMA_R48 ", %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MOEKIT_WGMMA_R80 MOEKIT_WGMMA_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define MOEKIT_WGMMA_R96 MOEKIT_WGMMA_R80 ", %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"

// d (+)= a (64 x 32, K-major shared) x b (32 x kN, K-major shared), FP8 e4m3, f32 accumulators (kN / 2
// registers); accumulate = 0: from zero.
template <int kN>
__device__ __forceinline__ void fp8_wgmma_k32(float (&d)[kN / 2], std::uint64_t a, std::uint64_t b, int accumulate) {
  static_assert(kN == 8 || kN == 16 || (kN % 32 == 0 && kN >= 32 && kN <= 192), "WGMMA N of 8, 16, or 32 to 192 in steps of 32");
#define MOEKIT_FP8_K32(N, REGS, AB, SCALE_D) \
  "{\n.reg .pred d;\nsetp.ne.b32 d, %" SCALE_D ", 0;\nwgmma.mma_async.sync.aligned.m64n" N "k32.f32.e4m3.e4m3 {" REGS "}, " AB ", d, 1, 1;\n}\n"
  if constexpr (kN == 8)
    asm volatile(MOEKIT_FP8_K32("8", "%0, %1, %2, %3", "%4, %5", "6")
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 16)
    asm volatile(MOEKIT_FP8_K32("16", MOEKIT_WGMMA_R8, "%8, %9", "10") : MOEKIT_WGMMA_D8("+f", 0) : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 32)
    asm volatile(MOEKIT_FP8_K32("32", MOEKIT_WGMMA_R16, "%16, %17", "18") : MOEKIT_WGMMA_D16("+f", 0) : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 64)
    asm volatile(MOEKIT_FP8_K32("64", MOEKIT_WGMMA_R32, "%32, %33", "34") : MOEKIT_WGMMA_D32("+f", 0) : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 96)
    asm volatile(MOEKIT_FP8_K32("96", MOEKIT_WGMMA_R48, "%48, %49", "50") : MOEKIT_WGMMA_D48("+f") : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 128)
    asm volatile(MOEKIT_FP8_K32("128", MOEKIT_WGMMA_R64, "%64, %65", "66") : MOEKIT_WGMMA_D64("+f") : "l"(a), "l"(b), "r"(accumulate));
  else if constexpr (kN == 160)
    asm volatile(MOEKIT_FP8_K32("160", MOEKIT_WGMMA_R80, "%80, %81", "82") : MOEKIT_WGMMA_D80("+f") : "l"(a), "l"(b), "r"(accumulate));
  else
    asm volatile(MOEKIT_FP8_K32("192", MOEKIT_WGMMA_R96, "%96, %97", "98") : MOEKIT_WGMMA_D96("+f") : "l"(a), "l"(b), "r"(accumulate));
#undef MOEKIT_FP8_K32
}

// Keeps the compiler from moving accesses of the accumulator registers across the async WGMMA.
template <int kN>
__device__ __forceinline__ void pin(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void pin(std::uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The tile's W scales: block scales [K/128, ceil(N/128)] from its column block; channel scales
// [K/128, N] (the first K block's row holds each channel's one scale).
template <bool kChannel>
__device__ __forceinline__ const float* tile_w_scales(const Params& p, const Tile& t) {
  const int k_blocks = (p.k + kTileK - 1) / kTileK, n_blocks = (p.n + kTileN - 1) / kTileN;
  return p.w_scales + std::size_t(t.group) * k_blocks * (kChannel ? p.n : n_blocks) + (kChannel ? 0 : t.n0 / kTileN);
}

// The shared-memory ring of K-block stages: per stage the A (rows x 128) and W (128 x 128) FP8
// tiles, and with block scales the tile's A scales and its W scale. full[s]: the stage is
// loaded; empty[s]: its consumers are done with it.
struct Ring {
  std::uint32_t tiles, full, empty;  // shared addresses: stage s at tiles + s * stage_bytes; 8-byte barriers
  float* scale_a;                    // [stages][rows]
  float* scale_w;                    // [stages]
  int stages, stage_bytes, a_bytes;  // a_bytes: the A tile's, the W tile after it
};

// Arrivals that fill a stage: lane 0's with the TMA's bytes, and where the producer stages block
// scales one more per producer lane, made when that lane's scale copies have landed (cp.async
// tracked by the barrier).
constexpr int full_arrivals(bool stage_scales) { return stage_scales ? 1 + 32 : 1; }

// 4 bytes from global to shared memory, asynchronously; where !valid, zeros (and nothing is
// read: fallback, a readable address, stands in for src).
__device__ __forceinline__ void copy4_async(float* dst, const float* src, bool valid, const float* fallback) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(valid ? src : fallback),
               "r"(valid ? 4 : 0)
               : "memory");
}

// The barrier's arrival for this thread, once its cp.async copies so far have landed.
__device__ __forceinline__ void barrier_arrive_when_copied(std::uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// A block's shared memory: the ring's stages from a 1024-byte-aligned start (swizzled tiles), `gap`
// bytes the kernel keeps for itself, then the ring's barriers, the tile and the stages' scales.
template <int kRows>
__device__ __forceinline__ Ring ring_layout(std::uint8_t* smem_raw, int stages, int stage_bytes, int gap, Tile*& tile) {
  const std::uint32_t raw = smem_address(smem_raw);
  std::uint8_t* smem = smem_raw + ((1024 - raw % 1024) % 1024);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + stages * stage_bytes + gap);
  tile = reinterpret_cast<Tile*>(bars + 2 * stages);
  float* scale_a = reinterpret_cast<float*>(reinterpret_cast<std::uint8_t*>(bars + 2 * stages) + 32);
  const std::uint32_t full = smem_address(bars);
  return {smem_address(smem), full, full + std::uint32_t(stages * 8), scale_a, scale_a + stages * kRows,
          stages,             stage_bytes, kRows * kTileK};
}

// Thread 0 initializes the ring's barriers: full as full_arrivals says, empty with empty_count
// arrivals (the consumer threads that read a stage).
__device__ __forceinline__ void init_ring(const Ring& ring, bool stage_scales, int empty_count) {
  for (int s = 0; s < ring.stages; ++s) {
    barrier_init(ring.full + 8 * s, full_arrivals(stage_scales));
    barrier_init(ring.empty + 8 * s, empty_count);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

// Warp 0 finds the block's tile; thread 0 keeps it in shared memory and initializes the ring's
// barriers (empty: empty_arrivals(tile) arrivals). Then every thread has the tile in t, or false:
// this block has none.
template <bool kChannel, int kRows, class EmptyArrivals>
__device__ __forceinline__ bool start_tile(const Params& p, const Ring& ring, Tile* shared_tile,
                                           EmptyArrivals empty_arrivals, Tile& t) {
  __shared__ int found;
  if (threadIdx.x < 32) {
    Tile mine{};
    const bool ok = find_tile<kRows>(p, int(blockIdx.x), mine);
    if (threadIdx.x == 0) {
      found = ok;
      *shared_tile = mine;
      init_ring(ring, !kChannel, empty_arrivals(mine));
    }
  }
  __syncthreads();
  if (!found) return false;
  t = warp_uniform(*shared_tile);
  return true;
}

// The ring position of a K block: its stage and the parity of that stage's use. A persistent
// block counts its K blocks over all of its tiles, so stages and parities run on across tiles.
struct RingSlot {
  int stage;
  std::uint32_t parity;
};
__device__ __forceinline__ RingSlot ring_slot(const Ring& ring, int position) {
  return {position % ring.stages, std::uint32_t((position / ring.stages) & 1)};
}

// Warp 0 of the producer warpgroup: lane 0 issues the TMA; with kStageScales (block scales) the
// lanes also copy the stage's A and W scales into shared memory by cp.async, which the stage's full
// barrier waits for, so that neither the consumers nor the producer wait on a global load.
// position: the ring position of the tile's first K block; advanced past its last.
template <bool kStageScales, int kRows>
__device__ __forceinline__ void produce(const CUtensorMap& map_a, const CUtensorMap& map_w, const Params& p, const Tile& t,
                                        const Ring& ring, int& position) {
  const int lane = int(threadIdx.x % 32);
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int n_blocks = (p.n + kTileN - 1) / kTileN;
  const float* w_scale = tile_w_scales<false>(p, t);
  const float* a_scale = p.a_scales + std::size_t(t.row0) * k_blocks + t.m0;
  for (int kb = 0; kb < k_blocks; ++kb, ++position) {
    const RingSlot slot = ring_slot(ring, position);
    const int s = slot.stage;
    barrier_wait(ring.empty + 8 * s, slot.parity ^ 1);
    if (lane == 0) {
      barrier_expect_bytes(ring.full + 8 * s, ring.stage_bytes);
      const std::uint32_t a = ring.tiles + std::uint32_t(s * ring.stage_bytes);
      tma_load(a, &map_a, kb * kTileK, t.row0 + t.m0, ring.full + 8 * s);
      tma_load(a + ring.a_bytes, &map_w, kb * kTileK, t.group * p.n + t.n0, ring.full + 8 * s);
    }
    if (kStageScales) {
      // rows past the group's (padded) rows get scale 0: the tile's rows there are another group's
#pragma unroll
      for (int r = lane; r < kRows; r += 32)
        copy4_async(ring.scale_a + s * kRows + r, a_scale + std::size_t(kb) * t.padded + r, t.m0 + r < t.padded, a_scale);
      if (lane == 0) copy4_async(ring.scale_w + s, w_scale + std::size_t(kb) * n_blocks, true, w_scale);
      barrier_arrive_when_copied(ring.full + 8 * s);
    }
  }
}

// Channel scales (a row's one scale; fp8_channel) of rows lo and lo + 8 of the tile's group.
struct RowScales {
  float lo, hi;
};
template <bool kChannel>
__device__ __forceinline__ RowScales row_scales(const Params& p, const Tile& t, int lo) {
  const float* row_scale = p.a_scales + std::size_t(t.row0) * ((p.k + kTileK - 1) / kTileK);
  return {kChannel && lo < t.padded ? __ldg(row_scale + lo) : 0.0f,
          kChannel && lo + 8 < t.padded ? __ldg(row_scale + lo + 8) : 0.0f};
}

// A consumer's accumulator into bf16: rows lo and lo + 8 of the tile's group, of each 8 columns
// from col0 the two this thread holds (acc[i]: row lo (i % 4 < 2) or lo + 8, column col0 + 8 (i / 4)
// + i % 2). Channel scales enter here, as the CPU applies them; rows past the group's data and
// columns past N are not written.
template <bool kChannel, int kCols>
__device__ __forceinline__ void store_bf16(const Params& p, const Tile& t, const float (&acc)[kCols / 2], int lo, int col0,
                                           RowScales scales) {
  const float* w_scale = tile_w_scales<kChannel>(p, t);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = lo + 8 * half;
    if (row >= t.rows) continue;
    const float row_scale = half == 0 ? scales.lo : scales.hi;
    __nv_bfloat16* out = p.d + (std::size_t(t.row0) + row) * p.n + col0;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int col = col0 + 8 * j;
      if (col >= p.n) continue;
      float v0 = acc[4 * j + 2 * half], v1 = acc[4 * j + 2 * half + 1];
      if (kChannel) {
        v0 = v0 * row_scale * __ldg(w_scale + col);
        v1 = v1 * row_scale * __ldg(w_scale + col + 1);
      }
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) = __floats2bfloat162_rn(v0, v1);
    }
  }
}

// ---- host ----

inline PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MOEKIT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    require(found == cudaDriverEntryPointSuccess && f != nullptr, "CUDA driver: cuTensorMapEncodeTiled not found");
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  });
  return fn;
}

// rows x k e4m3, row-major, read in boxes of box_rows x 128 (out-of-bounds reads give zeros).
inline CUtensorMap tile_map(const void* base, std::int64_t rows, std::int64_t k, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k)};
  const cuuint32_t box[2] = {kTileK, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_function()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                                       box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(r == CUDA_SUCCESS, [&] { return "FP8 WGMMA GEMM: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")"; });
  return map;
}

// A launch over every tile that may have rows (blocks 0: none), with its tensor maps and Params.
struct TileLaunch {
  unsigned blocks;
  CUtensorMap map_a, map_w;
  Params params;
};
inline TileLaunch tile_launch(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, int tile_rows) {
  // At most this many tiles have rows: a row tile per tile_rows rows plus a partial one per group.
  const std::int64_t rows = args.counts && desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  if (rows == 0) return {};
  const std::int64_t row_tiles = (rows + tile_rows - 1) / tile_rows + std::min(desc.groups, rows);
  const std::int64_t blocks = row_tiles * ((desc.n + kTileN - 1) / kTileN);
  // Below 2^30: a block's next tile index (index + grid, both below `blocks`) stays an int.
  require(blocks < (std::int64_t(1) << 30), [&] { return "FP8 WGMMA GEMM: too many tiles, " + std::to_string(blocks); });
  return {unsigned(blocks), tile_map(args.a, desc.max_rows, desc.k, tile_rows),
          tile_map(args.w, desc.groups * desc.n, desc.k, kTileN),
          Params{args.a_scales, args.offsets, args.counts, args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                 int(desc.groups), int(desc.n), int(desc.k)}};
}

inline Status can_implement(const GroupedGemmDesc& desc) {
  if (desc.groups * desc.n >= (std::int64_t(1) << 31))
    return Status::no("groups x N: too many W rows for the tensor map, given " + std::to_string(desc.groups * desc.n));
  return Status::ok();
}

}  // namespace moekit::cuda::sm90::wgmma

// The entry points of one instance (sm90_grouped_gemm_instances.h): no workspace; RUN(desc, args, stream).
#define MOEKIT_SM90_TILE_INSTANCE(NAME, ...)                                                               \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                                 \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return wgmma::can_implement(desc); }         \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) { \
    __VA_ARGS__(desc, args, stream);                                                                     \
  }
