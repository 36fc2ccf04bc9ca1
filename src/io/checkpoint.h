// Importing one MoE layer from a Hugging Face checkpoint folder: config.json plus
// model.safetensors, or shards listed by model.safetensors.index.json.
//
// Per-expert tensors, either naming scheme (N = layer, e = expert):
//   model.layers.N.mlp.experts.e.{gate,up,down}_proj.weight           (DeepSeek, Qwen)
//   model.layers.N.block_sparse_moe.experts.e.{w1,w3,w2}.weight       (Mixtral, MiniMax)
// FP8 weights carry `.weight_scale_inv` 128x128 block scales (DeepSeek style; despite the
// name they multiply) and import as fp8-block; bf16/f16/f32 weights import as bf16.
// Router: `<moe>.gate.weight` [E, H]; bias `<moe>.gate.e_score_correction_bias` or
// `<moe>.e_score_correction_bias` [E]. Shared experts, when ImportOptions::shared_experts asks for
// them: DeepSeek's `model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight`, one MLP of
// n_shared_experts x moe_intermediate_size channels, split into that many experts of
// moe_intermediate_size (exact: the channels of an MLP add up), after the routed ones.
#pragma once

#include <string>

#include "moekit/config.h"
#include "moekit/layer.h"
#include "moekit/tensor.h"

namespace moekit::io {

struct ImportOptions {
  int ep_size = 1, ep_rank = 0;  // only this rank's experts are read
  // 0: the routed experts alone; else config.json's n_shared_experts (an Error naming
  // shared_experts otherwise), read on every rank.
  std::int64_t shared_experts = 0;
};

// w13 [E_local + S, 2I, H] gate rows then up rows, w2 [E_local + S, H, I] (bf16 | fp8); the scales
// for fp8-block only: [E_local + S, 2I/128, ceil(H/128)], [E_local + S, ceil(H/128), ceil(I/128)];
// e_score_correction_bias [E] f32 when the checkpoint has one.
struct CheckpointLayer : OwnedWeights {
  MoEConfig config;
  Tensor gate_weight;  // router [E, H] f32 (converted from bf16/f16/f32)
};

// Reads only the tensors of this rank's experts of one layer. Throws moekit::Error naming the
// tensor and the file on a missing layer or tensor, a shape or dtype mismatch, or a
// config.json this importer does not understand.
CheckpointLayer import_hf_layer(const std::string& folder, int layer_index, const ImportOptions& options);

// The config import_hf_layer would return, after the same checks (config.json, every tensor's
// name, shape and dtype in the safetensors headers), without reading any tensor data.
MoEConfig inspect_hf_layer(const std::string& folder, int layer_index, const ImportOptions& options);

}  // namespace moekit::io
