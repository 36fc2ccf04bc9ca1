// Grouped GEMM instances: fp8_block with tokens{8,16,32}_n256_act and tokens{8,16}_n256_act_splitk (see
// sm90_grouped_gemm_instances.h): moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh) with GEMM1's
// activation and requantization in its epilogue (GemmOutput::activated_fp8); the split-K tiles run the
// same kernels with the blocks sharing the tiles' K blocks.
#include "cuda/gemm/sm90_grouped_gemm_fp8_decode.cuh"

namespace moekit::cuda::sm90 {

#define MOEKIT_DECODE_ACT_INSTANCE(NAME, N, SPLIT)                                                           \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc& desc) {                                        \
    return fp8_decode::workspace_size<N, true, SPLIT>(desc);                                                \
  }                                                                                                       \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_decode::can_implement(desc, true); } \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, cudaStream_t stream) { \
    fp8_decode::run<N, true, SPLIT>(desc, args, workspace, stream);                                        \
  }
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode8_act, 8, false)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode16_act, 16, false)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode32_act, 32, false)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode8_act_splitk, 8, true)
MOEKIT_DECODE_ACT_INSTANCE(fp8_block_decode16_act_splitk, 16, true)
#undef MOEKIT_DECODE_ACT_INSTANCE

}  // namespace moekit::cuda::sm90
