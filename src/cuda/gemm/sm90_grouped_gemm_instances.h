// The list of compiled grouped GEMM kernels: (kind, tile, name). Each has its own file
// sm90_grouped_gemm_<name>.cu so that the heavy CUTLASS translation units build in parallel
// (rows8, wgmma, f16, decode and the persistent block-scaled tiles are moekit's own kernels, in
// sm90_grouped_gemm_fp8_{block_rows8,wgmma,wgmma_k128,f16,decode,decode_act,block_n128,block_n160,block_n192,block_act,
// block_swap,block_k32}.cu).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "cuda/gemm/grouped_gemm.h"

#define MOEKIT_SM90_GROUPED_GEMM_LIST(X)                                   \
  X(GemmKind::bf16, GemmTile::m128_n128_cooperative, bf16_m128)            \
  X(GemmKind::bf16, GemmTile::m64_n128_pingpong, bf16_m64)                 \
  X(GemmKind::fp8_block, GemmTile::m128_n128_cooperative, fp8_block_m128)  \
  X(GemmKind::fp8_block, GemmTile::m64_n128_pingpong, fp8_block_m64)       \
  X(GemmKind::fp8_channel, GemmTile::m128_n128_cooperative, fp8_channel_m128) \
  X(GemmKind::fp8_channel, GemmTile::m64_n128_pingpong, fp8_channel_m64)   \
  X(GemmKind::fp8_block, GemmTile::rows8_warp_mma, fp8_block_rows8)        \
  X(GemmKind::fp8_block, GemmTile::m64_n128_wgmma, fp8_block_wgmma64)       \
  X(GemmKind::fp8_channel, GemmTile::m192_n128_wgmma, fp8_channel_wgmma192) \
  X(GemmKind::fp8_channel, GemmTile::m128_n128_wgmma, fp8_channel_wgmma128) \
  X(GemmKind::fp8_channel, GemmTile::m64_n128_wgmma, fp8_channel_wgmma64)   \
  X(GemmKind::fp8_channel, GemmTile::m192_n128_wgmma_k128, fp8_channel_wgmma192_k128) \
  X(GemmKind::fp8_block, GemmTile::m128_n128_f16, fp8_block_f16_128)         \
  X(GemmKind::fp8_block, GemmTile::m64_n128_f16, fp8_block_f16_64)           \
  X(GemmKind::fp8_channel, GemmTile::m128_n128_f16, fp8_channel_f16_128)     \
  X(GemmKind::fp8_channel, GemmTile::m64_n128_f16, fp8_channel_f16_64)     \
  X(GemmKind::fp8_block, GemmTile::tokens8_n128_wgmma, fp8_block_decode8)     \
  X(GemmKind::fp8_block, GemmTile::tokens16_n128_wgmma, fp8_block_decode16)   \
  X(GemmKind::fp8_block, GemmTile::tokens32_n128_wgmma, fp8_block_decode32)   \
  X(GemmKind::fp8_block, GemmTile::m128_n128_persistent, fp8_block_n128)       \
  X(GemmKind::fp8_block, GemmTile::m128_n192_persistent, fp8_block_n192)       \
  X(GemmKind::fp8_block, GemmTile::m128_n256_persistent_act, fp8_block_act)    \
  X(GemmKind::fp8_block, GemmTile::tokens192_n128_persistent, fp8_block_swap)   \
  X(GemmKind::fp8_block, GemmTile::m128_n128_persistent_k32, fp8_block_n128_k32) \
  X(GemmKind::fp8_block, GemmTile::tokens8_n256_act, fp8_block_decode8_act)      \
  X(GemmKind::fp8_block, GemmTile::tokens16_n256_act, fp8_block_decode16_act)    \
  X(GemmKind::fp8_block, GemmTile::tokens32_n256_act, fp8_block_decode32_act)    \
  X(GemmKind::fp8_block, GemmTile::m128_n128_persistent_x2, fp8_block_n128_x2)   \
  X(GemmKind::fp8_block, GemmTile::m128_n192_persistent_x2, fp8_block_n192_x2)   \
  X(GemmKind::fp8_block, GemmTile::m128_n256_persistent_act_x2, fp8_block_act_x2) \
  X(GemmKind::fp8_block, GemmTile::tokens192_n128_persistent_x2, fp8_block_swap_x2) \
  X(GemmKind::fp8_block, GemmTile::tokens8_n128_combine, fp8_block_decode8_combine) \
  X(GemmKind::fp8_block, GemmTile::tokens16_n128_combine, fp8_block_decode16_combine) \
  X(GemmKind::fp8_block, GemmTile::m128_n160_persistent, fp8_block_n160)            \
  X(GemmKind::fp8_block, GemmTile::m128_n128_persistent_tma, fp8_block_n128_tma)    \
  X(GemmKind::fp8_block, GemmTile::m128_n192_persistent_tma, fp8_block_n192_tma)

namespace moekit::cuda::sm90 {

#define MOEKIT_DECLARE(KIND, TILE, NAME)                                     \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc& desc);            \
  Status NAME##_can_implement(const GroupedGemmDesc& desc);                  \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, cudaStream_t stream);
MOEKIT_SM90_GROUPED_GEMM_LIST(MOEKIT_DECLARE)
#undef MOEKIT_DECLARE

}  // namespace moekit::cuda::sm90
