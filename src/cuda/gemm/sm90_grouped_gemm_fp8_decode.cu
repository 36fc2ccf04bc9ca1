// moekit's FP8 grouped GEMM for few rows per group (decode, the masked format): the weights are
// WGMMA's 64-row operand and the group's rows its N of 8, 16 or 32 ("swap AB"), so that a row
// tile of 8 tokens costs 8 rows of A, not 64, and the tensor core never is the limit: the W
// stream is. fp8_block, f32 promotion every 128 of K (four chained WGMMAs; `fast`, the
// tensor_core sums of gemm_sums).
//   1. persistent blocks (two per SM) walk the (group, kN-row tile, 128-column tile) tiles of
//      sm90_wgmma.cuh, b, b + grid, ...; the ring of stages runs on across a block's tiles
//   2. warp 0 (producer): per 128 of K, TMA of the rows (kN x 128) and of the 128 x 128 W tile,
//      and cp.async of the stage's block scales (the rows' and the W tile's) into shared memory
//   3. two consumer warpgroups, 64 W rows each: per stage four WGMMAs m64 n kN k32 chained, then
//      acc += (w_scale * a_scale[row]) * part, the stage handed back once its WGMMAs are done
//   4. bf16 out, D[row][channel], for the rows of the group that carry data (counts); nothing
//      else is written
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/sm90_grouped_gemm_instances.h"
#include "cuda/gemm/sm90_wgmma.cuh"

namespace moekit::cuda::sm90::fp8_decode {

using namespace wgmma;

constexpr int kConsumers = 2;  // warpgroups of 64 W rows: the 128 of a tile
constexpr int kThreads = (1 + kConsumers) * 128;
constexpr int kBlocksPerSm = 2;
constexpr int kPipelineBytes = 104 * 1024;  // a block's stages, two blocks to an SM

template <int kN>
struct Shape {
  static_assert(kN == 8 || kN == 16 || kN == 32, "row tiles of 8, 16 or 32");
  static constexpr int kTileABytes = kN * kTileK;  // the rows: whole 8-row swizzle atoms
  static constexpr int kStageBytes = kTileABytes + kTileN * kTileK;
  static constexpr int kStages = kPipelineBytes / kStageBytes;
  // The 1024-byte alignment, the stages, the barriers (2 per stage), the ring's tile slot and its
  // scale slots ([stages][kN] rows', [stages] W's).
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 32 + kStages * (kN + 1) * 4;
  static_assert(kSmemBytes * kBlocksPerSm <= 228 * 1024 - kBlocksPerSm * 1024, "two blocks to an H200 SM");
};

template <int kN>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    fp8_decode(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w, Params p) {
  using S = Shape<kN>;
  extern __shared__ std::uint8_t smem_raw[];
  Tile* unused = nullptr;
  const Ring ring = ring_layout<kN>(smem_raw, S::kStages, S::kStageBytes, 0, unused);
  if (threadIdx.x == 0) init_ring(ring, true, kConsumers * 128);
  __syncthreads();
  const int k_blocks = (p.k + kTileK - 1) / kTileK;
  const int warpgroup = warpgroup_index(), lane = int(threadIdx.x % 32);

  if (warpgroup == 0) {  // the producer: warp 0
    if (threadIdx.x >= 32) return;
    int position = 0;
    Tile t;
    for (int index = int(blockIdx.x); find_tile<kN>(p, index, t); index += int(gridDim.x))
      produce<true, kN>(map_a, map_w, p, t, ring, position);
    return;
  }

  // Consumer c: W rows c * 64 ... of the tile; this thread holds W rows lo and lo + 8 and, of each
  // 8 rows of the group, the two at 2 * (lane % 4): part[i] is W row lo (i % 4 < 2) or lo + 8,
  // group row 8 (i / 4) + 2 (lane % 4) + i % 2.
  const int c = warpgroup - 1, warp = int(threadIdx.x / 32) % 4;
  const int lo = c * 64 + warp * 16 + lane / 4;
  constexpr int kRegs = kN / 2;
  float acc[kRegs], part[kRegs] = {};
  const std::uint64_t desc_w0 = smem_descriptor(ring.tiles + std::uint32_t(S::kTileABytes + c * 64 * kTileK));
  const std::uint64_t desc_a0 = smem_descriptor(ring.tiles);
  int position = 0;
  Tile t;
  for (int index = int(blockIdx.x); find_tile<kN>(p, index, t); index += int(gridDim.x)) {
#pragma unroll
    for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb, ++position) {
      const RingSlot slot = ring_slot(ring, position);
      const int s = slot.stage;
      barrier_wait(ring.full + 8 * s, slot.parity);
      const std::uint64_t step = std::uint64_t(s) * (S::kStageBytes / 16);
      pin(part);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int j = 0; j < kTileK / 32; ++j) fp8_wgmma_k32<kN>(part, desc_w0 + step + 2 * j, desc_a0 + step + 2 * j, j > 0);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      const float w_scale = ring.scale_w[s];
      const float* a_scale = ring.scale_a + s * kN + 2 * (lane % 4);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      pin(part);
      float scale[kN / 4];  // this thread's rows' w_scale * a_scale, read before the stage goes back
#pragma unroll
      for (int r = 0; r < kN / 4; ++r) scale[r] = w_scale * a_scale[8 * (r / 2) + r % 2];
      barrier_arrive(ring.empty + 8 * s);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] += scale[2 * (i / 4) + i % 2] * part[i];
    }
    // D[row][channel]: rows past the group's data and channels past N are not written.
#pragma unroll
    for (int i = 0; i < kRegs; ++i) {
      const int row = t.m0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2;
      const int channel = t.n0 + lo + (i % 4 < 2 ? 0 : 8);
      if (row < t.rows && channel < p.n)
        p.d[(std::size_t(t.row0) + row) * p.n + channel] = __float2bfloat16_rn(acc[i]);
    }
  }
}

// Persistent: at most two blocks per SM, each walking every grid-th tile.
template <int kN>
void run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  using S = Shape<kN>;
  TileLaunch l = tile_launch(desc, args, kN);
  if (l.blocks == 0) return;
  const unsigned grid = std::min<unsigned>(l.blocks, unsigned(kBlocksPerSm * multiprocessor_count()));
  allow_dynamic_shared(reinterpret_cast<const void*>(&fp8_decode<kN>), S::kSmemBytes);
  fp8_decode<kN><<<grid, kThreads, S::kSmemBytes, stream>>>(l.map_a, l.map_w, l.params);
  MOEKIT_CUDA_CHECK_LAUNCH("fp8_decode");
}

}  // namespace moekit::cuda::sm90::fp8_decode

namespace moekit::cuda::sm90 {

// K in whole 128-blocks (a stage is one), N in whole 16-row halves of the consumers' 8-row pairs.
#define MOEKIT_DECODE_INSTANCE(NAME, N)                                                                 \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                              \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) {                                           \
    if (desc.k % kBlock != 0)                                                                          \
      return Status::no("K: the decode WGMMA kernel takes whole 128-K blocks, given " + std::to_string(desc.k)); \
    return wgmma::can_implement(desc);                                                                 \
  }                                                                                                    \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) { \
    fp8_decode::run<N>(desc, args, stream);                                                            \
  }
MOEKIT_DECODE_INSTANCE(fp8_block_decode8, 8)
MOEKIT_DECODE_INSTANCE(fp8_block_decode16, 16)
MOEKIT_DECODE_INSTANCE(fp8_block_decode32, 32)
#undef MOEKIT_DECODE_INSTANCE

}  // namespace moekit::cuda::sm90
