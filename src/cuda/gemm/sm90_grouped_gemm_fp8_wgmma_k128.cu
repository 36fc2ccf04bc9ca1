// Grouped GEMM instances: fp8_block and fp8_channel with m192_n128_wgmma_k128,
// m128_n128_wgmma_k128 and m64_n128_wgmma_k128 (see sm90_grouped_gemm_instances.h): moekit's
// persistent FP8 WGMMA kernel (sm90_grouped_gemm_fp8_wgmma.cuh) with the tensor core summing 128
// of K per f32 promotion, DESIGN §8's `fast` (the default for FP8 layers).
#include "cuda/gemm/sm90_grouped_gemm_fp8_wgmma.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma192_k128, fp8_wgmma::run<false, 192, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma128_k128, fp8_wgmma::run<false, 128, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma64_k128, fp8_wgmma::run<false, 64, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma192_k128, fp8_wgmma::run<true, 192, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma128_k128, fp8_wgmma::run<true, 128, 128>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma64_k128, fp8_wgmma::run<true, 64, 128>)

}  // namespace moekit::cuda::sm90
