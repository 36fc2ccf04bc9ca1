// Grouped GEMM instances: fp8_block with tokens{8,16,32}_n256_act (see sm90_grouped_gemm_instances.h):
// moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh) with GEMM1's activation and
// requantization in its epilogue (GemmOutput::activated_fp8).
#include "cuda/gemm/sm90_grouped_gemm_fp8_decode.cuh"

namespace moekit::cuda::sm90 {

#define MOEKIT_DECODE_ACT_INSTANCE(NAME, N)                                                               \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                                \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_decode::can_implement(desc, true); } \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {   \
    fp8_decode::run<N, true>(desc, args, nullptr, stream);                                                        \
  }
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode8_act, 8)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode16_act, 16)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode32_act, 32)
#undef MOEKIT_DECODE_ACT_INSTANCE

}  // namespace moekit::cuda::sm90
