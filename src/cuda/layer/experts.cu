// The Experts stage on the GPU (contiguous format): permute -> GEMM1 -> activation + requant
// -> GEMM2, all on one stream, sizes that depend on routing kept on the device.
//   1. plan: counts, padded offsets, slot_rows, row_token, row_expert   (permute/plan); at decode
//      sizes (the one-block plan) with the Prepare stage's quantization in the same launch
//   2. gather the prepared rows into expert order, scales MN-major       (permute/gather); not
//      where the plan prepared the input and GEMM1's decode tiles read its rows by index
//   3. GEMM1 [rows, H] x w13 -> [rows, W] bf16                           (gemm)
//   4. activation -> GEMM2's input, fp8 + scales or bf16                 (activation)
//   5. GEMM2 [rows, I] x w2 -> expert_out [rows, H] bf16                 (gemm)
// Per-row and per-tensor scales are repeated over K blocks (expand_scales) for the
// fp8_channel GEMM; fp8-block scales come out of gather/activation in the GEMM's layout.
// The masked format (run_masked) skips 1-2: its rows are the caller's blocks, the plan a kernel
// of one block per expert (offsets e C, the counts clamped, fp8 scales into the GEMM's layout).
// The contiguous format's path (this, or min_latency.h's) and GEMM tiles at T are a tactic
// (tactic.h): the tuning cache's for T's bucket when it has one that can run, else the heuristic's.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/stages.h"
#include "cuda/activation/activate.h"
#include "cuda/common/launch.h"
#include "cuda/ep/ep_stages.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/layer/experts.h"
#include "cuda/layer/min_latency.h"
#include "cuda/layer/tactic.h"
#include "cuda/permute/gather.h"
#include "cuda/permute/plan.h"
#include "cuda/quant/quantize.h"
#include "moekit/quant.h"

namespace moekit::cuda {
namespace {

// Rows of every expert padded to this: 16 keeps each expert's rows and scale columns aligned.
constexpr std::int64_t kRowAlignment = 16;
// Scales past the last row that a partial 128-row tile may read (and never stores).
constexpr std::int64_t kScaleSlackRows = 128;

// out: group e's [k_blocks, Mp_e] block at offsets[e] * k_blocks; per_row: [rows] or, when
// per_tensor, one value for every row.
__global__ void expand_scales(const std::int32_t* offsets, const std::int32_t* row_expert, const float* scales,
                              bool per_tensor, int k_blocks, int max_rows, float* out) {
  const int r = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= max_rows) return;
  const int e = row_expert[r];
  if (e < 0) return;
  const int o = offsets[e], m = offsets[e + 1] - o;
  const float v = per_tensor ? scales[0] : scales[r];
  for (int b = 0; b < k_blocks; ++b) out[std::int64_t(o) * k_blocks + std::int64_t(b) * m + (r - o)] = v;
}

// The masked format's plan, one block per expert: offsets[e] = e C, the counts clamped to [0, C]
// and, for fp8 input, the block's scales in the GEMM's layout ([ceil(H/128), C] per expert, C
// contiguous) from either of the caller's (element strides s_e, s_j, s_g).
struct MaskedPlanParams {
  const std::int32_t* counts;
  const float* scales;  // null: bf16 input, or scales quantized into `out_scales` already (k-major)
  std::int64_t s_e, s_j, s_g;
  int capacity, k_blocks;
  std::int32_t *offsets, *clamped;
  float* out_scales;
};

__global__ void masked_plan(MaskedPlanParams p) {
  const int e = int(blockIdx.x), cap = p.capacity;
  const int n = min(max(__ldg(p.counts + e), 0), cap);
  if (threadIdx.x == 0) {
    p.clamped[e] = n;
    p.offsets[e] = e * cap;
    if (e + 1 == int(gridDim.x)) p.offsets[e + 1] = (e + 1) * cap;
  }
  if (!p.scales) return;
  float* out = p.out_scales + std::int64_t(e) * cap * p.k_blocks;
  for (int i = int(threadIdx.x); i < n * p.k_blocks; i += int(blockDim.x)) {
    const int g = i / n, j = i - g * n;  // consecutive threads: consecutive rows, C-contiguous writes
    out[std::int64_t(g) * cap + j] = __ldg(p.scales + e * p.s_e + j * p.s_j + g * p.s_g);
  }
}

ExpertRows staged_rows(const MoEConfig& c) {
  ExpertRows r;
  r.format = RowFormat::contiguous;
  r.experts = c.local_experts();
  r.alignment = kRowAlignment;
  return r;
}

permute::PlanProblem staged_plan_problem(const MoEConfig& c, std::int64_t tokens) {
  return {staged_rows(c), tokens, c.top_k(), c.first_local_expert()};
}

struct Buffers {
  std::int32_t *counts, *offsets, *row_token, *row_expert;
  void *q1, *h1, *q2;
  float *s1, *s1_gemm, *s2, *s2_gemm;
  core::Workspace plan_ws, gather_ws, act_ws, gemm1_ws, gemm2_ws;
};

class Experts final : public core::ExpertsStage {
 public:
  Experts(const MoEConfig& config, const DeviceWeights& weights, const TuningOptions* tuning)
      : config_(config), weights_(weights), tactics_(config, tuning) {}

  bool applies_weights() const override { return false; }

  std::int64_t max_rows(const core::StageProblem& p) const override { return rows_format().max_rows(p.tokens * p.config.top_k()); }

  bool whole_layer(const core::StageProblem& p) const override { return plan(p).tactic.path == TacticPath::min_latency; }

  // GEMM2 combines the tokens' rows itself (a *_combine tile: GemmOutput::combined).
  bool finalizes(const core::StageProblem& p) const override {
    const Plan m = plan(p);
    return m.status && m.tactic.path == TacticPath::staged && output_of(m.tactic.gemm2.tile) == GemmOutput::combined;
  }

  bool prepares_input(const core::StageProblem& p) const override {
    const Plan m = plan(p);
    return m.status && m.prepares;
  }

  Status can_implement(const core::StageProblem& p) const override { return plan(p).status; }

  std::size_t workspace_size(const core::StageProblem& p) const override {
    const Plan m = plan(p);
    if (m.tactic.path == TacticPath::min_latency) return min_latency::workspace_size(min_latency_problem(p));
    core::Carver c(nullptr);
    carve(c, p, m);
    return c.used();
  }

  void run(const core::StageProblem& p, const core::ExpertsArgs& args, core::Workspace ws, Stream stream) const override {
    const Plan m = plan(p);
    if (m.tactic.path == TacticPath::min_latency) {
      require(args.hidden.defined() && args.out.defined(), "min-latency path: the layer's input and output are required");
      run_min_latency(p, args, ws, stream);
      return;
    }
    const Tactic& t = m.tactic;
    core::Carver c(ws.data);
    const Buffers b = carve(c, p, m);
    const QuantScheme scheme = config_.quant.scheme;
    const bool channel = scheme == QuantScheme::fp8_rowwise || scheme == QuantScheme::fp8_tensor;
    const int rows = int(max_rows(p));
    const RowPlan plan{b.offsets, b.counts, b.row_expert};

    core::mark_step(p, "permute", stream);
    permute::PlanArgs plan_args;
    plan_args.topk_ids = args.topk_ids.ptr<std::int32_t>();
    plan_args.counts = b.counts;
    plan_args.offsets = b.offsets;
    plan_args.slot_rows = args.slot_rows.ptr<std::int32_t>();
    plan_args.row_token = b.row_token;
    plan_args.row_expert = b.row_expert;
    const auto [g1, g2] = gemms(p, t);
    const bool combined = g2.first.output == GemmOutput::combined;
    if (combined) {  // GEMM2's counts per 128 columns, zero at its launch
      require(args.out.defined(), "GEMM2 + combine: the layer's output is required");
      plan_args.zeroed = reinterpret_cast<std::int32_t*>(b.gemm2_ws.data);
      plan_args.zeroed_count = std::int64_t(b.gemm2_ws.size / sizeof(std::int32_t));
    }
    if (m.prepares) {
      const QuantScheme s = config_.quant.scheme;
      permute::PrepareArgs prepare;
      prepare.hidden = args.hidden.data;
      prepare.weights = config_.routing.effective_placement() == WeightPlacement::input ? args.topk_weights.ptr<float>() : nullptr;
      prepare.x = args.in.q.data;
      prepare.x_scales = s == QuantScheme::fp8_block ? args.in.scales.ptr<float>() : nullptr;
      prepare.hidden_size = config_.hidden_size;
      prepare.fp8 = s == QuantScheme::fp8_block;
      prepare.ue8m0 = config_.quant.scale_format == ScaleFormat::ue8m0;
      permute::run_prepared(plan_problem(p), plan_args, prepare, stream);
    } else {
      permute::run(plan_problem(p), plan_args, b.plan_ws, stream);
    }

    const bool by_index = g1.first.a_by_index;
    if (!by_index) {
      permute::GatherArgs gather;
      gather.q = args.in.q.data;
      gather.scales = args.in.scales.defined() ? args.in.scales.ptr<float>() : nullptr;
      gather.plan = plan;
      gather.row_token = b.row_token;
      gather.out_q = b.q1;
      gather.out_scales = b.s1;
      permute::run(gather_problem(p), gather, b.gather_ws, stream);
    }
    if (channel) expand(b, b.s1, ceil_div(config_.hidden_size, kBlock), rows, stream, b.s1_gemm);

    // GEMM1 activates and requantizes its rows itself (fp8-block, gated): no activation stage.
    const bool activated = g1.first.output == GemmOutput::activated_fp8;
    core::mark_step(p, "gemm1", stream);
    GroupedGemmArgs a1{b.q1, channel ? b.s1_gemm : b.s1, b.offsets, weights_.w13.data,
                       weights_.w13_scales.ptr<float>(), static_cast<bf16*>(b.h1), b.counts};
    if (by_index) {  // the prepared input's rows and k-major scales, each row's token from the plan
      a1.a = args.in.q.data;
      a1.a_scales = args.in.scales.ptr<float>();
      a1.a_rows = b.row_token;
    }
    if (activated)
      a1.activated = {b.q2, b.s2, config_.activation, config_.swiglu_alpha, config_.swiglu_limit,
                      config_.quant.scale_format == ScaleFormat::ue8m0};
    run_grouped_gemm(g1.first, g1.second, a1, b.gemm1_ws.data, stream);

    if (!activated) {
      core::mark_step(p, "activation", stream);
      activation::Args act;
      act.gemm1_out = b.h1;
      act.plan = plan;
      act.given_scale = weights_.w2_input_scale.ptr<float>();
      act.q = b.q2;
      act.scales = b.s2;
      act.reduce_amax = group_amax(p, stream);
      activation::run(activation_problem(p), act, b.act_ws, stream);
    }
    if (channel) expand(b, b.s2, ceil_div(config_.intermediate_size, kBlock), rows, stream, b.s2_gemm);

    core::mark_step(p, "gemm2", stream);
    GroupedGemmArgs a2{b.q2, channel ? b.s2_gemm : b.s2, b.offsets, weights_.w2.data,
                       weights_.w2_scales.ptr<float>(), args.expert_out.ptr<bf16>(), b.counts};
    if (combined) {  // finalize's work: the weights unless they went on the input
      const bool on_input = config_.routing.effective_placement() == WeightPlacement::input;
      a2.combined = {args.slot_rows.ptr<std::int32_t>(), on_input ? nullptr : args.topk_weights.ptr<float>(),
                     args.out.ptr<bf16>(), p.tokens, int(config_.top_k())};
    }
    run_grouped_gemm(g2.first, g2.second, a2, b.gemm2_ws.data, stream);
  }

  // The masked format: [E_local C] rows, expert e's in [e C, e C + counts[e]); the GEMMs and the
  // activation compute and write those rows alone.
  Status can_implement_masked(const core::MaskedProblem& p) const override {
    const QuantScheme scheme = config_.quant.scheme;
    if (scheme != QuantScheme::bf16 && scheme != QuantScheme::fp8_block)
      return Status::no("the masked format takes bf16 and fp8-block layers, given " + std::string(to_string(scheme)));
    const std::int64_t rows = config_.local_experts() * p.capacity;
    if (rows >= (std::int64_t(1) << 31))
      return Status::no("the masked format: E_local C rows must stay below 2^31, given " + std::to_string(rows));
    const auto [g1, g2] = masked_gemms(p);
    for (const auto& [desc, config] : {g1, g2}) {
      Status s = cuda::can_implement(desc, config);
      if (!s) return Status::no("grouped GEMM " + desc.to_string() + ": " + s.reason());
    }
    if (!p.fp8_input && scheme == QuantScheme::fp8_block) {
      Status s = quant::can_implement(masked_quant_problem(p));
      if (!s) return s;
    }
    return activation::can_implement(masked_activation_problem(p));
  }

  std::size_t masked_workspace_size(const core::MaskedProblem& p) const override {
    core::Carver c(nullptr);
    carve_masked(c, p);
    return c.used();
  }

  void run_masked(const core::MaskedProblem& p, const core::MaskedExpertsArgs& args, core::Workspace ws,
                  Stream stream) const override {
    core::Carver c(ws.data);
    const MaskedBuffers b = carve_masked(c, p);
    const QuantScheme scheme = config_.quant.scheme;
    const bool fp8 = scheme == QuantScheme::fp8_block;
    const std::int64_t el = config_.local_experts(), kb = ceil_div(config_.hidden_size, kBlock);
    const core::StageProblem sp{config_, el * p.capacity, nullptr, p.observer};
    const cudaStream_t s = as_cuda(stream);

    const void* a1 = args.hidden.data;
    MaskedPlanParams plan{args.counts.ptr<std::int32_t>(), nullptr, 0, 0, 0, int(p.capacity), int(kb),
                          b.offsets, b.counts, b.s1};
    if (fp8 && p.fp8_input) {
      const TensorView& sv = args.hidden_scale;
      plan.scales = sv.ptr<float>();
      plan.s_e = sv.strides[0];
      plan.s_j = sv.strides[1];
      plan.s_g = sv.strides[2];
    } else if (fp8) {
      core::mark_step(sp, "quantize", stream);
      quant::Args qa;
      qa.hidden = args.hidden.data;
      qa.q = b.q1;
      qa.scales = b.s1_rows;
      quant::run(masked_quant_problem(p), qa, b.quant_ws, stream);
      a1 = b.q1;
      plan.scales = b.s1_rows;
      plan.s_e = p.capacity * kb;
      plan.s_j = kb;
      plan.s_g = 1;
    }
    core::mark_step(sp, "permute", stream);
    masked_plan<<<unsigned(el), 256, 0, s>>>(plan);
    MOEKIT_CUDA_CHECK_LAUNCH("masked_plan");

    const auto [g1, g2] = masked_gemms(p);
    core::mark_step(sp, "gemm1", stream);
    GroupedGemmArgs ga1{a1, fp8 ? b.s1 : nullptr, b.offsets, weights_.w13.data, weights_.w13_scales.ptr<float>(),
                        static_cast<bf16*>(b.h1), b.counts};
    run_grouped_gemm(g1.first, g1.second, ga1, b.gemm1_ws.data, stream);

    core::mark_step(sp, "activation", stream);
    activation::Args act;
    act.gemm1_out = b.h1;
    act.plan = {b.offsets, b.counts};
    act.q = b.q2;
    act.scales = b.s2;
    activation::run(masked_activation_problem(p), act, b.act_ws, stream);

    core::mark_step(sp, "gemm2", stream);
    GroupedGemmArgs ga2{b.q2, fp8 ? b.s2 : nullptr, b.offsets, weights_.w2.data, weights_.w2_scales.ptr<float>(),
                        args.out.ptr<bf16>(), b.counts};
    run_grouped_gemm(g2.first, g2.second, ga2, b.gemm2_ws.data, stream);
  }

  // The masked format's GEMMs: E_local C rows, the caller's expected rows per expert for the tile.
  std::pair<std::pair<GroupedGemmDesc, GroupedGemmConfig>, std::pair<GroupedGemmDesc, GroupedGemmConfig>> masked_gemms(
      const core::MaskedProblem& p) const {
    const GemmKind kind = gemm_kind(config_.quant.scheme);
    const std::int64_t el = config_.local_experts(), rows = el * p.capacity;
    const GroupedGemmDesc d1{kind, el, config_.gemm1_width(), config_.hidden_size, rows, rows};
    const GroupedGemmDesc d2{kind, el, config_.hidden_size, config_.intermediate_size, rows, rows};
    const Fp8Accumulation a = config_.quant.accumulation;
    const bool invariant = config_.batch_invariant;
    const double per_group = double(p.expected_rows);
    return {{d1, choose_masked_gemm_config(d1, per_group, gemm_sums(kind, a, true), invariant).config},
            {d2, choose_masked_gemm_config(d2, per_group, gemm_sums(kind, a, false), invariant).config}};
  }

  // The two GEMMs and the tile the tactic gives each.
  std::pair<std::pair<GroupedGemmDesc, GroupedGemmConfig>, std::pair<GroupedGemmDesc, GroupedGemmConfig>> gemms(
      const core::StageProblem& p, const Tactic& t) const {
    StagedGemms g = staged_gemms({config_, p.tokens, max_rows(p), p.group != nullptr});
    g.gemm1.output = output_of(t.gemm1.tile);
    g.gemm2.output = output_of(t.gemm2.tile);
    // The plan prepared the input (decode sizes): the decode tiles read its rows by index.
    g.gemm1.a_by_index = prepares(p) && reads_rows_by_index(t.gemm1.tile);
    return {{g.gemm1, t.gemm1}, {g.gemm2, t.gemm2}};
  }

 private:
  // What a call of T tokens needs on the host: the tactic, whether it can run, and the staged
  // path's workspaces. Worked out once per T (and EP or not), then looked up: decode repeats the
  // same T call after call, and each choice builds its reasons and asks the GEMMs.
  struct Plan {
    Tactic tactic;
    Status status = Status::ok();
    bool prepares = false;  // the input's preparation in the plan's launch (prepares_input)
    std::size_t plan_ws = 0, gather_ws = 0, act_ws = 0, gemm1_ws = 0, gemm2_ws = 0;  // when status
  };
  static constexpr std::size_t kPlansKept = 4096;  // past this many distinct T the table starts again

  Plan plan(const core::StageProblem& p) const {
    const std::int64_t key = 2 * p.tokens + (p.group != nullptr ? 1 : 0);
    {
      const std::lock_guard<std::mutex> lock(plans_mutex_);
      if (const auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    const Plan made = make_plan(p);
    const std::lock_guard<std::mutex> lock(plans_mutex_);
    if (plans_.size() >= kPlansKept) plans_.clear();
    plans_.emplace(key, made);
    return made;
  }

  Plan make_plan(const core::StageProblem& p) const {
    Plan m;
    m.tactic = tactics_.choose({config_, p.tokens, max_rows(p), p.group != nullptr}).tactic;
    m.status = check(p, m.tactic);
    if (!m.status || m.tactic.path == TacticPath::min_latency) return m;
    const auto [g1, g2] = gemms(p, m.tactic);
    m.prepares = prepares(p);
    m.plan_ws = permute::workspace_size(plan_problem(p));
    m.gather_ws = permute::workspace_size(gather_problem(p));
    m.act_ws = activation::workspace_size(activation_problem(p));
    m.gemm1_ws = cuda::workspace_size(g1.first, g1.second);
    m.gemm2_ws = cuda::workspace_size(g2.first, g2.second);
    return m;
  }

  Status check(const core::StageProblem& p, const Tactic& t) const {
    if (config_.experts_path == ExpertsPath::min_latency) {
      if (p.group != nullptr) return Status::no("min-latency path: not inside the expert-parallel pipeline");
      return min_latency::can_implement(min_latency_problem(p));
    }
    if (t.path == TacticPath::min_latency) return min_latency::can_implement(min_latency_problem(p));
    const auto [g1, g2] = gemms(p, t);
    for (const auto& [desc, config] : {g1, g2}) {
      Status s = cuda::can_implement(desc, config);
      if (!s) return Status::no("grouped GEMM " + desc.to_string() + ": " + s.reason());
    }
    Status s = permute::can_implement(plan_problem(p));
    if (!s) return s;
    s = permute::can_implement(gather_problem(p));
    if (!s) return s;
    return activation::can_implement(activation_problem(p));
  }

  bool prepares(const core::StageProblem& p) const { return plan_prepares_input(config_, p.tokens, p.group != nullptr); }

  min_latency::Problem min_latency_problem(const core::StageProblem& p) const {
    min_latency::Problem m;
    m.config = config_;
    m.tokens = p.tokens;
    return m;
  }

  void run_min_latency(const core::StageProblem& p, const core::ExpertsArgs& args, core::Workspace ws, Stream stream) const {
    min_latency::Args a;
    a.topk_ids = args.topk_ids.ptr<std::int32_t>();
    a.topk_weights = args.topk_weights.defined() ? args.topk_weights.ptr<float>() : nullptr;
    a.slot_rows = args.slot_rows.ptr<std::int32_t>();
    a.hidden = args.hidden.ptr<bf16>();
    a.w13 = weights_.w13.data;
    a.w2 = weights_.w2.data;
    a.out = args.out.ptr<bf16>();
    min_latency::run(min_latency_problem(p), a, ws, stream, p);
  }

  ExpertRows rows_format() const { return staged_rows(config_); }

  ScaleLayout scale_layout() const {
    return config_.quant.scheme == QuantScheme::fp8_block ? ScaleLayout::mn_major_per_expert : ScaleLayout::k_major;
  }

  permute::PlanProblem plan_problem(const core::StageProblem& p) const { return staged_plan_problem(config_, p.tokens); }

  permute::GatherProblem gather_problem(const core::StageProblem& p) const {
    return {rows_format(), p.tokens, config_.top_k(), config_.hidden_size, config_.quant.scheme, scale_layout()};
  }

  activation::Problem activation_problem(const core::StageProblem& p) const {
    activation::Problem a;
    a.rows = rows_format();
    a.tokens = p.tokens;
    a.top_k = config_.top_k();
    a.intermediate = config_.intermediate_size;
    a.activation = config_.activation;
    a.swiglu_alpha = config_.swiglu_alpha;
    a.swiglu_limit = config_.swiglu_limit;
    a.quant = config_.quant;
    a.scale_layout = scale_layout();
    a.tensor_scale = weights_.w2_input_scale.defined() ? quant::TensorScale::given : quant::TensorScale::dynamic;
    return a;
  }

  ExpertRows masked_rows(const core::MaskedProblem& p) const {
    ExpertRows r;
    r.format = RowFormat::masked;
    r.experts = config_.local_experts();
    r.capacity = p.capacity;
    return r;
  }

  // bf16 input of an fp8-block layer: every row of every block (rows past the counts too).
  quant::Problem masked_quant_problem(const core::MaskedProblem& p) const {
    quant::Problem q;
    q.quant = config_.quant;
    q.tokens = config_.local_experts() * p.capacity;
    q.hidden = config_.hidden_size;
    return q;
  }

  activation::Problem masked_activation_problem(const core::MaskedProblem& p) const {
    activation::Problem a = activation_problem(core::StageProblem{config_, 1, nullptr, nullptr});
    a.rows = masked_rows(p);
    return a;
  }

  struct MaskedBuffers {
    std::int32_t *counts, *offsets;
    void *q1, *h1, *q2;
    float *s1_rows, *s1, *s2;
    core::Workspace quant_ws, act_ws, gemm1_ws, gemm2_ws;
  };

  MaskedBuffers carve_masked(core::Carver& c, const core::MaskedProblem& p) const {
    const std::int64_t el = config_.local_experts(), rows = el * p.capacity;
    const std::int64_t h = config_.hidden_size, w = config_.gemm1_width(), inter = config_.intermediate_size;
    const bool fp8 = config_.quant.scheme == QuantScheme::fp8_block;
    const std::size_t act_bytes = fp8 ? 1 : 2;
    auto floats = [&](std::int64_t n) { return reinterpret_cast<float*>(c.take(sizeof(float) * std::size_t(n))); };
    auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(n))); };
    auto workspace = [&](std::size_t n) { return core::Workspace{c.take(n), n}; };
    // A GEMM's workspace for any tile it may get (the tile follows expected_rows; the size must not).
    auto gemm_workspace = [&](const GroupedGemmDesc& d) {
      std::size_t n = 0;
      for (GemmTile t : kAllGemmTiles)
        if (cuda::can_implement(d, {t})) n = std::max(n, cuda::workspace_size(d, {t}));
      return workspace(n);
    };
    const std::int64_t slack = kScaleSlackRows;
    MaskedBuffers b{};
    b.counts = ints(el);
    b.offsets = ints(el + 1);
    // bf16 input of an fp8 layer: quantized here first (the most any input of C needs).
    const bool quantizes = fp8 && !p.fp8_input;
    b.q1 = quantizes ? c.take(std::size_t(rows * h)) : nullptr;
    b.s1_rows = quantizes ? floats(rows * ceil_div(h, kBlock)) : nullptr;
    b.s1 = fp8 ? floats((rows + slack) * ceil_div(h, kBlock)) : nullptr;
    b.h1 = c.take(std::size_t(rows * w) * 2);
    b.q2 = c.take(std::size_t(rows * inter) * act_bytes);
    b.s2 = fp8 ? floats((rows + slack) * ceil_div(inter, kBlock)) : nullptr;
    b.quant_ws = workspace(quantizes ? quant::workspace_size(masked_quant_problem(p)) : 0);
    b.act_ws = workspace(activation::workspace_size(masked_activation_problem(p)));
    const auto [g1, g2] = masked_gemms(p);
    b.gemm1_ws = gemm_workspace(g1.first);
    b.gemm2_ws = gemm_workspace(g2.first);
    return b;
  }

  void expand(const Buffers& b, const float* scales, std::int64_t k_blocks, int rows, Stream stream, float* out) const {
    if (rows == 0) return;
    expand_scales<<<grid_size(rows, 256), 256, 0, as_cuda(stream)>>>(
        b.offsets, b.row_expert, scales, config_.quant.scheme == QuantScheme::fp8_tensor, int(k_blocks), rows, out);
    MOEKIT_CUDA_CHECK_LAUNCH("expand_scales");
  }

  Buffers carve(core::Carver& c, const core::StageProblem& p, const Plan& m) const {
    require(m.status.is_ok(), [&] { return "backend cuda: " + m.status.reason(); });
    const std::int64_t rows = max_rows(p), el = config_.local_experts();
    const std::int64_t h = config_.hidden_size, w = config_.gemm1_width(), inter = config_.intermediate_size;
    const QuantScheme scheme = config_.quant.scheme;
    const std::size_t act_bytes = scheme == QuantScheme::bf16 ? 2 : 1;
    auto floats = [&](std::int64_t n) { return reinterpret_cast<float*>(c.take(sizeof(float) * std::size_t(n))); };
    auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(n))); };
    auto workspace = [&](std::size_t n) { return core::Workspace{c.take(n), n}; };
    const std::int64_t slack = kScaleSlackRows;
    Buffers b;
    b.counts = ints(el);
    b.offsets = ints(el + 1);
    b.row_token = ints(rows);
    b.row_expert = ints(rows);
    b.q1 = c.take(std::size_t(rows * h) * act_bytes);
    b.s1 = floats((rows + slack) * ceil_div(h, kBlock));
    b.s1_gemm = floats((rows + slack) * ceil_div(h, kBlock));
    b.h1 = c.take(std::size_t(rows * w) * 2);
    b.q2 = c.take(std::size_t(rows * inter) * act_bytes);
    b.s2 = floats((rows + slack) * ceil_div(inter, kBlock));
    b.s2_gemm = floats((rows + slack) * ceil_div(inter, kBlock));
    b.plan_ws = workspace(m.plan_ws);
    b.gather_ws = workspace(m.gather_ws);
    b.act_ws = workspace(m.act_ws);
    b.gemm1_ws = workspace(m.gemm1_ws);
    b.gemm2_ws = workspace(m.gemm2_ws);
    return b;
  }

  MoEConfig config_;
  const DeviceWeights& weights_;
  TacticChooser tactics_;
  mutable std::mutex plans_mutex_;
  mutable std::unordered_map<std::int64_t, Plan> plans_;  // plan()'s, by 2 T + (EP)
};

}  // namespace

bool plan_prepares_input(const MoEConfig& config, std::int64_t tokens, bool expert_parallel) {
  const QuantScheme s = config.quant.scheme;
  const bool scheme = (s == QuantScheme::fp8_block && config.hidden_size % 128 == 0) ||
                      (s == QuantScheme::bf16 && config.hidden_size % 64 == 0);
  return scheme && !expert_parallel && plan_takes_one_block(config, tokens);
}

bool plan_takes_one_block(const MoEConfig& config, std::int64_t tokens) {
  return tokens > 0 && permute::choose_path(staged_plan_problem(config, tokens)) == permute::PlanPath::one_block;
}

std::string staged_steps(const MoEConfig& config, std::int64_t tokens, const Tactic& tactic) {
  const bool prepared = plan_prepares_input(config, tokens, false);
  const bool by_index = prepared && reads_rows_by_index(tactic.gemm1.tile);
  const bool activated = output_of(tactic.gemm1.tile) == GemmOutput::activated_fp8;
  std::string s = prepared ? "permutation plan + the input's quantization (one launch), "
                           : "quantize, permutation plan, ";
  if (!by_index) s += "gather, ";
  s += "GEMM1 " + std::string(tile_id(tactic.gemm1.tile));
  if (by_index) s += " (rows read by index)";
  s += activated ? " + activation + requantization, " : ", activation + requantization, ";
  if (output_of(tactic.gemm2.tile) == GemmOutput::combined)
    return s + "GEMM2 " + std::string(tile_id(tactic.gemm2.tile)) + " + the weighted combine (no finalize)";
  return s + "GEMM2 " + std::string(tile_id(tactic.gemm2.tile)) + ", finalize";
}

std::unique_ptr<core::ExpertsStage> make_experts(const MoEConfig& config, const DeviceWeights& weights,
                                                 const TuningOptions* tuning) {
  return std::make_unique<Experts>(config, weights, tuning);
}

}  // namespace moekit::cuda
