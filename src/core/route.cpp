// moekit::route (routing.h): the checks of every argument, then the CPU reference router or,
// for tensors in GPU memory, the cuda backend's routing kernel.
#include <algorithm>
#include <string>
#include <vector>

#include "cpu/routing.h"
#include "moekit/error.h"
#include "moekit/routing.h"

#ifdef MOEKIT_HAVE_CUDA
#include "cuda/routing/route.h"
#endif

namespace moekit {
namespace {

// What one tensor argument must be. A size of -1 in `shape` accepts any size.
struct TensorRule {
  std::string name;                 // the argument, as the caller knows it
  std::string shape_names;          // "[T, k]"
  std::vector<std::int64_t> shape;  // expected sizes, one per dim
  std::vector<DType> dtypes;
  Device device = Device::cpu;  // where router_logits are
};

std::string join(const std::vector<DType>& dtypes) {
  std::string s;
  for (const DType d : dtypes) s += (s.empty() ? "" : "|") + std::string(to_string(d));
  return s;
}

std::string sizes(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

std::string strides(const TensorView& t) {
  std::vector<std::int64_t> s(t.strides.begin(), t.strides.begin() + t.rank);
  return sizes(s);
}

void check_tensor(const TensorView& t, const TensorRule& rule) {
  // Every call checks its tensors here: the messages are made only when a check fails.
  const auto head = [&] { return rule.name + ": expected "; };
  const auto given = [&] { return ", given " + t.to_string(); };
  require(t.defined(), [&] { return head() + rule.shape_names + " " + join(rule.dtypes) + given(); });
  require(t.rank == int(rule.shape.size()),
          [&] { return head() + "rank " + std::to_string(rule.shape.size()) + " " + rule.shape_names + given(); });
  for (int d = 0; d < t.rank; ++d) {
    const std::int64_t want = rule.shape[std::size_t(d)];
    require(want < 0 || t.size(d) == want,
            [&] { return head() + "shape " + rule.shape_names + " = " + sizes(rule.shape) + given(); });
  }
  require(std::find(rule.dtypes.begin(), rule.dtypes.end(), t.dtype) != rule.dtypes.end(),
          [&] { return head() + "dtype " + join(rule.dtypes) + given(); });
  require(t.device == rule.device, [&] {
    return head() + "a " + std::string(to_string(rule.device)) + " tensor (like router_logits)" + given();
  });
  require(t.is_contiguous(), [&] { return head() + "a contiguous tensor" + given() + " with strides " + strides(t); });
  require(t.numel() == 0 || t.data != nullptr, [&] { return head() + "data" + given() + " with a null pointer"; });
}

void check_bias(const RoutingConfig& config, const TensorView& bias, std::int64_t num_experts, Device device) {
  require(bias.defined(), [&] {
    return "bias: " + std::string(to_string(config.method)) + " needs e_score_correction_bias [E] f32|bf16, given absent";
  });
  check_tensor(bias, {"bias", "[E]", {num_experts}, {DType::f32, DType::bf16}, device});
}

}  // namespace

void route(const RoutingConfig& config, const RoutingInputs& in, const RoutingOutputs& out, Stream stream) {
  require(config.method != RoutingMethod::external,
          "method: expected a computed routing method, given external (its topk_ids and "
          "topk_weights come from the caller)");
  const Device device = in.router_logits.defined() ? in.router_logits.device : Device::cpu;
#ifndef MOEKIT_HAVE_CUDA
  require(device == Device::cpu, [&] {
    return "router_logits: expected a cpu tensor (this build has no CUDA), given " + in.router_logits.to_string();
  });
#endif
  check_tensor(in.router_logits, {"router_logits", "[T, E]", {-1, -1}, {DType::f32, DType::bf16}, device});
  const std::int64_t num_tokens = in.router_logits.size(0);
  const std::int64_t num_experts = in.router_logits.size(1);
  validate(config, num_experts);
  // A bias given to a method without one is not an error: it is just not in its formula.
  if (config.uses_bias()) check_bias(config, in.bias, num_experts, device);
  const std::vector<std::int64_t> out_shape{num_tokens, config.top_k};
  check_tensor(out.topk_ids, {"topk_ids", "[T, k]", out_shape, {DType::i32}, device});
  check_tensor(out.topk_weights, {"topk_weights", "[T, k]", out_shape, {DType::f32}, device});
  if (device == Device::cpu) return cpu::route_tokens(config, in, out);
#ifdef MOEKIT_HAVE_CUDA
  cuda::routing::Problem p;
  p.config = config;
  p.tokens = num_tokens;
  p.experts = num_experts;
  p.logits_dtype = in.router_logits.dtype;
  p.bias_dtype = config.uses_bias() ? in.bias.dtype : DType::f32;
  const Status status = cuda::routing::can_implement(p);
  require(bool(status), status.reason());
  const void* bias = config.uses_bias() ? in.bias.data : nullptr;
  cuda::routing::run(p, {in.router_logits.data, bias, out.topk_ids.ptr<std::int32_t>(), out.topk_weights.ptr<float>()},
                     {}, stream);
#else
  (void)stream;
#endif
}

}  // namespace moekit
