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
#include <algorithm>
#include <cstdint>
#include <string>

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
  if constexpr (kN == 128) {
    asm volatile(
        "{\n.reg .pred zero;\nsetp.ne.b32 zero, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, zero, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(0));
  } else {
    static_assert(kN == 64, "WGMMA N of 128 or 64");
    asm volatile(
        "{\n.reg .pred zero;\nsetp.ne.b32 zero, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, zero, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(0));
  }
}

template <bool kChannel, int kRows>
__global__ void __launch_bounds__(Shape<kRows>::kThreads, 1)
    fp8_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p) {
  using S = Shape<kRows>;
  constexpr int kStages = S::kStages, kStageBytes = S::kStageBytes, kCols = S::kWarpgroupCols;
  extern __shared__ std::uint8_t smem_raw[];
  // The swizzled tiles want 1024-byte alignment; barriers and the tile after them.
  const std::uint32_t raw = smem_address(smem_raw);
  std::uint8_t* smem = smem_raw + ((1024 - raw % 1024) % 1024);
  const std::uint32_t tiles = smem_address(smem);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + kStages * kStageBytes);
  auto* shared_tile = reinterpret_cast<Tile*>(bars + 2 * kStages);
  float* scale_a = reinterpret_cast<float*>(reinterpret_cast<std::uint8_t*>(bars + 2 * kStages) + 32);
  float* scale_w = scale_a + kStages * kRows;
  __shared__ int found;
  const std::uint32_t full = smem_address(bars), empty = full + kStages * 8;
  const Ring ring{tiles, full, empty, scale_a, scale_w, kStages, kStageBytes, S::kTileABytes};

  if (threadIdx.x < 32) {
    Tile t{};
    const bool ok = find_tile<kRows>(p, int(blockIdx.x), t);
    if (threadIdx.x == 0) {
      found = ok;
      *shared_tile = t;
      for (int s = 0; s < kStages; ++s) {
        barrier_init(full + 8 * s, full_arrivals(kChannel));
        barrier_init(empty + 8 * s, S::busy(t.m0, t.rows) * 4);  // one arrive per busy consumer warp
      }
      asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    }
  }
  __syncthreads();
  if (!found) return;
  const Tile t = *shared_tile;
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
  const int lo = t.m0 + local, hi = lo + 8;
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
  const float* w_scale = tile_w_scales<kChannel>(p, t);
  const float* row_scale = p.a_scales + std::size_t(t.row0) * k_blocks;
  const float row_lo = kChannel && lo < t.padded ? __ldg(row_scale + lo) : 0.0f;
  const float row_hi = kChannel && hi < t.padded ? __ldg(row_scale + hi) : 0.0f;
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
    if (lane == 0) barrier_arrive(empty + 8 * s);
  }

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? lo : hi;
    if (row >= t.rows) continue;
    const float row_scale = half == 0 ? row_lo : row_hi;
    const int col0 = t.n0 + S::col_of(c) + 2 * (lane % 4);
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

template <bool kChannel, int kRows>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kRows>;
  // At most this many tiles have rows: a row tile per kRows rows plus a partial one per group.
  const std::int64_t rows = args.counts && desc.data_rows > 0 ? desc.data_rows : desc.max_rows;
  if (rows == 0) return;
  const std::int64_t row_tiles = (rows + kRows - 1) / kRows + std::min(desc.groups, rows);
  const std::int64_t blocks = row_tiles * ((desc.n + kTileN - 1) / kTileN);
  require(blocks < (std::int64_t(1) << 31), "FP8 WGMMA GEMM: too many tiles, " + std::to_string(blocks));
  // Every call, as the attribute belongs to the current device (CUTLASS's adapter does the same).
  MOEKIT_CUDA_CHECK(
      cudaFuncSetAttribute(fp8_wgmma<kChannel, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
  const CUtensorMap map_a = tile_map(args.a, desc.max_rows, desc.k, kRows);
  const CUtensorMap map_w = tile_map(args.w, desc.groups * desc.n, desc.k, kTileN);
  const Params p{args.a_scales, args.offsets, args.counts, args.w_scales, reinterpret_cast<__nv_bfloat16*>(args.d),
                 int(desc.groups), int(desc.n), int(desc.k)};
  fp8_wgmma<kChannel, kRows><<<unsigned(blocks), S::kThreads, S::kSmemBytes, stream>>>(map_a, map_w, p);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_wgmma");
}

}  // namespace

#define MOEKIT_WGMMA_INSTANCE(NAME, CHANNEL, ROWS)                                                    \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                            \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return can_implement(desc); }           \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) { \
    run<CHANNEL, ROWS>(desc, args, stream);                                                          \
  }
MOEKIT_WGMMA_INSTANCE(fp8_block_wgmma192, false, 192)
MOEKIT_WGMMA_INSTANCE(fp8_block_wgmma128, false, 128)
MOEKIT_WGMMA_INSTANCE(fp8_block_wgmma64, false, 64)
MOEKIT_WGMMA_INSTANCE(fp8_channel_wgmma192, true, 192)
MOEKIT_WGMMA_INSTANCE(fp8_channel_wgmma128, true, 128)
MOEKIT_WGMMA_INSTANCE(fp8_channel_wgmma64, true, 64)
#undef MOEKIT_WGMMA_INSTANCE

}  // namespace moekit::cuda::sm90
