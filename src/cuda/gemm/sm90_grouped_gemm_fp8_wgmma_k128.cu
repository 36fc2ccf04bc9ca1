// Grouped GEMM instance: fp8_channel with m192_n128_wgmma_k128 (see sm90_grouped_gemm_instances.h):
// moekit's FP8 WGMMA kernel (sm90_grouped_gemm_fp8_wgmma.cuh) with the tensor core summing 128 of
// K per f32 promotion, DESIGN §8's `fast` (the default for FP8 layers), for rowwise and per-tensor
// scales. With block scales, and with 128- and 64-row tiles, it measured slower than CUTLASS's
// tiles (docs/PERF.md), so those instances are not built.
#include "cuda/gemm/sm90_grouped_gemm_fp8_wgmma.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_TILE_INSTANCE(fp8_channel_wgmma192_k128, fp8_wgmma::run<true, 192, 128>)

}  // namespace moekit::cuda::sm90
