// The layer file of DESIGN §2: one MoE layer, its inputs and its config in one
// safetensors file. Tensors are named as in the design's table; the config travels in
// __metadata__ as strings spelled like the CLI (config.h's parse_* functions).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::io {

// Metadata keys beyond the config's required ones:
//   ep_size, ep_rank          absent = 1, 0
//   scale_format              "f32" (default) | "ue8m0"
//   w13_order                 "gate_up" (default) | "up_gate" (TensorRT-LLM's w3_w1): read_layer_file
//                             swaps w13's halves (and w13_scale's for rowwise/block) so the result
//                             is always gate_up
//   weight_placement          "output" (default) | "input"
//   swiglu_alpha, swiglu_limit   swiglu_oai's constants, absent = 1.702, 7.0
//   shared_experts, shared_expert_weight   the shared experts (MoEConfig), absent = 0, 1
// The weights (OwnedWeights): w13, w2 bf16 | fp8 per quant, [E_local + S, ...]: the shared experts
// follow the routed ones; scales f32 in DESIGN §4's layout (fp8-tensor [E_local + S]);
// e_score_correction_bias [E] f32 | bf16; the input scales [1] f32.
struct LayerFile : OwnedWeights {
  MoEConfig config;
  Tensor hidden;                       // [T, H] bf16
  Tensor router_logits;                // [T, E] f32 | bf16; absent for external routing
  Tensor topk_ids, topk_weights;       // [T, k] i32, f32; present for external routing
  std::map<std::string, Tensor> extra;     // every other tensor (expected_out, ...)
};

// Reads and validates a layer file: required metadata keys present and parsable (the Error
// names the key), tensor dtypes and shapes consistent with the config (the Error names the
// tensor, expected vs given), the optional ones included: expected_out [T, H] bf16,
// expected_topk_ids [T, k] i32, expected_topk_weights [T, k] f32 when present; topk_ids
// values in [-1, E). Shapes are checked before any tensor data is read.
LayerFile read_layer_file(const std::string& path);

// What read_layer_file checks, from the header alone (no tensor data is read): for `moekit
// explain`, which needs the problem and not the weights. topk_ids values are data: unchecked.
struct LayerFileInfo {
  MoEConfig config;
  std::int64_t tokens = 0;  // T, hidden's rows
  bool has_router_logits = false, has_topk = false;
  std::vector<std::string> extra;  // the names of the other tensors (expected_out, ...)
};
LayerFileInfo inspect_layer_file(const std::string& path);

// Validates like read_layer_file, then writes the config as metadata and every present
// tensor (extra included). w13 is written gate_up. Nothing is written on error.
void write_layer_file(const std::string& path, const LayerFile& file);

// The same from views of host tensors (e.g. a run's generated weights and inputs): absent views
// are left out; extra tensors follow under their own names.
struct LayerViews {
  MoEConfig config;
  TensorView hidden, router_logits, topk_ids, topk_weights;
  Weights weights;
};
void write_layer_file(const std::string& path, const LayerViews& layer, const std::vector<NamedTensor>& extra = {});

// The metadata strings for a config (defaults of the optional keys are left out).
std::map<std::string, std::string> config_metadata(const MoEConfig& config);
// The inverse; validates the result (moekit::validate). Unknown keys are ignored.
MoEConfig parse_config_metadata(const std::map<std::string, std::string>& metadata);

}  // namespace moekit::io
