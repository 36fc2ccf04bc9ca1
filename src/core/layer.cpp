// The Layer: validates once, picks the backend, prepares the weights, sizes the buffers, runs
// the four stages (from its own buffer or from the caller's workspace).
#include "moekit/layer.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/ep_pipeline.h"
#include "core/parallel.h"
#include "core/shared.h"
#include "core/stages.h"
#include "core/validate.h"
#include "moekit/comm.h"
#include "moekit/error.h"

namespace moekit {

struct PreparedWeights::Impl {
  MoEConfig config;
  BackendSelection selection;
  const core::BackendImpl* backend = nullptr;
  std::int64_t max_tokens = 0;  // the T the stages were checked for (besides T = 1)
  std::shared_ptr<const core::BackendWeights> weights;
};

namespace {

const core::BackendImpl& backend_named(const std::string& name) {
  for (const auto* b : core::registered_backends())
    if (b->name() == name) return *b;
  throw Error("backend: '" + name + "' is not registered");
}

// Where the weights live: the memory of w13, which every other weight must share.
Device weights_memory(const Weights& w) { return w.w13.defined() ? w.w13.device : Device::cpu; }

}  // namespace

PreparedWeights::PreparedWeights(const MoEConfig& config, const Weights& weights, const LayerOptions& options,
                                 Stream stream) {
  validate(config);
  core::num_threads();  // a bad MOEKIT_NUM_THREADS is an Error here, before any work
  require(options.max_tokens >= 0, "max_tokens: expected >= 0, given " + std::to_string(options.max_tokens));
  core::check_weights(config, weights, weights_memory(weights));
  auto impl = std::make_shared<Impl>();
  impl->config = config;
  impl->selection = select_backend(config, weights, options.max_tokens, options.backend);
  impl->backend = &backend_named(impl->selection.chosen);
  impl->max_tokens = options.max_tokens;
  impl->weights = impl->backend->prepare(core::experts_config(config), weights, core::Preparation::memory, stream);
  impl_ = std::move(impl);
}

const MoEConfig& PreparedWeights::config() const { return impl_->config; }
const BackendSelection& PreparedWeights::selection() const { return impl_->selection; }
std::string_view PreparedWeights::backend_name() const { return impl_->backend->name(); }
Device PreparedWeights::device() const { return impl_->backend->device(); }
std::size_t PreparedWeights::owned_bytes() const { return impl_->weights->owned_bytes; }

struct Layer::Impl {
  PreparedWeights prepared;
  MoEConfig config;
  MoEConfig stages_config;  // what the stages after routing run (core/shared.h)
  const core::BackendImpl* backend = nullptr;
  core::StageSet stages;
  std::int64_t max_tokens = 0;  // LayerOptions::max_tokens
  core::DeviceBuffer buffer{nullptr, [](std::byte*) {}};
  std::size_t buffer_size = 0;
  std::unique_ptr<core::EpPipeline> ep;  // with a communicator: Prepare/Finalize become EP dispatch/combine
  StepObserver* observer = nullptr;

  explicit Impl(const PreparedWeights& w) : prepared(w) {}

  // Everything one call needs, carved from one buffer.
  struct Buffers {
    TensorView topk_ids, topk_weights;  // used when fused routing has no caller outputs
    TensorView shared_ids, shared_weights;  // [T, k + S]: the routing with the shared experts
    QuantizedRows prepared;
    TensorView expert_out, slot_rows;
    core::Workspace router_ws, shared_ws, prepare_ws, experts_ws, finalize_ws;
  };

  // What a call of T tokens needs besides its tensors: the stages' workspaces, the experts' rows,
  // whether the experts run the whole layer, and the bytes of it all. They depend on the layer and T
  // alone, so they are worked out once per T and looked up after (decode repeats one T call after
  // call; working them out asks every stage and its tactic).
  struct Sizes {
    std::size_t router = 0, shared = 0, prepare = 0, experts = 0, finalize = 0, bytes = 0;
    std::int64_t expert_rows = 0;
    bool whole = false;  // the experts stage does Prepare's and Finalize's work (ExpertsStage::whole_layer)
    bool finalizes = false;  // the experts stage does Finalize's work (whole, or ExpertsStage::finalizes)
  };
  static constexpr std::size_t kSizesKept = 4096;  // past this many distinct T the table starts again
  mutable std::mutex sizes_mutex;
  mutable std::unordered_map<std::int64_t, Sizes> sizes_by_tokens;

  Buffers carve(core::Carver& c, const core::StageProblem& p, const Sizes& s) const {
    const Device d = backend->device();
    const std::int64_t t = p.tokens, k = config.top_k(), h = config.hidden_size;
    const QuantScheme scheme = config.quant.scheme;
    Buffers b;
    b.topk_ids = c.tensor(DType::i32, {t, k}, d);
    b.topk_weights = c.tensor(DType::f32, {t, k}, d);
    if (config.shared_experts > 0) {
      b.shared_ids = c.tensor(DType::i32, {t, stages_config.top_k()}, d);
      b.shared_weights = c.tensor(DType::f32, {t, stages_config.top_k()}, d);
    }
    b.router_ws = core::Workspace{c.take(s.router), s.router};
    b.shared_ws = core::Workspace{c.take(s.shared), s.shared};
    if (ep) return b;  // the EP pipeline holds the rest
    b.prepared.q = c.tensor(activation_dtype(scheme), {t, h}, d);
    if (scheme != QuantScheme::bf16) b.prepared.scales = c.tensor(DType::f32, scale_shape(scheme, t, h), d);
    b.expert_out = c.tensor(DType::bf16, {s.expert_rows, h}, d);
    b.slot_rows = c.tensor(DType::i32, {t, stages_config.top_k()}, d);
    b.prepare_ws = core::Workspace{c.take(s.prepare), s.prepare};
    b.experts_ws = core::Workspace{c.take(s.experts), s.experts};
    b.finalize_ws = core::Workspace{c.take(s.finalize), s.finalize};
    return b;
  }

  Sizes sizes_of(const core::StageProblem& p) const {
    Sizes s;
    s.router = stages.router->workspace_size(p);
    s.shared = stages.shared->workspace_size(p);
    if (!ep) {  // the stages after routing run the routing with the shared experts appended
      const core::StageProblem after = stages_problem(p);
      s.prepare = stages.prepare->workspace_size(after);
      s.experts = stages.experts->workspace_size(after);
      s.finalize = stages.finalize->workspace_size(after);
      s.expert_rows = stages.experts->max_rows(after);
      s.whole = stages.experts->whole_layer(after);
      s.finalizes = s.whole || stages.experts->finalizes(after);
    }
    core::Carver counter(nullptr);
    carve(counter, p, s);
    s.bytes = counter.used();
    return s;
  }

  Sizes sizes(const core::StageProblem& p) const {
    {
      const std::lock_guard<std::mutex> lock(sizes_mutex);
      if (const auto it = sizes_by_tokens.find(p.tokens); it != sizes_by_tokens.end()) return it->second;
    }
    const Sizes made = sizes_of(p);  // may throw: nothing is kept then
    const std::lock_guard<std::mutex> lock(sizes_mutex);
    if (sizes_by_tokens.size() >= kSizesKept) sizes_by_tokens.clear();
    sizes_by_tokens.emplace(p.tokens, made);
    return made;
  }

  // Grows the one buffer when a call has more tokens than any before (never inside a stage).
  Buffers buffers_for(const core::StageProblem& p, const Sizes& s) {
    if (s.bytes > buffer_size) {
      buffer = backend->allocate(s.bytes);
      buffer_size = s.bytes;
    }
    core::Carver c(buffer.get());
    return carve(c, p, s);
  }

  // The caller's workspace, after checking that it holds the call.
  Buffers buffers_in(const core::StageProblem& p, const Sizes& s, const Workspace& ws) const {
    require(!ep, "workspace: an expert-parallel layer keeps its exchange buffers itself; call forward without one");
    require(ws.size >= s.bytes, [&] {
      return "workspace: expected at least " + std::to_string(s.bytes) + " bytes for T=" + std::to_string(p.tokens) +
             " (workspace_size), given " + std::to_string(ws.size);
    });
    require(s.bytes == 0 || ws.data != nullptr, "workspace: expected memory, given a null pointer");
    require(reinterpret_cast<std::uintptr_t>(ws.data) % 256 == 0, "workspace: expected a 256-byte aligned pointer");
    core::Carver c(static_cast<std::byte*>(ws.data));
    return carve(c, p, s);
  }

  // The call's T after checking its tensors and, where construction did not, its stages.
  template <class Args>
  core::StageProblem checked_problem(const Args& args) const {
    const core::StageProblem p = problem(core::check_args(config, args, backend->device()));
    if (max_tokens > 0) {
      require(p.tokens <= max_tokens, [&] {
        return "hidden: expected at most max_tokens=" + std::to_string(max_tokens) +
               " tokens (LayerOptions::max_tokens), given " + std::to_string(p.tokens);
      });
    } else {
      const Status status = core::check_stages(stages, p);
      require(bool(status), [&] { return "backend " + std::string(backend->name()) + ": " + status.reason(); });
    }
    return p;
  }

  void route(const core::StageProblem& p, const Buffers& b, const FusedArgs& args, const TensorView& ids,
             const TensorView& weights, Stream stream) const {
    const TensorView bias = config.routing.uses_bias() ? prepared.impl_->weights->bias : TensorView{};
    core::mark_step(p, "routing", stream);
    stages.router->run(p, {{args.router_logits, bias}, {ids, weights}}, b.router_ws, stream);
  }

  // The layer's routing, with the shared experts appended where the layer has them (core/shared.h),
  // through the stages after routing.
  void run(const core::StageProblem& routed, const Sizes& s, const Buffers& b, const TensorView& hidden,
           const TensorView& routed_ids, const TensorView& routed_weights, const TensorView& out, Stream stream) const {
    const bool shared = config.shared_experts > 0;
    if (shared) {
      core::mark_step(routed, "shared", stream);
      stages.shared->run(routed, {routed_ids, routed_weights, b.shared_ids, b.shared_weights}, b.shared_ws, stream);
    }
    const core::StageProblem p = stages_problem(routed);
    const TensorView& ids = shared ? b.shared_ids : routed_ids;
    const TensorView& weights = shared ? b.shared_weights : routed_weights;
    if (ep) {
      ep->run(p, hidden, ids, weights, out, stream);
    } else {
      const bool on_input = config.routing.effective_placement() == WeightPlacement::input;
      const bool whole = s.whole;
      if (!whole && !stages.experts->prepares_input(p)) {
        core::mark_step(p, "quantize", stream);
        stages.prepare->run(p, {hidden, weights, b.prepared}, b.prepare_ws, stream);
      }
      stages.experts->run(p, {b.prepared, ids, weights, b.expert_out, b.slot_rows, hidden, out}, b.experts_ws, stream);
      if (!s.finalizes) {
        const bool weights_left = !on_input && !stages.experts->applies_weights();
        core::mark_step(p, "finalize", stream);
        stages.finalize->run(p, {b.expert_out, b.slot_rows, weights_left ? weights : TensorView{}, out},
                             b.finalize_ws, stream);
      }
    }
    core::mark_step(p, "end", stream);
  }

  void fused(const core::StageProblem& p, const Sizes& s, const Buffers& b, const FusedArgs& args, Stream stream) const {
    const TensorView ids = args.topk_ids.defined() ? args.topk_ids : b.topk_ids;
    const TensorView weights = args.topk_weights.defined() ? args.topk_weights : b.topk_weights;
    route(p, b, args, ids, weights, stream);
    run(p, s, b, args.hidden, ids, weights, args.out, stream);
  }

  core::StageProblem problem(std::int64_t tokens) const { return {config, tokens, nullptr, observer}; }
  core::StageProblem stages_problem(core::StageProblem p) const {
    p.config = stages_config;
    return p;
  }

  // The masked format: the experts stage alone, with its workspace.
  core::MaskedProblem checked_masked(const MaskedArgs& args) const {
    core::MaskedProblem p = core::check_args(stages_config, args, backend->device());
    p.observer = observer;
    const Status status = stages.experts->can_implement_masked(p);
    require(bool(status), [&] { return "backend " + std::string(backend->name()) + ": " + status.reason(); });
    return p;
  }

  void run_masked(const core::MaskedProblem& p, const MaskedArgs& args, core::Workspace ws, Stream stream) const {
    stages.experts->run_masked(p, {args.hidden, args.hidden_scale, args.counts, args.out}, ws, stream);
    if (p.observer) p.observer->step("end", stream);
  }

  // A problem of capacity C for sizing: bf16 input (what needs the most workspace) and C rows expected.
  core::MaskedProblem masked_sizing(std::int64_t capacity) const {
    core::MaskedProblem p;
    p.config = stages_config;
    p.capacity = capacity;
    p.expected_rows = capacity;
    return p;
  }
};

Weights OwnedWeights::weights() const {
  return {w13.view(), w2.view(), w13_scale.view(), w2_scale.view(), e_score_correction_bias.view(),
          w13_input_scale.view(), w2_input_scale.view()};
}

Layer::Layer(const MoEConfig& config, const Weights& weights, const LayerOptions& options)
    : Layer(PreparedWeights(config, weights, options), options) {}

Layer::Layer(const PreparedWeights& weights, const LayerOptions& options)
    : impl_(std::make_unique<Impl>(weights)) {
  Impl& m = *impl_;
  const PreparedWeights::Impl& w = *weights.impl_;
  m.config = w.config;
  m.stages_config = core::experts_config(w.config);
  m.backend = w.backend;
  require(options.backend == "auto" || options.backend == w.backend->name(),
          "backend: the weights were prepared for '" + std::string(w.backend->name()) + "', given '" +
              options.backend + "'");
  require(options.max_tokens >= 0, "max_tokens: expected >= 0, given " + std::to_string(options.max_tokens));
  const MoEConfig& config = m.config;
  const bool alone = options.ep.scope == EpScope::this_rank;
  require(config.ep_size == 1 || alone || options.comm != nullptr,
          "comm: expected a communicator of " + std::to_string(config.ep_size) + " ranks for ep_size " +
              std::to_string(config.ep_size) + ", given none (LayerOptions::comm; or ep.scope this_rank)");
  require(!alone || options.comm == nullptr, "comm: ep.scope this_rank exchanges nothing; given a communicator");
  // Every rank holds the shared experts and would add them to its tokens' partial output.
  require(!alone || config.ep_size == 1 || config.shared_experts == 0,
          "ep.scope: this_rank leaves the sum of the ranks' outputs to the caller, and every rank would add the " +
              std::to_string(config.shared_experts) + " shared experts to it; use scope group (the layer runs them "
              "once per token, on the token's rank)");
  m.observer = options.observer;
  m.max_tokens = options.max_tokens;
  m.stages = m.backend->make_stages(m.stages_config, w.weights, &options.tuning);
  if (m.max_tokens > w.max_tokens) {
    const Status status = core::check_stages(m.stages, m.problem(m.max_tokens));
    require(bool(status), "backend " + std::string(m.backend->name()) + " cannot run max_tokens=" +
                              std::to_string(m.max_tokens) + ": " + status.reason());
  }
  if (options.comm)
    m.ep = std::make_unique<core::EpPipeline>(m.stages_config, *m.backend, m.stages, *options.comm, options.ep);
}

Layer::~Layer() = default;

void Layer::forward(const FusedArgs& args, Stream stream) {
  Impl& m = *impl_;
  const core::StageProblem p = m.checked_problem(args);
  const Impl::Sizes s = m.sizes(p);
  m.fused(p, s, m.buffers_for(p, s), args, stream);
}

void Layer::forward(const ExternalArgs& args, Stream stream) {
  Impl& m = *impl_;
  const core::StageProblem p = m.checked_problem(args);
  const Impl::Sizes s = m.sizes(p);
  m.run(p, s, m.buffers_for(p, s), args.hidden, args.topk_ids, args.topk_weights, args.out, stream);
}

void Layer::forward(const FusedArgs& args, const Workspace& workspace, Stream stream) const {
  const Impl& m = *impl_;
  const core::StageProblem p = m.checked_problem(args);
  const Impl::Sizes s = m.sizes(p);
  m.fused(p, s, m.buffers_in(p, s, workspace), args, stream);
}

void Layer::forward(const ExternalArgs& args, const Workspace& workspace, Stream stream) const {
  const Impl& m = *impl_;
  const core::StageProblem p = m.checked_problem(args);
  const Impl::Sizes s = m.sizes(p);
  m.run(p, s, m.buffers_in(p, s, workspace), args.hidden, args.topk_ids, args.topk_weights, args.out, stream);
}

std::size_t Layer::workspace_size(std::int64_t max_tokens) const {
  require(max_tokens >= 0, [&] { return "max_tokens: expected >= 0, given " + std::to_string(max_tokens); });
  require(!impl_->ep, "workspace_size: an expert-parallel layer keeps its exchange buffers itself");
  return impl_->sizes(impl_->problem(max_tokens)).bytes;
}

void Layer::forward(const MaskedArgs& args, Stream stream) {
  Impl& m = *impl_;
  const core::MaskedProblem p = m.checked_masked(args);
  const std::size_t bytes = m.stages.experts->masked_workspace_size(p);
  if (bytes > m.buffer_size) {
    m.buffer = m.backend->allocate(bytes);
    m.buffer_size = bytes;
  }
  m.run_masked(p, args, {m.buffer.get(), bytes}, stream);
}

void Layer::forward(const MaskedArgs& args, const Workspace& workspace, Stream stream) const {
  const Impl& m = *impl_;
  const core::MaskedProblem p = m.checked_masked(args);
  const std::size_t bytes = m.stages.experts->masked_workspace_size(p);
  require(workspace.size >= bytes, [&] {
    return "workspace: expected at least " + std::to_string(bytes) + " bytes for C=" + std::to_string(p.capacity) +
           " (masked_workspace_size), given " + std::to_string(workspace.size);
  });
  require(bytes == 0 || workspace.data != nullptr, "workspace: expected memory, given a null pointer");
  require(reinterpret_cast<std::uintptr_t>(workspace.data) % 256 == 0, "workspace: expected a 256-byte aligned pointer");
  m.run_masked(p, args, {static_cast<std::byte*>(workspace.data), workspace.size}, stream);
}

std::size_t Layer::masked_workspace_size(std::int64_t capacity) const {
  require(capacity >= 1, "capacity: expected >= 1, given " + std::to_string(capacity));
  const core::MaskedProblem p = impl_->masked_sizing(capacity);
  const Status status = impl_->stages.experts->can_implement_masked(p);
  require(bool(status), "backend " + std::string(impl_->backend->name()) + ": " + status.reason());
  return impl_->stages.experts->masked_workspace_size(p);
}

void Layer::reserve(std::int64_t max_tokens) {
  require(max_tokens >= 0, [&] { return "max_tokens: expected >= 0, given " + std::to_string(max_tokens); });
  const core::StageProblem p = impl_->problem(max_tokens);
  impl_->buffers_for(p, impl_->sizes(p));
  if (impl_->ep) impl_->ep->reserve(max_tokens);
}

std::size_t Layer::workspace_bytes() const {
  return impl_->buffer_size + (impl_->ep ? impl_->ep->buffer_bytes() : 0);
}

const MoEConfig& Layer::config() const { return impl_->config; }
const BackendSelection& Layer::selection() const { return impl_->prepared.selection(); }
std::string_view Layer::backend_name() const { return impl_->backend->name(); }
Device Layer::device() const { return impl_->backend->device(); }
EpCombine Layer::ep_combine() const { return impl_->ep ? impl_->ep->combine() : EpCombine::automatic; }
EpStats Layer::ep_stats() const { return impl_->ep ? impl_->ep->stats() : EpStats{}; }

}  // namespace moekit
