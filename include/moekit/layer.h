// The MoE layer: Router -> Prepare -> Experts -> Finalize, on the chosen backend.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "moekit/backend.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit {

// The layer's parameters, for the experts this rank owns (E_local = E / ep_size).
// W = gemm1_width() (2I gated, I for relu2).
struct Weights {
  TensorView w13;  // [E_local, W, H] bf16 | fp8; rows 0..I-1 gate, I..2I-1 up
  TensorView w2;   // [E_local, H, I] bf16 | fp8
  // f32, multiply semantics (real = q * scale). Absent for bf16.
  //   fp8-tensor  [E_local]      fp8-rowwise [E_local, N]
  //   fp8-block   [E_local, ceil(N/128), ceil(K/128)]
  TensorView w13_scale;
  TensorView w2_scale;
  TensorView e_score_correction_bias;  // [E] f32 | bf16; the *_bias_* methods only
  // fp8-tensor static activation scales, [1] f32 each; absent means dynamic (amax).
  TensorView w13_input_scale;
  TensorView w2_input_scale;
};

struct LayerOptions {
  std::string backend = "auto";  // "auto" (MOEKIT_BACKEND may override) or a backend name
};

// Fused routing: the layer routes from router_logits.
struct FusedArgs {
  TensorView hidden;         // [T, H] bf16
  TensorView router_logits;  // [T, E] f32 | bf16
  TensorView out;            // [T, H] bf16
  TensorView topk_ids;       // optional output [T, k] i32: the routing computed
  TensorView topk_weights;   // optional output [T, k] f32
};

// External routing: the caller routes.
struct ExternalArgs {
  TensorView hidden;        // [T, H] bf16
  TensorView topk_ids;      // [T, k] i32, global ids, -1 = none
  TensorView topk_weights;  // [T, k] f32
  TensorView out;           // [T, H] bf16
};

class Layer {
 public:
  // Validates config and weights, selects the backend. Throws Error.
  Layer(const MoEConfig& config, const Weights& weights, const LayerOptions& options = {});
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // A call with more tokens than any before allocates the layer's buffers first; capture a
  // call in a CUDA graph only after reserve() (or an uncaptured call) for at least its T.
  void forward(const FusedArgs& args, Stream stream = nullptr);
  void forward(const ExternalArgs& args, Stream stream = nullptr);
  // Allocates the buffers for calls of up to max_tokens tokens now.
  void reserve(std::int64_t max_tokens);

  const MoEConfig& config() const;
  const BackendSelection& selection() const;
  std::string_view backend_name() const;
  // Where the layer's tensors must live.
  Device device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit
