// The min-latency path of the GPU Experts stage (DESIGN §6; issue: decode): for a few rows per
// expert, the whole layer after routing in three kernels instead of seven (the stage does
// Prepare's and Finalize's work too: ExpertsStage::whole_layer).
//   1. the input's preparation and the one-block permutation plan (alignment 1) with a work list
//      of <= 32-row entries, in one launch
//   2. GEMM1 + activation (A rows read by token: no gather pass)
//   3. GEMM2 + the weighted combine in slot order (no expert_out, no finalize kernel)
// Each is a programmatic dependent launch of the one before (the first, of routing); everything
// stays on the device (CUDA-graph capturable). bf16 weights (m16n8k16 MMAs). fp8-block layers take
// the staged path's decode WGMMA GEMMs instead: `moekit tune` timed this path's FP8 warp MMAs
// (F2FP conversions plus f16 HMMAs on sm_90) slower than them in every bucket, T = 1 … 64, of
// qwen3-30b-a3b and deepseek-v3 on the H200 and the H100 (qwen3-30b-a3b T=1: 43.3 against 38.6 µs,
// H200), so they were removed (docs/perf-log/decode.md, 2026-12-06).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stages.h"
#include "moekit/config.h"

namespace moekit::cuda::min_latency {

// T·k bound of the path (the combine keeps a channel strip of every row in shared memory).
inline constexpr std::int64_t kMaxSlots = 512;
// The automatic rule: at most this many rows per local expert on average (T·k / E_local). On the
// H200 (docs/PERF.md, decode) bf16 was faster than the staged path at every T measured up to 1/2
// (qwen3-30b-a3b T=8: 152.6 µs against 173.2).
inline constexpr double kAutoRowsPerExpert = 0.5;

struct Problem {
  MoEConfig config;
  std::int64_t tokens = 0;
};

Status can_implement(const Problem& problem);
// Whether the layer takes this path: forced by config.experts_path, else automatic by rows per
// expert where can_implement allows it. The reason is for `moekit explain`.
struct Choice {
  bool taken = false;
  std::string reason;
};
Choice choose(const Problem& problem);
std::size_t workspace_size(const Problem& problem);

struct Args {
  const std::int32_t* topk_ids = nullptr;  // [T, k]
  const float* topk_weights = nullptr;     // [T, k]: on the output, or (k = 1) the input; null: none
  std::int32_t* slot_rows = nullptr;       // [T, k] written (the plan's)
  const bf16* hidden = nullptr;            // [T, H]
  const void* w13 = nullptr;               // [E_local, W, H] bf16
  const void* w2 = nullptr;                // [E_local, H, I] bf16
  bf16* out = nullptr;                     // [T, H]
};

// steps: the layer's problem, whose observer (if any) hears "permute", "gemm1" and "gemm2".
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream,
         const core::StageProblem& steps);

}  // namespace moekit::cuda::min_latency
