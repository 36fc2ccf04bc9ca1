// Shared experts: one thread per output slot, a grid-stride loop over T (k + S) slots.
#include "cuda/shared/append.h"

#include <climits>
#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"

namespace moekit::cuda::shared {
namespace {

constexpr int kThreads = 256;

__global__ void append_shared(Problem p, Args a) {
  const std::int64_t k = p.top_k, width = k + p.shared, slots = p.tokens * width;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < slots;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / width, j = i - t * width;
    if (j < k) {
      // A routed id moves past the shared experts of the ranks before its own (core/shared.h); an
      // id outside [0, E) is no expert.
      const std::int64_t id = a.topk_ids[t * k + j];
      a.out_ids[i] = id < 0 || id >= p.experts ? -1 : std::int32_t(id + id / p.local_experts * p.shared);
      a.out_weights[i] = a.topk_weights[t * k + j];
    } else {
      a.out_ids[i] = std::int32_t(p.first_shared + (j - k));
      a.out_weights[i] = p.weight;
    }
  }
}

}  // namespace

Problem Problem::of(const MoEConfig& c, std::int64_t tokens) {
  Problem p;
  p.tokens = tokens;
  p.top_k = c.top_k();
  p.shared = int(c.shared_experts);
  p.experts = c.num_experts;
  p.local_experts = c.local_experts();
  p.first_shared = std::int64_t(c.ep_rank) * c.weight_experts() + c.local_experts();
  p.weight = c.shared_expert_weight;
  return p;
}

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "shared experts T=" << tokens << " k=" << top_k << " S=" << shared << " E=" << experts;
  return os.str();
}

Status can_implement(const Problem& p) {
  if (p.tokens < 0 || p.top_k < 1 || p.shared < 1 || p.local_experts < 1)
    return Status::no("shared experts: needs T >= 0, k >= 1, S >= 1 and E_local >= 1, given " + p.to_string());
  if (p.first_shared + p.shared > INT_MAX)
    return Status::no("shared experts: the ids must fit i32, given " + p.to_string());
  return Status::ok();
}

void run(const Problem& p, const Args& a, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  if (p.tokens == 0) return;
  const std::int64_t slots = p.tokens * (p.top_k + p.shared);
  append_shared<<<grid_size(slots, kThreads, std::int64_t(multiprocessor_count()) * 16), kThreads, 0, as_cuda(stream)>>>(p, a);
  MOEKIT_CUDA_CHECK_LAUNCH("append_shared");
}

}  // namespace moekit::cuda::shared
