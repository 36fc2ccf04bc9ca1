// The Layer: validates once, picks the backend, sizes the buffers, runs the four stages.
#include "moekit/layer.h"

#include <algorithm>

#include "core/ep_pipeline.h"
#include "core/parallel.h"
#include "core/stages.h"
#include "core/validate.h"
#include "moekit/comm.h"
#include "moekit/error.h"

namespace moekit {

struct Layer::Impl {
  MoEConfig config;
  BackendSelection selection;
  const core::BackendImpl* backend = nullptr;
  core::StageSet stages;
  core::DeviceBuffer buffer{nullptr, [](std::byte*) {}};
  std::size_t buffer_size = 0;
  TensorView bias;  // the routing bias, kept for fused routing
  std::unique_ptr<core::EpPipeline> ep;  // with a communicator: Prepare/Finalize become EP dispatch/combine
  StepObserver* observer = nullptr;

  // Everything one call needs, carved from one buffer.
  struct Buffers {
    TensorView topk_ids, topk_weights;  // used when fused routing has no caller outputs
    QuantizedRows prepared;
    TensorView expert_out, slot_rows;
    core::Workspace router_ws, prepare_ws, experts_ws, finalize_ws;
  };

  Buffers carve(core::Carver& c, const core::StageProblem& p) const {
    const Device d = backend->device();
    const std::int64_t t = p.tokens, k = config.top_k(), h = config.hidden_size;
    const QuantScheme scheme = config.quant.scheme;
    Buffers b;
    b.topk_ids = c.tensor(DType::i32, {t, k}, d);
    b.topk_weights = c.tensor(DType::f32, {t, k}, d);
    if (ep) {  // the EP pipeline holds the rest
      const std::size_t n = stages.router->workspace_size(p);
      b.router_ws = core::Workspace{c.take(n), n};
      return b;
    }
    b.prepared.q = c.tensor(activation_dtype(scheme), {t, h}, d);
    if (scheme != QuantScheme::bf16) b.prepared.scales = c.tensor(DType::f32, scale_shape(scheme, t, h), d);
    b.expert_out = c.tensor(DType::bf16, {stages.experts->max_rows(p), h}, d);
    b.slot_rows = c.tensor(DType::i32, {t, k}, d);
    auto workspace = [&](const core::Stage& s) {
      const std::size_t n = s.workspace_size(p);
      return core::Workspace{c.take(n), n};
    };
    b.router_ws = workspace(*stages.router);
    b.prepare_ws = workspace(*stages.prepare);
    b.experts_ws = workspace(*stages.experts);
    b.finalize_ws = workspace(*stages.finalize);
    return b;
  }

  // Grows the one buffer when a call has more tokens than any before (never inside a stage).
  Buffers buffers_for(const core::StageProblem& p) {
    core::Carver counter(nullptr);
    carve(counter, p);
    if (counter.used() > buffer_size) {
      buffer = backend->allocate(counter.used());
      buffer_size = counter.used();
    }
    core::Carver c(buffer.get());
    return carve(c, p);
  }

  void check_stages(const core::StageProblem& p) const {
    const core::Stage* all[] = {stages.router.get(), stages.prepare.get(), stages.experts.get(),
                                stages.finalize.get()};
    for (const core::Stage* s : all) {
      const Status status = s->can_implement(p);
      require(bool(status), "backend " + std::string(backend->name()) + ": " + status.reason());
    }
  }

  void run(const core::StageProblem& p, const Buffers& b, const TensorView& hidden, const TensorView& ids,
           const TensorView& weights, const TensorView& out, Stream stream) {
    if (ep) {
      ep->run(p, hidden, ids, weights, out, stream);
    } else {
      const bool on_input = config.routing.effective_placement() == WeightPlacement::input;
      const bool whole = stages.experts->whole_layer(p);
      if (!whole) {
        core::mark_step(p, "quantize", stream);
        stages.prepare->run(p, {hidden, weights, b.prepared}, b.prepare_ws, stream);
      }
      stages.experts->run(p, {b.prepared, ids, weights, b.expert_out, b.slot_rows, hidden, out}, b.experts_ws, stream);
      if (!whole) {
        const bool weights_left = !on_input && !stages.experts->applies_weights();
        core::mark_step(p, "finalize", stream);
        stages.finalize->run(p, {b.expert_out, b.slot_rows, weights_left ? weights : TensorView{}, out},
                             b.finalize_ws, stream);
      }
    }
    core::mark_step(p, "end", stream);
  }

  core::StageProblem problem(std::int64_t tokens) const { return {config, tokens, nullptr, observer}; }
};

Weights OwnedWeights::weights() const {
  return {w13.view(), w2.view(), w13_scale.view(), w2_scale.view(), e_score_correction_bias.view(),
          w13_input_scale.view(), w2_input_scale.view()};
}

Layer::Layer(const MoEConfig& config, const Weights& weights, const LayerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  validate(config);
  core::num_threads();  // a bad MOEKIT_NUM_THREADS is an Error here, before any work
  impl_->config = config;
  impl_->selection = select_backend(config, options.backend);
  for (const auto* b : core::registered_backends())
    if (b->name() == impl_->selection.chosen) impl_->backend = b;
  core::check_weights(config, weights, Device::cpu);
  const bool alone = options.ep.scope == EpScope::this_rank;
  require(config.ep_size == 1 || alone || options.comm != nullptr,
          "comm: expected a communicator of " + std::to_string(config.ep_size) + " ranks for ep_size " +
              std::to_string(config.ep_size) + ", given none (LayerOptions::comm; or ep.scope this_rank)");
  require(!alone || options.comm == nullptr, "comm: ep.scope this_rank exchanges nothing; given a communicator");
  impl_->bias = weights.e_score_correction_bias;
  impl_->observer = options.observer;
  impl_->stages = impl_->backend->make_stages(config, weights);
  if (options.comm)
    impl_->ep = std::make_unique<core::EpPipeline>(config, *impl_->backend, impl_->stages, *options.comm, options.ep);
}

Layer::~Layer() = default;

void Layer::forward(const FusedArgs& args, Stream stream) {
  Impl& m = *impl_;
  const core::StageProblem p = m.problem(core::check_args(m.config, args, m.backend->device()));
  m.check_stages(p);
  const Impl::Buffers b = m.buffers_for(p);
  const TensorView ids = args.topk_ids.defined() ? args.topk_ids : b.topk_ids;
  const TensorView weights = args.topk_weights.defined() ? args.topk_weights : b.topk_weights;
  core::mark_step(p, "routing", stream);
  m.stages.router->run(p, {{args.router_logits, m.config.routing.uses_bias() ? m.bias : TensorView{}},
                           {ids, weights}},
                       b.router_ws, stream);
  m.run(p, b, args.hidden, ids, weights, args.out, stream);
}

void Layer::forward(const ExternalArgs& args, Stream stream) {
  Impl& m = *impl_;
  const core::StageProblem p = m.problem(core::check_args(m.config, args, m.backend->device()));
  m.check_stages(p);
  const Impl::Buffers b = m.buffers_for(p);
  m.run(p, b, args.hidden, args.topk_ids, args.topk_weights, args.out, stream);
}

void Layer::reserve(std::int64_t max_tokens) {
  require(max_tokens >= 0, "max_tokens: expected >= 0, given " + std::to_string(max_tokens));
  impl_->buffers_for(impl_->problem(max_tokens));
  if (impl_->ep) impl_->ep->reserve(max_tokens);
}

std::size_t Layer::workspace_bytes() const {
  return impl_->buffer_size + (impl_->ep ? impl_->ep->buffer_bytes() : 0);
}

const MoEConfig& Layer::config() const { return impl_->config; }
const BackendSelection& Layer::selection() const { return impl_->selection; }
std::string_view Layer::backend_name() const { return impl_->backend->name(); }
Device Layer::device() const { return impl_->backend->device(); }
EpCombine Layer::ep_combine() const { return impl_->ep ? impl_->ep->combine() : EpCombine::automatic; }
EpStats Layer::ep_stats() const { return impl_->ep ? impl_->ep->stats() : EpStats{}; }

}  // namespace moekit
