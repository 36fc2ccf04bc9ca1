// Routing: the typed launcher and the op entry (can_implement, workspace_size, run).
#include "cuda/routing/route.h"

#include <algorithm>
#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/routing/route.cuh"

namespace moekit::cuda::routing {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr std::size_t kSharedLimit = 200 * 1024;  // of the 227 KB a block may opt into on sm_90

struct Launch {
  int warps;
  std::size_t shared_bytes;
  bool registers;
};

std::int64_t experts_pad(const Problem& p) { return (p.experts + 31) / 32 * 32; }

std::int64_t bias_floats(const Problem& p) { return p.config.uses_bias() ? experts_pad(p) : 0; }

// Shared floats one warp needs; the shared-memory path also keeps its keys there.
std::int64_t warp_floats(const Problem& p, bool registers) {
  const std::int64_t floats = experts_pad(p) * (registers ? 1 : 2) + 2 * p.config.top_k + 2 * p.config.n_group;
  return (floats + 3) / 4 * 4;  // 16-byte aligned rows (float4 reads)
}

Launch plan(const Problem& p) {
  Launch l;
  l.registers = p.experts <= kMaxRegisterExperts;
  const std::size_t per_warp = std::size_t(warp_floats(p, l.registers)) * sizeof(float);
  const std::size_t fixed = std::size_t(kExpTableFloats + bias_floats(p)) * sizeof(float);
  l.warps = int(std::clamp<std::size_t>((kSharedLimit - fixed) / per_warp, 1, kWarps));
  l.shared_bytes = fixed + per_warp * std::size_t(l.warps);
  return l;
}

// Each method's family: the kernel that routes it (route.cuh).
constexpr Scoring scoring_of(RoutingMethod m) {
  switch (m) {
    case RoutingMethod::softmax_topk:
    case RoutingMethod::softmax_topk_renorm: return Scoring::softmax;
    case RoutingMethod::sigmoid_bias_grouped: return Scoring::grouped;
    case RoutingMethod::sigmoid_topk:
    case RoutingMethod::sigmoid_topk_renorm:
    case RoutingMethod::sigmoid_bias_renorm: return Scoring::sigmoid;
    default: return Scoring::logits;
  }
}

template <typename Kernel>
void launch(Kernel kernel, const Launch& l, const KernelParams& kp, std::int64_t tokens, cudaStream_t stream) {
  if (l.shared_bytes > 48 * 1024) allow_dynamic_shared(reinterpret_cast<const void*>(kernel), int(l.shared_bytes));
  const unsigned blocks = grid_size(tokens, l.warps, std::int64_t(multiprocessor_count()) * 32);
  kernel<<<blocks, l.warps * 32, l.shared_bytes, stream>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("routing kernel");
}

template <typename T, int V, Scoring S>
void launch_registers(const Launch& l, const KernelParams& kp, bool vector, cudaStream_t stream) {
  constexpr int kVector = std::min<int>(V, 16 / int(sizeof(T)));
  if (vector) launch(route_registers<T, V, kVector, S>, l, kp, kp.tokens, stream);
  else launch(route_registers<T, V, 1, S>, l, kp, kp.tokens, stream);
}

// The kernel of the problem's shape: scores in registers (E <= kMaxRegisterExperts) or shared memory.
template <typename T, Scoring S>
void dispatch_shape(const Problem& p, const Launch& l, const KernelParams& kp, const Args& args, cudaStream_t stream) {
  if (!l.registers) {
    launch(route_shared<T, S>, l, kp, kp.tokens, stream);
    return;
  }
  // Whole vectors per lane: E a multiple of the vector width, rows aligned to it.
  const int per_lane = p.experts <= 128 ? 4 : p.experts <= 256 ? 8 : 16;
  const int width = std::min<int>(per_lane, 16 / int(sizeof(T)));
  const bool vector = p.experts % width == 0 && reinterpret_cast<std::uintptr_t>(args.logits) % (width * sizeof(T)) == 0;
  switch (per_lane) {
    case 4: launch_registers<T, 4, S>(l, kp, vector, stream); break;
    case 8: launch_registers<T, 8, S>(l, kp, vector, stream); break;
    default: launch_registers<T, 16, S>(l, kp, vector, stream); break;
  }
}

// The method's family (one kernel per family: Scoring).
template <typename T>
void dispatch(const Problem& p, const Launch& l, const KernelParams& kp, const Args& args, cudaStream_t stream) {
  switch (scoring_of(p.config.method)) {
    case Scoring::softmax: dispatch_shape<T, Scoring::softmax>(p, l, kp, args, stream); break;
    case Scoring::sigmoid: dispatch_shape<T, Scoring::sigmoid>(p, l, kp, args, stream); break;
    case Scoring::grouped: dispatch_shape<T, Scoring::grouped>(p, l, kp, args, stream); break;
    case Scoring::logits: dispatch_shape<T, Scoring::logits>(p, l, kp, args, stream); break;
  }
}

}  // namespace

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "routing " << config.to_string() << " T=" << tokens << " E=" << experts << " logits="
     << moekit::to_string(logits_dtype);
  if (config.uses_bias()) os << " bias=" << moekit::to_string(bias_dtype);
  return os.str();
}

Status can_implement(const Problem& p) {
  if (p.config.method == RoutingMethod::external)
    return Status::no("routing: external routing is given by the caller, there is nothing to compute");
  try {
    validate(p.config, p.experts);
  } catch (const Error& e) {
    return Status::no(std::string("routing: ") + e.what());
  }
  if (p.tokens < 0 || p.tokens >= (std::int64_t(1) << 31) / std::max(1, p.config.top_k))
    return Status::no("routing: tokens must lie in [0, 2^31 / k), given " + std::to_string(p.tokens));
  if (p.experts > kMaxExperts)
    return Status::no("routing: at most " + std::to_string(kMaxExperts) + " experts (scores in shared memory), given " +
                      std::to_string(p.experts));
  if (p.logits_dtype != DType::f32 && p.logits_dtype != DType::bf16)
    return Status::no("routing: logits must be f32 or bf16, given " + std::string(moekit::to_string(p.logits_dtype)));
  if (p.config.uses_bias() && p.bias_dtype != DType::f32 && p.bias_dtype != DType::bf16)
    return Status::no("routing: bias must be f32 or bf16, given " + std::string(moekit::to_string(p.bias_dtype)));
  if (plan(p).shared_bytes > kSharedLimit)
    return Status::no("routing: k and n_group too large for shared memory at E=" + std::to_string(p.experts));
  return Status::ok();
}

std::size_t workspace_size(const Problem&) { return 0; }

void run(const Problem& p, const Args& args, core::Workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  if (p.tokens == 0) return;
  require(args.logits && args.topk_ids && args.topk_weights, "routing: logits, topk_ids and topk_weights are required");
  require(!p.config.uses_bias() || args.bias, [&] {
    return "routing: " + std::string(moekit::to_string(p.config.method)) + " needs the e_score_correction_bias";
  });
  const Launch l = plan(p);
  KernelParams kp{};
  kp.logits = args.logits;
  kp.bias = args.bias;
  kp.ids = args.topk_ids;
  kp.weights = args.topk_weights;
  kp.tokens = int(p.tokens);
  kp.experts = int(p.experts);
  kp.top_k = p.config.top_k;
  kp.n_group = p.config.method == RoutingMethod::sigmoid_bias_grouped ? p.config.n_group : 0;
  kp.group_size = kp.n_group > 0 ? int(p.experts) / kp.n_group : 0;
  kp.topk_group = p.config.topk_group;
  kp.scaling = p.config.routed_scaling_factor;
  kp.method = p.config.method;
  kp.bias_bf16 = p.bias_dtype == DType::bf16;
  kp.warp_floats = int(warp_floats(p, l.registers));
  kp.bias_floats = int(bias_floats(p));
  const cudaStream_t s = as_cuda(stream);
  if (p.logits_dtype == DType::f32) dispatch<float>(p, l, kp, args, s);
  else dispatch<std::uint16_t>(p, l, kp, args, s);
}

}  // namespace moekit::cuda::routing
