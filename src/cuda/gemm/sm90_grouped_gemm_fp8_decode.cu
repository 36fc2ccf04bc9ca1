// Grouped GEMM instances: fp8_block with tokens{8,16,32}_n128_wgmma (see
// sm90_grouped_gemm_instances.h): moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh), bf16 out.
#include "cuda/gemm/sm90_grouped_gemm_fp8_decode.cuh"

namespace moekit::cuda::sm90 {

#define MOEKIT_DECODE_INSTANCE(NAME, N)                                                                   \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                                \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_decode::can_implement(desc, false); } \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {   \
    fp8_decode::run<N, false>(desc, args, stream);                                                       \
  }
MOEKIT_DECODE_INSTANCE(fp8_block_decode8, 8)
MOEKIT_DECODE_INSTANCE(fp8_block_decode16, 16)
MOEKIT_DECODE_INSTANCE(fp8_block_decode32, 32)
#undef MOEKIT_DECODE_INSTANCE

}  // namespace moekit::cuda::sm90
