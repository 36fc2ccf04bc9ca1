// Grouped GEMM instances: fp8_block with tokens{8,16,32}_n128_wgmma and tokens{8,16}_n128_combine (see
// sm90_grouped_gemm_instances.h): moekit's decode kernel (sm90_grouped_gemm_fp8_decode.cuh), bf16 out;
// the same kernels with GEMM2's weighted combine after the tiles (GemmOutput::combined).
#include "cuda/gemm/sm90_grouped_gemm_fp8_decode.cuh"

namespace moekit::cuda::sm90 {

#define MOEKIT_DECODE_INSTANCE(NAME, N)                                                                   \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc&) { return 0; }                                \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_decode::can_implement(desc, false); } \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void*, cudaStream_t stream) {   \
    fp8_decode::run<N, false>(desc, args, nullptr, stream);                                              \
  }
MOEKIT_DECODE_INSTANCE(fp8_block_decode8, 8)
MOEKIT_DECODE_INSTANCE(fp8_block_decode16, 16)
MOEKIT_DECODE_INSTANCE(fp8_block_decode32, 32)
#undef MOEKIT_DECODE_INSTANCE

#define MOEKIT_DECODE_COMBINE_INSTANCE(NAME, N)                                                               \
  std::size_t NAME##_workspace_size(const GroupedGemmDesc& desc) { return fp8_decode::combined_workspace_size(desc); } \
  Status NAME##_can_implement(const GroupedGemmDesc& desc) { return fp8_decode::can_implement(desc, false); }     \
  void NAME##_run(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, cudaStream_t stream) { \
    fp8_decode::run<N, false>(desc, args, workspace, stream);                                                  \
  }
MOEKIT_DECODE_COMBINE_INSTANCE(fp8_block_decode8_combine, 8)
MOEKIT_DECODE_COMBINE_INSTANCE(fp8_block_decode16_combine, 16)
#undef MOEKIT_DECODE_COMBINE_INSTANCE

}  // namespace moekit::cuda::sm90
