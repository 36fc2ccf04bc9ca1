// Grouped GEMM instances: fp8_block with m128_n128_persistent, m128_n128_persistent_x2 and
// m128_n128_persistent_tma (see sm90_grouped_gemm_instances.h): moekit's persistent FP8 block-scaled
// kernel (sm90_grouped_gemm_fp8_block.cuh), 128 x 128 tiles, one block or clusters of two (W
// multicast), or one block writing its rows by TMA bulk stores (the same kernel).
#include "cuda/gemm/sm90_grouped_gemm_fp8_block.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_n128, GemmOutput::bf16, fp8_block::run<128, Activation::silu_and_mul>)
MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_n128_x2, GemmOutput::bf16, fp8_block::run<128, Activation::silu_and_mul, 128, 2>)
MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_n128_tma, GemmOutput::bf16, fp8_block::run<128, Activation::silu_and_mul, 128, 1, true>)

}  // namespace moekit::cuda::sm90
