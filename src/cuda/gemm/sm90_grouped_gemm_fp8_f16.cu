// Grouped GEMM instances: fp8_block and fp8_channel with m128_n128_f16 and m64_n128_f16 (see
// sm90_grouped_gemm_instances.h). FP8 operands multiplied by f16 WGMMAs. An e4m3 value is an f16
// value exactly, and the f16 tensor-core path sums its products about as f32 does, where the FP8
// path keeps about 13 bits (4e-4 from the CPU's f32 sums at the GEMM output, docs/PERF.md). So a
// 128-wide K block chains its 8 WGMMAs in the tensor core and enters the f32 accumulator once,
// times its scales, as the CPU computes out[m,n] = sum_kb a_s * w_s * sum_{k in kb} a_q * w_q.
//   1. block x: the x-th (group, row tile, 128-column tile), as sm90_wgmma.cuh walks them
//   2. warp 0 (producer): per K block, TMA of the FP8 A and W tiles into a ring of stages, and the
//      stage's block scales into shared memory (sm90_wgmma.cuh)
//   3. the 2 consumer warpgroups: while the WGMMAs of block kb run, they convert block kb + 1:
//      together W's 128x128 tile to f16 in one of two buffers (the WGMMA's B, shared memory), and
//      each thread its own A fragment in registers (the WGMMA's A); the FP8 stage is free after
//      that. Then acc += scale * part, and a barrier of both warpgroups hands over the next W.
//      K is permuted within a block so that both conversions read 16 bytes at a time: the thread
//      that holds A columns {2q, 2q+1, 2q+8, 2q+9} of 16-wide K step j (the WGMMA's register
//      layout) takes FP8 columns 32q + 4j + {0, 1, 2, 3}, and W's f16 tile puts FP8 column
//      32q + 4j + 2h + e at column 16j + 2q + 8h + e; the products and their sum are the same.
//   4. bf16 out for the rows of the group that carry data (counts); nothing else is written
#include <cstdint>

#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90 {
namespace {

using namespace wgmma;

constexpr int kConsumers = 2;
constexpr int kThreads = (1 + kConsumers) * 128;
constexpr int kConverters = kConsumers * 128;  // the threads that convert W together
constexpr int kW16Bytes = kTileN * kTileK * 2;   // [2 K halves][128 rows][128 bytes], 128-byte swizzle
constexpr int kPipelineBytes = 120 * 1024;       // the FP8 ring; two f16 W tiles besides
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
constexpr int kBarrierConverted = 1;  // named barrier: the next W tile is in f16

// A tile of kRows rows: 128 (two warpgroups of 64 rows) or 64 (two warpgroups of 64 columns).
template <int kRows>
struct Shape {
  static_assert(kRows == 128 || kRows == 64, "row tiles of 128 or 64");
  static constexpr int kCols = kRows == 64 ? 64 : 128;  // the WGMMA's N
  static constexpr int kTileABytes = kRows * kTileK;
  static constexpr int kStageBytes = kTileABytes + kTileN * kTileK;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kW16Bytes + 2 * kStages * 8 + 32 +
                                    kStages * (kRows + 1) * 4;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of an H200 block");
  static constexpr int row_of(int c) { return kRows == 64 ? 0 : c * 64; }
  static constexpr int col_of(int c) { return kRows == 64 ? c * 64 : 0; }
  // Consumers without rows in the tile still convert W, but compute nothing.
  static __device__ bool computes(int c, int m0, int rows) { return kRows == 64 || c * 64 < rows - m0; }
};

__device__ __forceinline__ uint4 load_shared16(std::uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address));
  return v;
}

__device__ __forceinline__ void store_shared4(std::uint32_t address, std::uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(address), "r"(v) : "memory");
}

// The four e4m3 values of a word (low byte first) as two f16x2 (low half first): bytes 0-1 and
// bytes 2-3; exact.
__device__ __forceinline__ void f16x2_of(std::uint32_t four_fp8, std::uint32_t& low, std::uint32_t& high) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(low), "=r"(high)
      : "r"(four_fp8));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows, 128-byte swizzle.
__device__ __forceinline__ std::uint32_t swizzled(int row, int chunk) {
  return std::uint32_t(row * 128 + ((chunk ^ (row % 8)) * 16));
}

// The W tile of a stage (128 rows x 128 FP8, swizzled) into f16 (two 64-wide K halves, each 128
// rows x 128 bytes, swizzled), permuted as the file comment says. Converter i of the 256 takes
// FP8 chunk 2q + half of rows row0 + 32 it (it < 4): 16 columns, 32q + 16 half + [0, 16), which
// are K steps j = 4 half + w (word w of the chunk), f16 columns 16 (j % 4) + 2q + 8h (h: the
// word's 16-bit half), that is 16-byte chunk 2w + h of the row at byte 4q. A warp's 32 stores of
// one instruction fall in 32 banks; its loads, 8 lanes at a time, in 8 different chunk slots.
struct WConversion {
  std::uint32_t src;  // the first FP8 chunk within the W tile
  std::uint32_t dst;  // the first f16 row and byte within a W16 buffer, with bits 4-6 = row % 8
  __device__ explicit WConversion(int i) {
    const int q = i % 4, r8 = (i / 4) % 8, half = (i / 32) % 2;
    const int row0 = (i / 64) * 8 + r8;
    src = swizzled(row0, 2 * q + half);
    dst = std::uint32_t(half * kTileN * 128 + row0 * 128 + 4 * q) | std::uint32_t(r8 << 4);
  }
  // Chunk c of a row sits at slot c ^ (row % 8): the XOR of dst's bits 4-6 with c.
  __device__ __forceinline__ void run(std::uint32_t w8, std::uint32_t w16) const {
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const uint4 v = load_shared16(w8 + src + std::uint32_t(it * 32 * 128));
      const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
      const std::uint32_t base = w16 + std::uint32_t(it * 32 * 128);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        std::uint32_t f16[2];
        f16x2_of(words[w], f16[0], f16[1]);
#pragma unroll
        for (int h = 0; h < 2; ++h) store_shared4(base + (dst ^ std::uint32_t((2 * w + h) << 4)), f16[h]);
      }
    }
  }
};
static_assert(kConverters == 256, "WConversion: 256 converters, 4 chunks each");

// A thread's A fragment of a block: tile rows lo and lo + 8, FP8 columns 32q + [0, 32) of each,
// as the f16 register operand of the 8 WGMMAs (4 registers each).
struct AConversion {
  std::uint32_t src[2][2];  // [row lo / hi][chunk 2q / 2q + 1]
  __device__ AConversion(int lo, int q) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) src[r][c] = swizzled(lo + 8 * r, 2 * q + c);
  }
  __device__ __forceinline__ void run(std::uint32_t a8, std::uint32_t (&frag)[32]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint4 lo = load_shared16(a8 + src[r][0]);
      const uint4 hi = load_shared16(a8 + src[r][1]);
      const std::uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) f16x2_of(words[j], frag[4 * j + r], frag[4 * j + 2 + r]);  // columns 2q, 2q + 1 and 2q + 8, 2q + 9 of step j
    }
  }
};

// d = a (64x16 f16, registers) x b (16xN f16, K-major shared), plus d with kAdd; f32, N/2
// registers. Without kAdd, d is only written: the compiler keeps no old value for it.
template <int kN, bool kAdd>
__device__ __forceinline__ void wgmma_f16_k16(float (&d)[kN / 2], const std::uint32_t* a, std::uint64_t b) {
  static_assert(kN == 128 || kN == 64, "WGMMA N of 128 or 64");
#define MOEKIT_F16_K16(N, REGS, A, ADD) \
  "{\n.reg .pred add;\nsetp.ne.b32 add, %" ADD ", 0;\nwgmma.mma_async.sync.aligned.m64n" N "k16.f32.f16.f16 {" REGS "}, " A ", add, 1, 1, 0;\n}\n"
#define MOEKIT_F16_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(kAdd ? 1 : 0)
  if constexpr (kN == 128 && kAdd)
    asm volatile(MOEKIT_F16_K16("128", MOEKIT_WGMMA_R64, "{%64, %65, %66, %67}, %68", "69") : MOEKIT_WGMMA_D64("+f") : MOEKIT_F16_IN);
  else if constexpr (kN == 128)
    asm volatile(MOEKIT_F16_K16("128", MOEKIT_WGMMA_R64, "{%64, %65, %66, %67}, %68", "69") : MOEKIT_WGMMA_D64("=f") : MOEKIT_F16_IN);
  else if constexpr (kAdd)
    asm volatile(MOEKIT_F16_K16("64", MOEKIT_WGMMA_R32, "{%32, %33, %34, %35}, %36", "37") : MOEKIT_WGMMA_D32("+f", 0) : MOEKIT_F16_IN);
  else
    asm volatile(MOEKIT_F16_K16("64", MOEKIT_WGMMA_R32, "{%32, %33, %34, %35}, %36", "37") : MOEKIT_WGMMA_D32("=f", 0) : MOEKIT_F16_IN);
#undef MOEKIT_F16_IN
#undef MOEKIT_F16_K16
}

template <bool kChannel, int kRows>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_f16(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p) {
  using S = Shape<kRows>;
  constexpr int kStages = S::kStages, kStageBytes = S::kStageBytes, kCols = S::kCols;
  // ---- shared memory: the FP8 stages, two f16 W tiles, barriers, the tile, the stages' scales
  extern __shared__ std::uint8_t smem_raw[];
  Tile* shared_tile = nullptr;
  const Ring ring = ring_layout<kRows>(smem_raw, kStages, kStageBytes, 2 * kW16Bytes, shared_tile);
  const std::uint32_t tiles = ring.tiles, w16 = tiles + kStages * kStageBytes, full = ring.full, empty = ring.empty;
  const float *scale_a = ring.scale_a, *scale_w = ring.scale_w;
  Tile t;
  // empty: every consumer thread arrives after its own reads of a stage
  if (!start_tile<kChannel, kRows>(p, ring, shared_tile, [](const Tile&) { return kConverters; }, t)) return;
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);

  // ---- producer
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (threadIdx.x < 32) {
      int position = 0;  // one tile per block
      produce<!kChannel, kRows>(map_a, map_w, p, t, ring, position);
    }
    return;
  }

  // ---- consumers: 64 rows x kCols columns from (row_of(c), col_of(c)); this thread holds rows lo
  // and lo + 8, and of each 8 columns the two at 2q
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  const int c = warpgroup - 1, warp = int(threadIdx.x / 32) % 4, q = lane % 4;
  const bool computes = S::computes(c, t.m0, t.rows);
  const int local = S::row_of(c) + warp * 16 + lane / 4;  // row lo within the tile
  const int lo = t.m0 + local;  // and lo + 8
  const WConversion w_conversion(int(threadIdx.x) - 128);
  const AConversion a_conversion(local, q);
  constexpr int kRegs = kCols / 2;
  float acc[kRegs], part[kRegs];
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
  // Two A fragments and their scales: block kb's in [kb % 2] (the even and odd blocks of an
  // unrolled pair, so that no fragment is ever copied).
  std::uint32_t frag[2][32];
  float s_lo[2] = {1.0f, 1.0f}, s_hi[2] = {1.0f, 1.0f};

  // Block kb out of its FP8 stage: W into f16 buffer kb % 2, this thread's A fragment and scales
  // into [kb % 2]; then the stage goes back to the producer, and the f16 W, written through the
  // generic proxy, is fenced for the WGMMAs (async proxy). The barrier after it: both halves of W.
  auto convert = [&](int kb, std::uint32_t(&into)[32], float& into_lo, float& into_hi) {
    const int s = kb % kStages;
    barrier_wait(full + 8 * s, (kb / kStages) & 1);
    const std::uint32_t stage = tiles + std::uint32_t(s * kStageBytes);
    w_conversion.run(stage + S::kTileABytes, w16 + std::uint32_t((kb % 2) * kW16Bytes));
    if (computes) {
      a_conversion.run(stage, into);
      if (!kChannel) {
        into_lo = scale_a[s * kRows + local] * scale_w[s];
        into_hi = scale_a[s * kRows + local + 8] * scale_w[s];
      }
    }
    barrier_arrive(empty + 8 * s);  // every thread, after its own reads
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };
  // The unaligned form: the two warpgroups reach it from different instructions (the loop of a
  // warpgroup without rows, block() of one with them); bar.sync promises one instruction, and
  // compute-sanitizer synccheck reported the divergence.
  auto converted = [] { asm volatile("barrier.sync %0, %1;\n" ::"n"(kBarrierConverted), "n"(kConverters) : "memory"); };

  convert(0, frag[0], s_lo[0], s_hi[0]);
  converted();
  if (!computes) {  // convert W with the other warpgroup, nothing else (no WGMMA on a divergent path)
    for (int kb = 1; kb < k_blocks; ++kb) {
      convert(kb, frag[kb % 2], s_lo[kb % 2], s_hi[kb % 2]);
      converted();
    }
    return;
  }
  // Block kb: its 8 WGMMAs; block kb + 1 converted while they run; then acc += scale * part.
  auto block = [&](int kb, const std::uint32_t(&use)[32], std::uint32_t(&fill)[32], int now, int next) {
    const std::uint32_t b = w16 + std::uint32_t((kb % 2) * kW16Bytes + S::col_of(c) * 128);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_f16_k16<kCols, false>(part, use, smem_descriptor(b));
#pragma unroll
    for (int j = 1; j < 8; ++j)
      wgmma_f16_k16<kCols, true>(part, use + 4 * j, smem_descriptor(b + std::uint32_t((j / 4) * kTileN * 128 + 32 * (j % 4))));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    if (kb + 1 < k_blocks) convert(kb + 1, fill, s_lo[next], s_hi[next]);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    pin(part);
    // part[i]: row lo (i % 4 < 2) or hi, column 8 (i / 4) + 2q + i % 2
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] += kChannel ? part[i] : (i % 4 < 2 ? s_lo[now] : s_hi[now]) * part[i];
    if (kb + 1 < k_blocks) converted();
  };
  for (int kb = 0; kb < k_blocks; kb += 2) {
    block(kb, frag[0], frag[1], 0, 1);
    if (kb + 1 < k_blocks) block(kb + 1, frag[1], frag[0], 1, 0);
  }

  store_bf16<kChannel, kCols>(p, t, acc, lo, t.n0 + S::col_of(c) + 2 * q, row_scales<kChannel>(p, t, lo));
}

template <bool kChannel, int kRows>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  const TileLaunch l = tile_launch(desc, args, kRows);
  if (l.blocks == 0) return;
  allow_dynamic_shared(reinterpret_cast<const void*>(&fp8_f16<kChannel, kRows>), Shape<kRows>::kSmemBytes);
  fp8_f16<kChannel, kRows><<<l.blocks, kThreads, Shape<kRows>::kSmemBytes, stream>>>(l.map_a, l.map_w, l.params);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_f16");
}

}  // namespace

MOEKIT_SM90_TILE_INSTANCE(fp8_block_f16_128, run<false, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_block_f16_64, run<false, 64>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_f16_128, run<true, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_f16_64, run<true, 64>)

}  // namespace moekit::cuda::sm90
