#include "cuda/layer/min_latency.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda/common/check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/layer/min_latency.cuh"
#include "cuda/permute/plan.cuh"

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
  std::int32_t *counts, *offsets, *row_token, *work;
  std::uint8_t *x, *act;  // bf16
};

Buffers carve(core::Carver& c, const Problem& p) {
  const std::int64_t rows = slots(p), e = p.config.local_experts();
  auto ints = [&](std::int64_t n) { return reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(n))); };
  auto values = [&](std::int64_t n) { return reinterpret_cast<std::uint8_t*>(c.take(sizeof(bf16) * std::size_t(n))); };
  Buffers b;
  b.counts = ints(e);
  b.offsets = ints(e + 1);
  b.row_token = ints(rows);
  b.work = ints(1 + 3 * max_entries(p));
  b.x = values(p.tokens * p.config.hidden_size);
  b.act = values(rows * p.config.intermediate_size);
  return b;
}

std::size_t gemm2_shared(const Problem& p) {
  return gemm2_ring_bytes() + sizeof(int) * 3 * std::size_t((max_entries(p) + 3) / 4 * 4) +
         sizeof(float) * kChannels * std::size_t(slots(p));
}

template <Activation kAct>
void launch_gemm1(const Problem& p, const Params& kp, cudaStream_t stream) {
  const dim3 grid(unsigned(p.config.intermediate_size / kChannels), unsigned(max_entries(p)));
  launch_dependent(gemm1_activation<kAct>, grid, dim3(kGemm1Warps * 32), gemm1_shared<kAct>(), stream, kp);
}

// The three launches: the input's preparation with the plan, GEMM1 + activation, GEMM2 + combine.
void launch_all(const Problem& p, const permute::PlanArgs& plan, const permute::PrepareArgs& prepare, const Params& kp,
                Stream stream, const core::StageProblem& steps) {
  const MoEConfig& c = p.config;
  const cudaStream_t s = as_cuda(stream);
  core::mark_step(steps, "permute", stream);
  permute::run_prepared(plan_problem(p), plan, prepare, stream);
  core::mark_step(steps, "gemm1", stream);
  switch (c.activation) {
    case Activation::silu_and_mul: launch_gemm1<Activation::silu_and_mul>(p, kp, s); break;
    case Activation::gelu_and_mul: launch_gemm1<Activation::gelu_and_mul>(p, kp, s); break;
    case Activation::swiglu_oai: launch_gemm1<Activation::swiglu_oai>(p, kp, s); break;
    case Activation::relu2: launch_gemm1<Activation::relu2>(p, kp, s); break;
  }
  core::mark_step(steps, "gemm2", stream);
  launch_dependent(gemm2_combine, dim3(unsigned(c.hidden_size / kChannels)), dim3(kGemm2Warps * 32),
                   gemm2_shared(p), s, kp, int(max_entries(p)));
}

}  // namespace

Status can_implement(const Problem& p) {
  const MoEConfig& c = p.config;
  auto no = [](const std::string& why) { return Status::no("min-latency path: " + why); };
  if (c.quant.scheme == QuantScheme::fp8_block)
    return no("takes bf16 layers, given fp8-block (the staged path's decode WGMMA GEMMs measured faster)");
  if (c.quant.scheme != QuantScheme::bf16)
    return no("takes bf16 layers, given " + std::string(to_string(c.quant.scheme)));
  if (c.batch_invariant) return no("batch-invariant layers keep the large-batch kernels at every T");
  constexpr std::int64_t kBlock = 64;  // bf16 values per 128-byte K block
  if (c.hidden_size % kBlock != 0 || c.intermediate_size % kBlock != 0)
    return no("needs H and I multiples of " + std::to_string(kBlock) + ", given H=" + std::to_string(c.hidden_size) +
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
  char rule[160];
  std::snprintf(rule, sizeof rule, "T·k / E_local = %.4g rows per expert %s %.4g", per_expert,
                per_expert > kAutoRowsPerExpert ? ">" : "<=", kAutoRowsPerExpert);
  if (per_expert > kAutoRowsPerExpert)
    return {false, "staged path: " + std::string(rule) + " (where the min-latency path stops winning)"};
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
  const bool on_input = c.routing.effective_placement() == WeightPlacement::input;
  permute::PrepareArgs prepare;
  prepare.hidden = args.hidden;
  prepare.weights = on_input ? args.topk_weights : nullptr;
  prepare.x = b.x;
  prepare.hidden_size = c.hidden_size;
  prepare.fp8 = false;

  Params kp{};
  kp.work = b.work;
  kp.row_token = b.row_token;
  kp.slot_rows = args.slot_rows;
  kp.topk_weights = on_input ? nullptr : args.topk_weights;
  kp.x = b.x;
  kp.w13 = static_cast<const std::uint8_t*>(args.w13);
  kp.act = b.act;
  kp.w2 = static_cast<const std::uint8_t*>(args.w2);
  kp.out = reinterpret_cast<std::uint16_t*>(args.out);
  kp.tokens = int(p.tokens);
  kp.top_k = c.top_k();
  kp.hidden = int(c.hidden_size);
  kp.inter = int(c.intermediate_size);
  kp.alpha = c.swiglu_alpha;
  kp.limit = c.swiglu_limit;
  launch_all(p, plan, prepare, kp, stream, steps);
}

}  // namespace moekit::cuda::min_latency
