// The min-latency path of the GPU Experts stage (DESIGN §6; issue: decode): for a few rows per
// expert, the whole layer after routing in three kernels instead of seven (the stage does
// Prepare's and Finalize's work too: ExpertsStage::whole_layer).
//   1. the input's fp8-block quantization and the one-block permutation plan (alignment 1) with
//      a work list of <= 32-row entries, in one launch
//   2. GEMM1 + activation + requantization (A rows read by token: no gather pass)
//   3. GEMM2 + the weighted combine in slot order (no expert_out, no finalize kernel)
// Each is a programmatic dependent launch of the one before (the first, of routing); everything
// stays on the device (CUDA-graph capturable). fp8-block weights (sums of 32 products per MMA,
// f32 across them) or bf16 (m16n8k16 MMAs, no scales).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/stages.h"
#include "moekit/config.h"

namespace moekit::cuda::min_latency {

// T·k bound of the path (the combine keeps a channel strip of every row in shared memory).
inline constexpr std::int64_t kMaxSlots = 512;
// The automatic rule: at most this many rows per local expert on average (T·k / E_local), and for
// fp8-block experts of at most kAutoExpertBytesFp8 of weights. On the H200 (docs/PERF.md, decode)
// fp8-block is faster up to 1/8 on small experts (qwen3-30b-a3b, 4.7 MB each: T=1 34.2 µs against
// 46.1, T=2 54.0 against 55.9) and slower beyond; on large ones the staged path's decode WGMMA
// GEMMs stream their weights faster than its FP8 warp MMAs (F2FP conversions plus f16 HMMAs on
// sm_90) from T=1 (deepseek-v3, 44 MB each: T=1 140.0 against 139.5, T=2 221.9 against 231.9,
// T=4 351.0 against 386.7). bf16's MMAs are native: faster at every T measured, up to 1/2
// (qwen3-30b-a3b T=8: 152.6 against 173.2).
inline constexpr double kAutoRowsPerExpertFp8 = 0.125;
inline constexpr double kAutoRowsPerExpertBf16 = 0.5;
inline constexpr double kAutoExpertBytesFp8 = 16.0 * 1024 * 1024;

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
  const void* w13 = nullptr;               // [E_local, W, H] e4m3 or bf16
  const float* w13_scales = nullptr;       // [E_local, H / 128, W / 128] (fp8)
  const void* w2 = nullptr;                // [E_local, H, I] e4m3 or bf16
  const float* w2_scales = nullptr;        // [E_local, I / 128, H / 128] (fp8)
  bf16* out = nullptr;                     // [T, H]
};

// steps: the layer's problem, whose observer (if any) hears "permute", "gemm1" and "gemm2".
void run(const Problem& problem, const Args& args, core::Workspace workspace, Stream stream,
         const core::StageProblem& steps);

}  // namespace moekit::cuda::min_latency
