// Finalize: launcher and op entry.
#include "cuda/finalize/finalize.h"

#include <algorithm>
#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/finalize/finalize.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::finalize {
namespace {

constexpr int kPerThread = 2;
constexpr int kBatch = 4;
constexpr std::int64_t kMaxTopK = 4096;

template <int kVec>
void launch(const Problem& p, const FinParams& kp, cudaStream_t stream) {
  const std::int64_t vectors = p.hidden / kVec;
  // Few tokens: a row's columns split over up to 2 blocks per SM in all, parts of at least 64
  // threads' vectors (deepseek-v3 at T=1: 7 blocks of 64 threads, where one block of 448 walked
  // the 8 slots' loads alone).
  const std::int64_t splits = std::clamp<std::int64_t>(std::min(std::int64_t(multiprocessor_count()) * 2 / p.tokens,
                                                                ceil_div(vectors, std::int64_t(64) * kPerThread)),
                                                       1, 65535);
  // Threads so that each owns kPerThread vectors of its part of a row (whole warps, at most 512).
  const int threads = int(std::clamp<std::int64_t>(ceil_div(ceil_div(ceil_div(vectors, splits), kPerThread), 32) * 32, 32, 512));
  const std::size_t shared = std::size_t(p.top_k) * 8;
  const dim3 blocks(grid_size(p.tokens, 1, std::int64_t(multiprocessor_count()) * 64), unsigned(splits));
  finalize_tokens<kVec, kPerThread, kBatch><<<blocks, threads, shared, stream>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("finalize_tokens");
}

}  // namespace

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "finalize T=" << tokens << " k=" << top_k << " H=" << hidden;
  return os.str();
}

Status can_implement(const Problem& p) {
  if (p.tokens < 0 || p.top_k < 1 || p.top_k > kMaxTopK)
    return Status::no("finalize: needs T >= 0 and 1 <= k <= " + std::to_string(kMaxTopK));
  if (p.hidden < 1 || p.hidden >= (std::int64_t(1) << 30))
    return Status::no("finalize: hidden size must lie in [1, 2^30), given " + std::to_string(p.hidden));
  return Status::ok();
}

std::size_t workspace_size(const Problem&) { return 0; }

void run(const Problem& p, const Args& args, core::Workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  if (p.tokens == 0) return;
  require(args.expert_out && args.slot_rows && args.out, "finalize: expert_out, slot_rows and out are required");
  FinParams kp{};
  kp.expert_out = static_cast<const std::uint16_t*>(args.expert_out);
  kp.slot_rows = args.slot_rows;
  kp.weights = args.topk_weights;
  kp.out = static_cast<std::uint16_t*>(args.out);
  kp.tokens = p.tokens;
  kp.top_k = p.top_k;
  kp.hidden = int(p.hidden);
  const bool vector = p.hidden % 8 == 0 && reinterpret_cast<std::uintptr_t>(args.expert_out) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(args.out) % 16 == 0;
  if (vector) launch<8>(p, kp, as_cuda(stream));
  else launch<1>(p, kp, as_cuda(stream));
}

}  // namespace moekit::cuda::finalize
