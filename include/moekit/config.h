// The MoE problem: sizes, routing, quantization, activation, expert parallelism.
// Names of the enums' values are the spelling used everywhere (CLI, layer files, JSON).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace moekit {

enum class Activation : std::uint8_t { silu_and_mul, gelu_and_mul, swiglu_oai, relu2 };

enum class QuantScheme : std::uint8_t { bf16, fp8_tensor, fp8_rowwise, fp8_block };

// How a dynamic FP8 scale is stored: any f32, or rounded up to a power of two (UE8M0).
enum class ScaleFormat : std::uint8_t { f32, ue8m0 };
// How much of K an FP8 GEMM may sum inside the tensor core before f32 takes over (the CPU
// backend always sums in f32; bf16 layers take only the default). DESIGN §8 holds each mode to
// its own check rule (core/check.h). fast, the default: 128 of K, as DeepSeek-V3's recipe,
// DeepGEMM and CUTLASS's blockwise mainloop do: about 5.2e-3 from the pipeline reference on an
// H200, within max(1e-2, 0.15 q) and no worse than 1.02 q against the ideal. exact: at most 32
// for GEMM1, whose bf16 output is requantized to FP8 (a last-bit difference there can become a
// whole FP8 step): ~4e-3, held to 5e-3, slower at large batches. GEMM2, whose output is the
// result, sums 128 in both. strict: both GEMMs as f16 WGMMAs on the FP8 values (e4m3 is exact in
// f16, and that tensor-core path sums as f32 does): 2.5e-4 from the reference at deepseek-v3
// T=4096, at 38-47% more layer time than exact there (docs/PERF.md).
enum class Fp8Accumulation : std::uint8_t { exact, fast, strict };

// Which kernels a GPU layer runs for its experts. automatic: the min-latency path (fewer, fused
// kernels: plan, GEMM1 + activation, GEMM2 + combine; bf16 layers) where the layer allows it and
// the batch has at most a few rows per expert, else the staged path (permute, GEMM1, activation, GEMM2,
// finalize). staged / min_latency force one; a layer the forced path cannot run is refused by
// name. The CPU backend has the staged path only.
enum class ExpertsPath : std::uint8_t { automatic, staged, min_latency };

enum class RoutingMethod : std::uint8_t {
  softmax_topk,
  topk_softmax,
  softmax_topk_renorm,
  sigmoid_topk,
  sigmoid_topk_renorm,
  sigmoid_bias_grouped,
  sigmoid_bias_renorm,
  top1_sigmoid,
  external,
};

// Where topk_weights multiply: the experts' outputs (usual), or the hidden row before the
// experts (Llama-4's apply_router_weight_on_input; needs top_k == 1).
enum class WeightPlacement : std::uint8_t { output, input };

std::string_view to_string(Activation v);
std::string_view to_string(QuantScheme v);
std::string_view to_string(ScaleFormat v);
std::string_view to_string(Fp8Accumulation v);
std::string_view to_string(RoutingMethod v);
std::string_view to_string(WeightPlacement v);
std::string_view to_string(ExpertsPath v);

// Each parser throws Error naming `argument` and listing the valid spellings.
Activation parse_activation(std::string_view text, std::string_view argument = "activation");
QuantScheme parse_quant_scheme(std::string_view text, std::string_view argument = "quant");
RoutingMethod parse_routing_method(std::string_view text, std::string_view argument = "routing");
Fp8Accumulation parse_fp8_accumulation(std::string_view text, std::string_view argument = "accumulation");
ExpertsPath parse_experts_path(std::string_view text, std::string_view argument = "experts_path");

// The number of FP8 elements one scale covers along K in fp8-block, and the weight block.
inline constexpr std::int64_t kBlock = 128;

struct RoutingConfig {
  RoutingMethod method = RoutingMethod::softmax_topk_renorm;
  int top_k = 1;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  WeightPlacement weight_placement = WeightPlacement::output;

  // top1_sigmoid places its weight on the input; every other method on the output.
  WeightPlacement effective_placement() const;
  bool uses_bias() const;
  std::string to_string() const;
};

struct QuantConfig {
  QuantScheme scheme = QuantScheme::bf16;
  ScaleFormat scale_format = ScaleFormat::f32;
  Fp8Accumulation accumulation = Fp8Accumulation::fast;  // FP8 layers; bf16 takes only this
  std::string to_string() const;
};

struct MoEConfig {
  std::int64_t num_experts = 0;        // E (global)
  std::int64_t hidden_size = 0;        // H
  std::int64_t intermediate_size = 0;  // I (per expert)
  Activation activation = Activation::silu_and_mul;
  QuantConfig quant;
  RoutingConfig routing;
  int ep_size = 1;
  int ep_rank = 0;
  // swiglu_oai's constants (gpt-oss).
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // Batch invariance (DESIGN §8): a token's output bits do not depend on the other tokens of the
  // batch or on the batch size. Every step but the GEMMs computes each token on its own anyway;
  // with this set the GEMMs keep one kernel for every batch size (the one a large batch gets), at
  // some cost for small batches. fp8-tensor, whose activation scale comes from the whole
  // batch's amax, is refused.
  bool batch_invariant = false;
  ExpertsPath experts_path = ExpertsPath::automatic;
  // Shared experts (DeepSeek-V3/R1: 1): experts every token runs besides its top_k routed ones,
  // with the weight shared_expert_weight (DeepSeek's 1: routed_scaling_factor scales the routed
  // weights alone). The layer fuses them as SGLang does: each token's routing gets them appended
  // as extra experts, slots k..k+S-1 (core/shared.h). Their weights follow the routed experts' in
  // w13, w2 and the scales, in the same layouts and quantization: [E_local + S, ...] on every rank
  // (replicated under expert parallelism: each rank runs them for its own tokens, nothing is sent).
  std::int64_t shared_experts = 0;
  float shared_expert_weight = 1.0f;

  int top_k() const { return routing.top_k; }
  bool gated() const { return activation != Activation::relu2; }
  // Rows of w13 per expert: 2I for gated activations, I for relu2.
  std::int64_t gemm1_width() const { return gated() ? 2 * intermediate_size : intermediate_size; }
  std::int64_t local_experts() const { return num_experts / ep_size; }
  std::int64_t first_local_expert() const { return ep_rank * local_experts(); }
  // Experts whose weights this rank holds: its routed experts, then the shared ones.
  std::int64_t weight_experts() const { return local_experts() + shared_experts; }
  std::string to_string() const;
};

// Throws Error naming the first field that breaks DESIGN §3/§4 rules.
void validate(const RoutingConfig& routing, std::int64_t num_experts);
void validate(const MoEConfig& config);

}  // namespace moekit
