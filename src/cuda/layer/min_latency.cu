#include "cuda/layer/min_latency.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/layer/min_latency.cuh"
#include "cuda/permute/plan.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::min_latency {
namespace {

std::int64_t slots(const Problem& p) { return p.tokens * p.config.top_k(); }

// Work entries the plan can write: one per expert hit, plus one per further 32 rows.
std::int64_t max_entries(const Problem& p) {
  return std::min(p.config.local_experts(), slots(p)) + slots(p) / kEntryRows;
}

permute::PlanProblem plan_problem(const Problem& p) {
  ExpertRows rows;
  rows.format = RowFormat::contiguous;
  rows.experts = p.config.local_experts();
  rows.alignment = 1;
  return {rows, p.tokens, p.config.top_k(), p.config.first_local_expert()};
}

struct Buffers {
  std::int32_t *counts, *offsets, *row_token, *work, *done;
  float *x_scales, *act, *act_amax, *s2;
  std::uint8_t *x, *q2;
};

Buffers carve(core::Carver& c, const Problem& p) {
  const std::int64_t rows = slots(p), e = p.config.local_experts(), inter = p.config.intermediate_size;
  auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(n))); };
  auto floats = [&](std::int64_t n) { return reinterpret_cast<float*>(c.take(sizeof(float) * std::size_t(n))); };
  Buffers b;
  b.counts = ints(e);
  b.offsets = ints(e + 1);
  b.row_token = ints(rows);
  b.work = ints(1 + 3 * max_entries(p));
  b.done = ints(max_entries(p) * (inter / 128));
  const std::int64_t element = p.config.quant.scheme == QuantScheme::bf16 ? 2 : 1;
  b.x_scales = floats(p.tokens * ceil_div(p.config.hidden_size, 128));
  b.x = reinterpret_cast<std::uint8_t*>(c.take(std::size_t(p.tokens * p.config.hidden_size * element)));
  b.act = floats(rows * inter);
  b.act_amax = floats(rows * (inter / kChannels));
  b.s2 = floats(rows * (inter / 128));
  b.q2 = reinterpret_cast<std::uint8_t*>(c.take(std::size_t(rows * inter * element)));
  return b;
}

std::size_t gemm2_shared(const Problem& p) {
  return gemm2_ring_bytes() + sizeof(int) * 3 * std::size_t((max_entries(p) + 3) / 4 * 4) +
         sizeof(float) * kChannels * std::size_t(slots(p));
}

template <Activation kAct, bool kFp8>
void launch_gemm1(const Problem& p, const Params& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(p.config.intermediate_size / kChannels), unsigned(max_entries(p)));
  launch_dependent(gemm1_activation<kAct, kFp8>, grid, dim3(kGemm1Warps * 32), gemm1_shared<kAct>(), stream, kp);
}

// The three launches: the input's preparation with the plan, GEMM1 + activation, GEMM2 + combine.
template <bool kFp8>
void launch_all(const Problem& p, const permute::PlanArgs& plan, const permute::PrepareArgs& prepare, const Params& kp,
                Stream stream, const core::StageProblem& steps) {
  const MoEConfig& c = p.config;
  const cudaStream_t s = as_cuda(stream);
  core::mark_step(steps, "permute", stream);
  permute::run_prepared(plan_problem(p), plan, prepare, stream);
  core::mark_step(steps, "gemm1", stream);
  switch (c.activation) {
    case Activation::silu_and_mul: launch_gemm1<Activation::silu_and_mul, kFp8>(p, kp, s); break;
    case Activation::gelu_and_mul: launch_gemm1<Activation::gelu_and_mul, kFp8>(p, kp, s); break;
    case Activation::swiglu_oai: launch_gemm1<Activation::swiglu_oai, kFp8>(p, kp, s); break;
    case Activation::relu2: launch_gemm1<Activation::relu2, kFp8>(p, kp, s); break;
  }
  core::mark_step(steps, "gemm2", stream);
  launch_dependent(gemm2_combine<kFp8>, dim3(unsigned(c.hidden_size / kChannels)), dim3(kGemm2Warps * 32),
                   gemm2_shared(p), s, kp, int(max_entries(p)));
}

}  // namespace

Status can_implement(const Problem& p) {
  const MoEConfig& c = p.config;
  auto no = [](const std::string& why) { return Status::no("min-latency path: " + why); };
  const bool bf16 = c.quant.scheme == QuantScheme::bf16;
  if (c.quant.scheme != QuantScheme::fp8_block && !bf16)
    return no("takes fp8-block and bf16 layers, given " + std::string(to_string(c.quant.scheme)));
  if (c.quant.accumulation == Fp8Accumulation::strict && !bf16)
    return no("sums 32 products per MMA in the FP8 tensor core; strict accumulation needs f32 sums");
  if (c.batch_invariant) return no("batch-invariant layers keep the large-batch kernels at every T");
  const std::int64_t block = bf16 ? 64 : 128;  // values per 128-byte K block
  if (c.hidden_size % block != 0 || c.intermediate_size % block != 0)
    return no("needs H and I multiples of " + std::to_string(block) + ", given H=" + std::to_string(c.hidden_size) +
              " I=" + std::to_string(c.intermediate_size));
  if (slots(p) > kMaxSlots)
    return no("takes T·k <= " + std::to_string(kMaxSlots) + ", given " + std::to_string(slots(p)));
  const permute::PlanProblem plan = plan_problem(p);
  if (Status s = permute::can_implement(plan); !s) return s;
  if (permute::choose_path(plan) != permute::PlanPath::one_block)
    return no("needs the one-block permutation plan (E_local <= 1024), given E_local=" +
              std::to_string(c.local_experts()));
  if (gemm2_shared(p) > 227 * 1024) return no("the combine's shared memory does not fit");
  return Status::ok();
}

Choice choose(const Problem& p) {
  const ExpertsPath path = p.config.experts_path;
  if (path == ExpertsPath::staged) return {false, "staged path (--path staged)"};
  if (path == ExpertsPath::min_latency) return {true, "min-latency path (--path min-latency)"};
  const Status s = can_implement(p);
  if (!s) return {false, "staged path: " + s.reason()};
  const double per_expert = double(slots(p)) / double(p.config.local_experts());
  const double bound = p.config.quant.scheme == QuantScheme::bf16 ? kAutoRowsPerExpertBf16 : kAutoRowsPerExpertFp8;
  char rule[160];
  std::snprintf(rule, sizeof rule, "T·k / E_local = %.4g rows per expert %s %.4g", per_expert,
                per_expert > bound ? ">" : "<=", bound);
  if (per_expert > bound)
    return {false, "staged path: " + std::string(rule) + " (where the min-latency path stops winning)"};
  if (p.config.quant.scheme == QuantScheme::fp8_block) {
    // W13 and W2 of one expert: 2I x H + H x I FP8 values.
    const double bytes = 3.0 * double(p.config.hidden_size) * double(p.config.intermediate_size);
    if (bytes > kAutoExpertBytesFp8) {
      std::snprintf(rule, sizeof rule, "%.1f MB of weights per expert > %.1f MB", bytes / 1e6, kAutoExpertBytesFp8 / 1e6);
      return {false, "staged path: " + std::string(rule) + " (its decode GEMMs stream large experts faster)"};
    }
  }
  return {true, "min-latency path: " + std::string(rule)};
}

std::size_t workspace_size(const Problem& p) {
  core::Carver c(nullptr);
  carve(c, p);
  return c.used();
}

void run(const Problem& p, const Args& args, core::Workspace workspace, Stream stream,
         const core::StageProblem& steps) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(workspace.size >= workspace_size(p), "min-latency path: workspace too small");
  if (p.tokens == 0) return;
  const MoEConfig& c = p.config;
  core::Carver carver(workspace.data);
  const Buffers b = carve(carver, p);

  permute::PlanArgs plan;
  plan.topk_ids = args.topk_ids;
  plan.counts = b.counts;
  plan.offsets = b.offsets;
  plan.slot_rows = args.slot_rows;
  plan.row_token = b.row_token;
  plan.work = b.work;
  plan.work_rows = kEntryRows;
  plan.zeroed = b.done;
  plan.zeroed_count = max_entries(p) * (c.intermediate_size / 128);
  const bool on_input = c.routing.effective_placement() == WeightPlacement::input;
  permute::PrepareArgs prepare;
  prepare.hidden = args.hidden;
  prepare.weights = on_input ? args.topk_weights : nullptr;
  prepare.x = b.x;
  prepare.x_scales = b.x_scales;
  prepare.hidden_size = c.hidden_size;
  prepare.fp8 = c.quant.scheme != QuantScheme::bf16;
  prepare.ue8m0 = c.quant.scale_format == ScaleFormat::ue8m0;

  Params kp{};
  kp.work = b.work;
  kp.row_token = b.row_token;
  kp.slot_rows = args.slot_rows;
  kp.topk_weights = on_input ? nullptr : args.topk_weights;
  kp.x = b.x;
  kp.x_scales = b.x_scales;
  kp.w13 = static_cast<const std::uint8_t*>(args.w13);
  kp.w13_scales = args.w13_scales;
  kp.act = b.act;
  kp.act_amax = b.act_amax;
  kp.done = b.done;
  kp.q2 = b.q2;
  kp.s2 = b.s2;
  kp.w2 = static_cast<const std::uint8_t*>(args.w2);
  kp.w2_scales = args.w2_scales;
  kp.out = reinterpret_cast<std::uint16_t*>(args.out);
  kp.tokens = int(p.tokens);
  kp.top_k = c.top_k();
  kp.hidden = int(c.hidden_size);
  kp.inter = int(c.intermediate_size);
  kp.alpha = c.swiglu_alpha;
  kp.limit = c.swiglu_limit;
  kp.ue8m0 = c.quant.scale_format == ScaleFormat::ue8m0;

  if (c.quant.scheme == QuantScheme::bf16) launch_all<false>(p, plan, prepare, kp, stream, steps);
  else launch_all<true>(p, plan, prepare, kp, stream, steps);
}

}  // namespace moekit::cuda::min_latency
