// The MoE layer: Router -> Prepare -> Experts -> Finalize, on the chosen backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "moekit/backend.h"
#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit {

class Communicator;  // moekit/comm.h

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

// Host tensors that own a layer's parameters: what the synthetic generator, the checkpoint
// importer and the layer-file reader hand out. Absent tensors give absent views.
struct OwnedWeights {
  Tensor w13, w2;                          // [E_local, W, H], [E_local, H, I]; bf16 | fp8
  Tensor w13_scale, w2_scale;              // f32, the layouts of Weights
  Tensor e_score_correction_bias;          // [E]
  Tensor w13_input_scale, w2_input_scale;  // [1] f32, fp8-tensor static activation scales
  Weights weights() const;
};

// How expert outputs return to their token's rank (DESIGN §7).
//   exact:   one row per (token, expert); the source sums in slot order like ep = 1: bit-identical.
//   partial: one row per (token, rank), the rank's weighted sum; added in rank order. Least traffic.
enum class EpCombine : std::uint8_t { automatic, exact, partial };
std::string_view to_string(EpCombine v);

// barriers (profiling): every rank waits for all before each exchange, and each step for its
// device work, so that the step times of EpStats measure that step: not the wait for the
// slowest rank, and on GPUs not the host's queueing (plain: the combine's time then also
// covers the experts' kernels still running).
enum class EpTiming : std::uint8_t { plain, barriers };

// group:     the ranks of LayerOptions::comm exchange tokens and expert rows (DESIGN §7).
// this_rank: no exchange: this rank's tokens against this rank's experts alone; a token with
//            none of them gets zeros. The ranks' outputs add up to the layer's (within the
//            rounding of the partial sums): for callers that combine the ranks themselves.
enum class EpScope : std::uint8_t { group, this_rank };

struct EpOptions {
  EpScope scope = EpScope::group;
  EpCombine combine = EpCombine::automatic;  // exact on the CPU backend, partial on GPU ones
  // > 0: fixed capacity, at most this many tokens per rank and call. Buffers are sized for the
  // worst case and no counts are exchanged (what CUDA-graph capture needs); more traffic.
  std::int64_t capacity = 0;
  EpTiming timing = EpTiming::plain;
};

// Profiling: the layer calls step() on the host as it enqueues each step of a forward, just
// before the step's work: "routing" (fused routing), "quantize", "permute", "gemm1",
// "activation", "gemm2", "finalize" (with expert parallelism: "routing", "plan", "quantize",
// "dispatch", the experts' steps, "combine"), and step("end") after the last. A GPU caller
// records an event on `stream`; the time from one step to the next is the step's. Do not
// record while a CUDA graph is being captured.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step(std::string_view name, Stream stream) = 0;
};

struct LayerOptions {
  std::string backend = "auto";  // "auto" (MOEKIT_BACKEND may override) or a backend name
  // Required when config.ep_size > 1 (unless ep.scope is this_rank): ep_size ranks, this one
  // ep_rank, moving the backend's memory. Every rank calls forward the same number of times
  // (it is collective); T may differ from rank to rank.
  Communicator* comm = nullptr;
  EpOptions ep;
  StepObserver* observer = nullptr;  // not owned; outlives the Layer
};

// What the last forward of an EP layer moved (this rank), and the host wall time of each step.
struct EpStats {
  std::int64_t tokens = 0;           // this rank's tokens
  std::int64_t records_sent = 0;     // dispatched token rows: one per (token, destination rank)
  std::int64_t records_received = 0;
  std::int64_t record_bytes = 0;     // one dispatched token: row, scales and its routing share
  std::int64_t dispatch_bytes = 0, dispatch_remote_bytes = 0;  // sent by this rank; remote: to other ranks
  std::int64_t combine_bytes = 0, combine_remote_bytes = 0;    // sent back by this rank
  // Host wall clock of each step; see EpTiming for what they cover.
  double prepare_ms = 0, dispatch_ms = 0, experts_ms = 0, combine_ms = 0;
  double wait_ms = 0;  // EpTiming::barriers: time in the barriers (waiting for the slowest rank)
};

// Fused routing: the layer routes from router_logits.
struct FusedArgs {
  TensorView hidden;         // [T, H] bf16
  TensorView router_logits;  // [T, E] f32 | bf16
  TensorView out;            // [T, H] bf16
  TensorView topk_ids;       // optional output [T, k] i32: the routing computed
  TensorView topk_weights;   // optional output [T, k] f32
};

// External routing: the caller routes. topk_ids must lie in [-1, E). What an id out of range
// does depends on where the ids are:
//   - host memory (the cpu backend): forward() throws Error naming topk_ids, before any output;
//   - expert parallelism (any backend): the ids are copied to the host for the dispatch plan
//     and checked there: the same Error, on the rank that holds them, before the exchange (the
//     other ranks then fail at their collective timeout);
//   - device memory on one GPU (cuda): the ids are not read by the host; the permutation plan
//     treats an id outside [0, E) as "no expert" (src/cuda/permute/plan.cuh local_expert), so
//     the slot contributes nothing, as -1 does. Nothing is read or written out of bounds.
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
  // Allocates the buffers for calls of up to max_tokens tokens now. With expert parallelism
  // what arrives depends on the other ranks: the buffers then hold calls in which no rank has
  // more than max_tokens tokens (fixed capacity: any call).
  void reserve(std::int64_t max_tokens);
  // Bytes the layer holds for its calls' intermediates, on its device (the weights not counted).
  std::size_t workspace_bytes() const;

  const MoEConfig& config() const;
  const BackendSelection& selection() const;
  std::string_view backend_name() const;
  // Where the layer's tensors must live.
  Device device() const;
  // Expert parallelism (ep_size > 1): the combine mode in use and the last forward's traffic.
  EpCombine ep_combine() const;
  EpStats ep_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit
