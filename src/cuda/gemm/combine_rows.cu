// The persistent tiles' combine, host side, and the kernel that starts its counts (combine_rows.cuh).
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/gemm/combine_rows.cuh"

namespace moekit::cuda::combine {
namespace {

__global__ void __launch_bounds__(256) start_counts(CombineOut cb, int n, int col_tiles, int cols) {
  const std::int64_t items = std::int64_t(cb.tokens) * col_tiles;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < items; i += std::int64_t(gridDim.x) * blockDim.x) {
    const int token = int(i / col_tiles), c = int(i % col_tiles);
    int live = 0;
    for (int j = 0; j < cb.top_k; ++j) live += __ldg(cb.slot_rows + std::size_t(token) * cb.top_k + j) >= 0 ? 1 : 0;
    cb.done[i] = -live;
    if (live == 0)
      for (int col = c * cols; col < min(n, (c + 1) * cols); ++col) cb.out[std::size_t(token) * n + col] = 0;
  }
}

std::int64_t max_tokens(const GroupedGemmDesc& desc) { return desc.data_rows > 0 ? desc.data_rows : desc.max_rows; }

}  // namespace

std::size_t persistent_workspace_size(const GroupedGemmDesc& desc, int cols) {
  return sizeof(std::int32_t) * std::size_t(max_tokens(desc)) * std::size_t((desc.n + cols - 1) / cols);
}

void zero_output(const CombinedOut& c, std::int64_t n, cudaStream_t stream) {
  if (c.tokens > 0) MOEKIT_CUDA_CHECK(cudaMemsetAsync(c.out, 0, sizeof(bf16) * std::size_t(c.tokens * n), stream));
}

CombineOut start_persistent(const GroupedGemmDesc& desc, const GroupedGemmArgs& args, void* workspace, int cols,
                            cudaStream_t stream) {
  const CombinedOut& c = args.combined;
  require(c.slot_rows && c.row_token && c.out && workspace && c.top_k > 0 && c.tokens > 0,
          "persistent GEMM + combine: slot_rows, row_token, out, workspace and tokens, top_k > 0 are required");
  require(c.tokens <= max_tokens(desc), [&] {
    return "persistent GEMM + combine: at most " + std::to_string(max_tokens(desc)) + " tokens (the rows of data), given " +
           std::to_string(c.tokens);
  });
  const CombineOut cb{c.slot_rows, c.weights, c.row_token, reinterpret_cast<std::uint16_t*>(c.out),
                      static_cast<std::int32_t*>(workspace), int(c.tokens), c.top_k};
  const int col_tiles = int((desc.n + cols - 1) / cols);
  start_counts<<<grid_size(c.tokens * col_tiles, 256), 256, 0, stream>>>(cb, int(desc.n), col_tiles, cols);
  MOEKIT_CUDA_CHECK_LAUNCH("start_counts");
  return cb;
}

}  // namespace moekit::cuda::combine
