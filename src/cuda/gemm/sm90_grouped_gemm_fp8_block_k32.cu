// Grouped GEMM instance: fp8_block with m128_n128_persistent_k32 (see sm90_grouped_gemm_instances.h):
// moekit's persistent FP8 block-scaled kernel (sm90_grouped_gemm_fp8_block.cuh), 128 x 128 tiles, f32
// promotion every 32 of K (`--fp8-accumulation exact`: GEMM1, requantized next). Each WGMMA starts
// from zero and enters the f32 accumulator times the block scales at once, the two part buffers
// taking turns; the same sums as the FP8 WGMMA kernel's tiles (sm90_grouped_gemm_fp8_wgmma.cuh), bit
// for bit, which it replaces for block scales from 16 rows per group (measured faster on every case).
#include "cuda/gemm/sm90_grouped_gemm_fp8_block.cuh"

namespace moekit::cuda::sm90 {

MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_n128_k32, GemmOutput::bf16, fp8_block::run<128, Activation::silu_and_mul, 32>)

}  // namespace moekit::cuda::sm90
