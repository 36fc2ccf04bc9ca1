// The MoE layer: Router -> Prepare -> Experts -> Finalize, on the chosen backend.
//
// Lifetimes and threads, in one place:
//   - Weights are views. A Layer (or PreparedWeights) made from weights in its backend's memory
//     borrows them: they must stay alive and unchanged until the last Layer and PreparedWeights
//     made from them is destroyed. Host weights given to a device backend are copied; the caller
//     may free them once the constructor returns. See PreparedWeights for what is copied.
//   - A Layer is fixed at construction. forward with a caller Workspace reads the Layer and
//     writes only the call's outputs and workspace: any number of threads may call it at once,
//     each with its own workspace (and, on CUDA, on any streams; a StepObserver is then called
//     from each of those threads). The owning forward and reserve
//     use the Layer's own buffer: calls of those on one Layer must not overlap (serialize them,
//     or give each thread its own Layer over one PreparedWeights). ep_stats() reads what the last
//     EP forward wrote.
//   - On the cpu backend forward runs on the calling thread (and moekit's worker threads) and
//     returns when done. On cuda it enqueues work on `stream` (cudaStream_t; null = the legacy
//     default stream) and returns: the call's tensors and workspace must stay alive and untouched
//     until the stream has finished it. The layer runs on the CUDA device that was current when
//     its weights were prepared; call forward with that device current.
//   - Expert parallelism (LayerOptions::comm): forward is collective, and the layer keeps its
//     exchange buffers itself (their size depends on the other ranks).
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

// The layer's parameters, for the experts this rank owns (E_local = E / ep_size), then the S =
// MoEConfig::shared_experts shared ones (every rank holds them): E_local + S experts along dim 0 of
// w13, w2 and their scales. W = gemm1_width() (2I gated, I for relu2).
struct Weights {
  TensorView w13;  // [E_local + S, W, H] bf16 | fp8; rows 0..I-1 gate, I..2I-1 up
  TensorView w2;   // [E_local + S, H, I] bf16 | fp8
  // f32, multiply semantics (real = q * scale). Absent for bf16. (E_local counts the shared experts here.)
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
//            rounding of the partial sums): for callers that combine the ranks themselves. Not with
//            shared experts (every rank would add them).
enum class EpScope : std::uint8_t { group, this_rank };

struct EpOptions {
  EpScope scope = EpScope::group;
  EpCombine combine = EpCombine::automatic;  // exact on the CPU backend, partial on GPU ones
  // > 0: fixed capacity, at most this many tokens per rank and call. Buffers are sized for the
  // worst case at construction, no counts are exchanged and the dispatch plan is made where the
  // routing is (on a GPU, by a kernel): the forward never waits on the host, so a CUDA graph can
  // capture it; more traffic. The caller waits for it: Communicator::synchronize(stream) fails
  // within the communicator's timeout where a peer died or stalls (cudaStreamSynchronize would
  // hang). 0: the counts go through the host and forward waits for the exchange itself.
  std::int64_t capacity = 0;
  EpTiming timing = EpTiming::plain;
};

// Profiling: the layer calls step() on the host as it enqueues each step of a forward, just
// before the step's work: "routing" (fused routing), "shared" (shared experts appended to the
// routing), "quantize", "permute", "gemm1",
// "activation", "gemm2", "finalize" (with expert parallelism: "routing", "plan", "quantize",
// "dispatch", the experts' steps, "combine"), and step("end") after the last. A GPU caller
// records an event on `stream`; the time from one step to the next is the step's. Do not
// record while a CUDA graph is being captured.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step(std::string_view name, Stream stream) = 0;
};

// Measured tactics (docs/TUNE.md; `moekit tune` writes them). An entry applies only on an exact
// match of GPU, SM count, CUDA runtime, moekit version, problem and token bucket; everything else
// runs the heuristic. A file that cannot be read or parsed is ignored (`moekit explain` and
// MOEKIT_LOG=warn say why): a cache never makes a layer fail.
struct TuningOptions {
  // A tuning cache file; "off": none. Empty: MOEKIT_TUNING_CACHE when set (a path, or "off"), else
  // $XDG_CACHE_HOME/moekit/tuning.json (~/.cache/moekit/tuning.json) when it exists.
  std::string cache;
  // The cache's JSON text instead of a file (tools, tests); `cache` then only names it in messages.
  std::string json;
};

struct LayerOptions {
  std::string backend = "auto";  // "auto" (MOEKIT_BACKEND may override) or a backend name
  // Required when config.ep_size > 1 (unless ep.scope is this_rank): ep_size ranks, this one
  // ep_rank, moving the backend's memory. Every rank calls forward the same number of times
  // (it is collective); T may differ from rank to rank.
  Communicator* comm = nullptr;
  EpOptions ep;
  StepObserver* observer = nullptr;  // not owned; outlives the Layer
  // The most tokens one forward will be given (an engine's largest batch). Every stage's
  // capability is checked at construction for T = 1 and T = max_tokens, so that "auto" keeps a
  // backend that can run every call and forward only checks the call's tensors; a call with more
  // tokens is an Error. 0: not declared; construction checks T = 1 and each forward checks its T.
  std::int64_t max_tokens = 0;
  TuningOptions tuning;
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
//   - expert parallelism (any backend, EpOptions::capacity 0): the ids are copied to the host
//     for the dispatch plan and checked there: the same Error, on the rank that holds them,
//     before the exchange (the other ranks then fail at their collective timeout); with a fixed
//     capacity the CPU's plan throws so too, a GPU's plan (a kernel) counts them as -1;
//   - device memory on one GPU (cuda): the ids are not read by the host; the permutation plan
//     treats an id outside [0, E) as "no expert" (src/cuda/permute/plan.cuh local_expert), so
//     the slot contributes nothing, as -1 does. Nothing is read or written out of bounds.
//   - with shared experts, device ids are first appended to on the device (core/shared.h), where an
//     id outside [0, E) becomes -1: "no expert" on one GPU and under expert parallelism too.
struct ExternalArgs {
  TensorView hidden;        // [T, H] bf16
  TensorView topk_ids;      // [T, k] i32, global ids, -1 = none
  TensorView topk_weights;  // [T, k] f32
  TensorView out;           // [T, H] bf16
};

// The masked format: the tokens already grouped by local expert, as expert-parallel decode
// dispatches them (DeepEP's low-latency dispatch; DeepGEMM's masked grouped GEMMs take the same
// layout): expert e's rows are the first counts[e] of its block of C (the capacity). Only the
// experts run: no routing, no routing weights, no combine (the caller's combine applies them).
// bf16 and fp8-block layers. The counts stay on the device (nothing waits for the host: the call
// can be captured in a CUDA graph); a count outside [0, C] is clamped to it.
// E_local here counts the layer's shared experts: they are the last S blocks.
struct MaskedArgs {
  TensorView hidden;        // [E_local, C, H]: bf16 (fp8-block layers quantize it, every row of every
                            //   block: ~E_local C H of reads), or fp8 e4m3 with hidden_scale (fp8-block)
  TensorView hidden_scale;  // fp8 hidden: [E_local, C, ceil(H/128)] f32, row-major or with C contiguous
                            //   (strides [ceil(H/128) C, 1, C], DeepEP's layout); absent for bf16
  TensorView counts;        // [E_local] i32: the rows of each expert's block that hold a token
  TensorView out;           // [E_local, C, H] bf16: row j < counts[e] of block e gets expert e's output
                            //   for it; the other rows are not written
  // The rows per expert the caller expects (DeepGEMM's expected_m): a hint for the GEMM tiles, in
  // [0, C]; 0: C.
  std::int64_t expected_rows = 0;
};

// Memory a forward may use for its intermediates, owned by the caller: in the layer's device
// memory (host memory for cpu), 256-byte aligned, at least Layer::workspace_size(T) bytes.
struct Workspace {
  void* data = nullptr;
  std::size_t size = 0;
};

// A layer's weights made ready for one backend: in its memory, in its kernels' layouts. Made
// once, when the caller chooses (an engine: after loading the checkpoint); any number of Layers
// of its config share it (copies of a PreparedWeights share one preparation).
//   - borrowed, never copied: tensors already in the backend's memory (cuda: device memory of
//     the current device; cpu: host memory), the FP8 values among them. They must stay alive,
//     unchanged and in place as long as this object or a Layer made from it lives.
//   - copied: host tensors given to a device backend (the caller may free them afterwards), and
//     on cuda the FP8 weight scales always: the grouped GEMMs read them MN-major per 128 of K
//     ([E_local, ceil(K/128), ceil(N/128)] for fp8-block, per-row and per-tensor ones repeated over
//     the K blocks, [E_local, ceil(K/128), N]); the relayout runs on the device (deepseek-v3: 2.8 MB
//     per layer next to its 11.3 GB of FP8 weights). bf16 layers copy nothing.
// owned_bytes() says what was allocated.
class PreparedWeights {
 public:
  // Checks weights against config (all of them in one memory: the host, or the backend's
  // device), selects the backend as a Layer does (options.backend and options.max_tokens; the
  // rest of options is not read) and prepares the weights. Device work runs on `stream`, after
  // what is queued there already (e.g. the copy that filled the weights), and has finished when
  // this returns. Throws Error.
  PreparedWeights(const MoEConfig& config, const Weights& weights, const LayerOptions& options = {},
                  Stream stream = nullptr);

  const MoEConfig& config() const;
  const BackendSelection& selection() const;
  std::string_view backend_name() const;
  Device device() const;
  std::size_t owned_bytes() const;  // bytes this preparation allocated in the backend's memory

 private:
  friend class Layer;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

class Layer {
 public:
  // Validates config and weights, selects the backend and prepares the weights for it
  // (PreparedWeights(config, weights, options)). Throws Error.
  Layer(const MoEConfig& config, const Weights& weights, const LayerOptions& options = {});
  // On weights prepared before: nothing is copied. options.backend must be "auto" or the
  // prepared backend; a larger options.max_tokens than the preparation's is checked again.
  explicit Layer(const PreparedWeights& weights, const LayerOptions& options = {});
  ~Layer();
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // With the layer's own buffer: a call with more tokens than any before allocates it first;
  // capture a call in a CUDA graph only after reserve() (or an uncaptured call) for its T.
  void forward(const FusedArgs& args, Stream stream = nullptr);
  void forward(const ExternalArgs& args, Stream stream = nullptr);
  // With the caller's workspace (at least workspace_size(T) for the call's T): nothing is
  // allocated, the Layer is not written (see the top of this file), and the call can be
  // captured in a CUDA graph as it is. Not with expert parallelism (an Error).
  void forward(const FusedArgs& args, const Workspace& workspace, Stream stream) const;
  void forward(const ExternalArgs& args, const Workspace& workspace, Stream stream) const;
  // Bytes of workspace a call of up to max_tokens tokens needs (fused or external routing).
  std::size_t workspace_size(std::int64_t max_tokens) const;

  // The masked format (MaskedArgs), with the layer's own buffer or the caller's workspace (at least
  // masked_workspace_size(C)); in the workspace form as capturable as the other forwards.
  void forward(const MaskedArgs& args, Stream stream = nullptr);
  void forward(const MaskedArgs& args, const Workspace& workspace, Stream stream) const;
  std::size_t masked_workspace_size(std::int64_t capacity) const;

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
