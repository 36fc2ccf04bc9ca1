// Grouped GEMM instances: fp8_channel with m192_n128_wgmma, m128_n128_wgmma and m64_n128_wgmma, and
// fp8_block with m64_n128_wgmma (see sm90_grouped_gemm_instances.h; block scales take the persistent
// kernel's m128_n128_persistent_k32 from 16 rows per group): moekit's FP8 WGMMA kernel
// (sm90_grouped_gemm_fp8_wgmma.cuh) with f32 promotion every 32 of K, for `--fp8-accumulation
// exact`: every WGMMA starts from zero, sums 32 of K and enters the f32 accumulator times the
// block scales at once. A WGMMA sums its products at reduced precision (about 4e-4 from f32 at the
// GEMM output even for one 32-wide K step); chaining four per 128 of K (`fast`) gives 6.4e-4.
#include "cuda/gemm/sm90_grouped_gemm_fp8_wgmma.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_TILE_INSTANCE(fp8_block_wgmma64, fp8_wgmma::run<false, 64, 32>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma192, fp8_wgmma::run<true, 192, 32>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma128, fp8_wgmma::run<true, 128, 32>)
MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma64, fp8_wgmma::run<true, 64, 32>)

}  // namespace moekit::cuda::sm90
