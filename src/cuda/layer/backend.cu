// The CUDA backend: the GPU stages bound to weights prepared once, and its capability check.
#include <cuda_runtime_api.h>

#include "core/stages.h"
#include "cuda/common/check.h"
#include "cuda/common/device.h"
#include "cuda/ep/ep_stages.h"
#include "cuda/finalize/finalize.h"
#include "cuda/layer/device_weights.h"
#include "cuda/layer/experts.h"
#include "cuda/quant/quantize.h"
#include "cuda/routing/route.h"
#include "cuda/shared/append.h"

namespace moekit::cuda {
namespace {

using core::StageProblem;

class Router final : public core::RouterStage {
 public:
  explicit Router(const DeviceWeights& w) : weights_(w) {}
  Status can_implement(const StageProblem& p) const override { return routing::can_implement(problem(p, DType::f32)); }
  std::size_t workspace_size(const StageProblem& p) const override { return routing::workspace_size(problem(p, DType::f32)); }
  void run(const StageProblem& p, const core::RouterArgs& args, core::Workspace ws, Stream stream) const override {
    routing::Args a;
    a.logits = args.in.router_logits.data;
    a.bias = args.in.bias.data;  // the prepared weights' bias, on the device
    a.topk_ids = args.out.topk_ids.ptr<std::int32_t>();
    a.topk_weights = args.out.topk_weights.ptr<float>();
    routing::run(problem(p, args.in.router_logits.dtype), a, ws, stream);
  }

 private:
  routing::Problem problem(const StageProblem& p, DType logits) const {
    routing::Problem r;
    r.config = p.config.routing;
    r.tokens = p.tokens;
    r.experts = p.config.num_experts;
    r.logits_dtype = logits;
    r.bias_dtype = weights_.bias.defined() ? weights_.bias.dtype : DType::f32;
    return r;
  }
  const DeviceWeights& weights_;
};

class Shared final : public core::SharedStage {
 public:
  Status can_implement(const StageProblem& p) const override { return shared::can_implement(shared::Problem::of(p.config, p.tokens)); }
  std::size_t workspace_size(const StageProblem&) const override { return 0; }
  void run(const StageProblem& p, const core::SharedArgs& args, core::Workspace, Stream stream) const override {
    shared::run(shared::Problem::of(p.config, p.tokens),
                {args.topk_ids.ptr<std::int32_t>(), args.topk_weights.ptr<float>(), args.out_ids.ptr<std::int32_t>(),
                 args.out_weights.ptr<float>()},
                stream);
  }
};

class Prepare final : public core::PrepareStage {
 public:
  explicit Prepare(const DeviceWeights& w) : weights_(w) {}
  Status can_implement(const StageProblem& p) const override { return quant::can_implement(problem(p)); }
  std::size_t workspace_size(const StageProblem& p) const override { return quant::workspace_size(problem(p)); }
  void run(const StageProblem& p, const core::PrepareArgs& args, core::Workspace ws, Stream stream) const override {
    quant::Args a;
    a.hidden = args.hidden.data;
    a.topk_weights = args.topk_weights.defined() ? args.topk_weights.ptr<float>() : nullptr;
    a.given_scale = weights_.w13_input_scale.ptr<float>();
    a.q = args.out.q.data;
    a.scales = args.out.scales.defined() ? args.out.scales.ptr<float>() : nullptr;
    a.reduce_amax = group_amax(p, stream);
    quant::run(problem(p), a, ws, stream);
  }

 private:
  quant::Problem problem(const StageProblem& p) const {
    quant::Problem q;
    q.quant = p.config.quant;
    q.tokens = p.tokens;
    q.hidden = p.config.hidden_size;
    q.placement = p.config.routing.effective_placement();
    q.tensor_scale = weights_.w13_input_scale.defined() ? quant::TensorScale::given : quant::TensorScale::dynamic;
    return q;
  }
  const DeviceWeights& weights_;
};

class Finalize final : public core::FinalizeStage {
 public:
  Status can_implement(const StageProblem& p) const override { return finalize::can_implement(problem(p)); }
  std::size_t workspace_size(const StageProblem& p) const override { return finalize::workspace_size(problem(p)); }
  void run(const StageProblem& p, const core::FinalizeArgs& args, core::Workspace ws, Stream stream) const override {
    finalize::Args a;
    a.expert_out = args.expert_out.data;
    a.slot_rows = args.slot_rows.ptr<std::int32_t>();
    a.topk_weights = args.topk_weights.defined() ? args.topk_weights.ptr<float>() : nullptr;
    a.out = args.out.data;
    finalize::run(problem(p), a, ws, stream);
  }

 private:
  static finalize::Problem problem(const StageProblem& p) {
    return {p.tokens, p.config.top_k(), p.config.hidden_size};
  }
};

class CudaBackend final : public core::BackendImpl {
 public:
  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }

  Status can_implement(const MoEConfig& c) const override {
    const DeviceInfo& info = device_info();
    if (info.count == 0) return Status::no(info.problem);
    if (info.sm != 90) return Status::no("needs a Hopper GPU (sm_90), found " + info.to_string());
    if (c.hidden_size % 16 != 0 || c.intermediate_size % 16 != 0)
      return Status::no("the grouped GEMMs need H and I multiples of 16, given H=" + std::to_string(c.hidden_size) +
                        " I=" + std::to_string(c.intermediate_size));
    return Status::ok();
  }

  std::shared_ptr<const core::BackendWeights> prepare(const MoEConfig& c, const Weights& w, core::Preparation how,
                                                      Stream stream) const override {
    return DeviceWeights::prepare(c, w, how, stream);
  }

  // The stages read the prepared weights, which they keep alive.
  core::StageSet make_stages(const MoEConfig& c, std::shared_ptr<const core::BackendWeights> prepared,
                             const TuningOptions* tuning) const override {
    const auto& w = static_cast<const DeviceWeights&>(*prepared);
    core::StageSet s;
    s.router = std::make_unique<Router>(w);
    s.shared = std::make_unique<Shared>();
    s.prepare = std::make_unique<Prepare>(w);
    s.experts = make_experts(c, w, tuning);
    s.finalize = std::make_unique<Finalize>();
    s.keep_alive = std::move(prepared);
    return s;
  }

  std::unique_ptr<core::EpStages> make_ep_stages() const override { return cuda::make_ep_stages(); }

  core::DeviceBuffer allocate(std::size_t bytes) const override {
    void* p = nullptr;
    MOEKIT_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return core::DeviceBuffer(static_cast<std::byte*>(p), [](std::byte* q) { cudaFree(q); });
  }
};

}  // namespace
}  // namespace moekit::cuda

namespace moekit::core {
const BackendImpl& cuda_backend() {
  static const cuda::CudaBackend backend;
  return backend;
}
}  // namespace moekit::core
