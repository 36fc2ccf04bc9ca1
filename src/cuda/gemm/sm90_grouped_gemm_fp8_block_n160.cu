// Grouped GEMM instance: fp8_block with m128_n160_persistent (see sm90_grouped_gemm_instances.h):
// moekit's persistent FP8 block-scaled kernel (sm90_grouped_gemm_fp8_block.cuh), 128 x 160 tiles.
#include "cuda/gemm/sm90_grouped_gemm_fp8_block.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_n160, GemmOutput::bf16, fp8_block::run<160, Activation::silu_and_mul>)

}  // namespace moekit::cuda::sm90
