// Grouped GEMM instances: fp8_block with m128_n256_persistent_act and m128_n256_persistent_act_x2 (see
// sm90_grouped_gemm_instances.h): GEMM1 + activation + requantization on moekit's persistent
// block-scaled kernel (sm90_grouped_gemm_fp8_block.cuh), one kernel per gated activation, launched on
// one block or clusters of two (W multicast).
#include "cuda/gemm/sm90_grouped_gemm_fp8_block.cuh"

namespace moekit::cuda::sm90 {
namespace {

template <int kCluster>
void run_activated(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, cudaStream_t stream) {
  switch (args.activated.act) {
    case Activation::silu_and_mul: return fp8_block::run<256, Activation::silu_and_mul, 128, kCluster>(desc, args, stream);
    case Activation::gelu_and_mul: return fp8_block::run<256, Activation::gelu_and_mul, 128, kCluster>(desc, args, stream);
    case Activation::swiglu_oai: return fp8_block::run<256, Activation::swiglu_oai, 128, kCluster>(desc, args, stream);
    case Activation::relu2: break;
  }
  require(false, "activated GEMM1: relu2 is not gated (GEMM1 is I wide), it has no fused form");
}

}  // namespace

MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_act, GemmOutput::activated_fp8, run_activated<1>)
MOEKIT_SM90_FP8_BLOCK_INSTANCE(fp8_block_act_x2, GemmOutput::activated_fp8, run_activated<2>)

}  // namespace moekit::cuda::sm90
