// The stage contract of DESIGN §6, as backends implement it:
//   can_implement(problem) -> Status, workspace_size(problem) -> bytes, run(args, workspace, stream).
// run never allocates; the Layer sizes and owns all buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <vector>

#include "core/rows.h"
#include "moekit/backend.h"
#include "moekit/config.h"
#include "moekit/error.h"
#include "moekit/layer.h"
#include "moekit/routing.h"
#include "moekit/tensor.h"

namespace moekit::core {

struct Workspace {
  std::byte* data = nullptr;
  std::size_t size = 0;
};

// Hands out aligned pieces of a buffer; with a null base it only adds up the sizes.
class Carver {
 public:
  explicit Carver(std::byte* base) : base_(base) {}
  std::byte* take(std::size_t bytes) {
    std::byte* p = base_ ? base_ + used_ : nullptr;
    used_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return p;
  }
  TensorView tensor(DType dtype, const std::vector<std::int64_t>& shape, Device device) {
    return place(TensorView::contiguous(nullptr, dtype, shape, device));
  }
  // The same from a braced shape: nothing allocated (the layer carves at every call).
  TensorView tensor(DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
    return place(TensorView::contiguous(nullptr, dtype, shape, device));
  }
  std::size_t used() const { return used_; }

 private:
  TensorView place(TensorView v) {
    v.data = take(v.nbytes());
    return v;
  }
  static constexpr std::size_t kAlign = 256;
  std::byte* base_;
  std::size_t used_ = 0;
};

struct StageProblem {
  MoEConfig config;
  std::int64_t tokens = 0;
  // EP: the ranks over which a dynamic fp8-tensor amax is taken (every rank quantizes with
  // the scale ep = 1 would use). Null: this rank's rows alone.
  Communicator* group = nullptr;
  StepObserver* observer = nullptr;  // LayerOptions::observer
};

// Tells the observer (if any) that step `name` is about to be enqueued.
inline void mark_step(const StageProblem& problem, std::string_view name, Stream stream) {
  if (problem.observer) problem.observer->step(name, stream);
}

class Stage {
 public:
  virtual ~Stage() = default;
  virtual Status can_implement(const StageProblem& problem) const = 0;
  virtual std::size_t workspace_size(const StageProblem& problem) const = 0;
};

struct RouterArgs {
  RoutingInputs in;
  RoutingOutputs out;
};

class RouterStage : public Stage {
 public:
  virtual void run(const StageProblem& problem, const RouterArgs& args, Workspace workspace,
                   Stream stream) const = 0;
};

// Shared experts (core/shared.h): the layer's routing with them appended, in experts_config's ids.
// Run with the layer's own config (StageProblem::config), after routing and before Prepare.
struct SharedArgs {
  TensorView topk_ids;      // [T, k] i32, the layer's routing
  TensorView topk_weights;  // [T, k] f32
  TensorView out_ids;       // [T, k + S] i32
  TensorView out_weights;   // [T, k + S] f32
};

class SharedStage : public Stage {
 public:
  virtual void run(const StageProblem& problem, const SharedArgs& args, Workspace workspace, Stream stream) const = 0;
};

struct PrepareArgs {
  TensorView hidden;        // [T, H] bf16
  TensorView topk_weights;  // [T, 1] f32, read when the weights go on the input
  QuantizedRows out;        // [T, H]
};

class PrepareStage : public Stage {
 public:
  virtual void run(const StageProblem& problem, const PrepareArgs& args, Workspace workspace,
                   Stream stream) const = 0;
};

struct ExpertsArgs {
  QuantizedRows in;         // [T, H]
  TensorView topk_ids;      // [T, k] i32
  TensorView topk_weights;  // [T, k] f32
  TensorView expert_out;    // [max_rows, H] bf16, permuted order
  TensorView slot_rows;     // [T, k] i32: row of expert_out for each slot, -1 = none
  TensorView hidden;        // [T, H] bf16, the layer's input: read when whole_layer(problem)
  TensorView out;           // [T, H] bf16, the layer's output: written when whole_layer(problem)
};

// The masked format (moekit::MaskedArgs, checked by the layer): E_local blocks of `capacity` rows.
struct MaskedProblem {
  MoEConfig config;
  std::int64_t capacity = 0;       // C >= 1
  std::int64_t expected_rows = 0;  // in [1, C]: rows per expert the caller expects
  bool fp8_input = false;          // hidden is fp8 with hidden_scale (else bf16)
  bool scales_mn_major = false;    // hidden_scale has C contiguous (strides [kb C, 1, C])
  StepObserver* observer = nullptr;
};

struct MaskedExpertsArgs {
  TensorView hidden;        // [E_local, C, H] bf16 | fp8
  TensorView hidden_scale;  // [E_local, C, ceil(H/128)] f32, fp8 input only
  TensorView counts;        // [E_local] i32, clamped to [0, C] where read
  TensorView out;           // [E_local, C, H] bf16: rows below the counts
};

class ExpertsStage : public Stage {
 public:
  // The masked format: the experts of each block's first counts[e] rows, from hidden to out.
  virtual Status can_implement_masked(const MaskedProblem& problem) const = 0;
  virtual std::size_t masked_workspace_size(const MaskedProblem& problem) const = 0;
  virtual void run_masked(const MaskedProblem& problem, const MaskedExpertsArgs& args, Workspace workspace,
                          Stream stream) const = 0;

  // Whether expert_out rows already carry topk_weights (else Finalize applies them).
  virtual bool applies_weights() const = 0;
  // Rows of expert_out (and the range of slot_rows): T * k, plus any padding of the format.
  virtual std::int64_t max_rows(const StageProblem& problem) const = 0;
  // Whether run does Prepare's and Finalize's work itself, from args.hidden to args.out (the
  // layer then runs neither, and `in` and expert_out are not used); only where both are given.
  virtual bool whole_layer(const StageProblem&) const { return false; }
  // Whether run does Finalize's work itself: each token's k rows of expert_out, weighted, summed
  // into args.out (the layer then runs no Finalize); only where args.out is given.
  virtual bool finalizes(const StageProblem&) const { return false; }
  // Whether run prepares the input itself (Prepare's work on args.hidden, into args.in, in its
  // permutation plan's launch): the layer then skips Prepare; only where args.hidden is given.
  virtual bool prepares_input(const StageProblem&) const { return false; }
  virtual void run(const StageProblem& problem, const ExpertsArgs& args, Workspace workspace,
                   Stream stream) const = 0;
};

struct FinalizeArgs {
  TensorView expert_out;    // [max_rows, H] bf16
  TensorView slot_rows;     // [T, k] i32
  TensorView topk_weights;  // [T, k] f32, absent when nothing is left to apply
  TensorView out;           // [T, H] bf16
};

class FinalizeStage : public Stage {
 public:
  virtual void run(const StageProblem& problem, const FinalizeArgs& args, Workspace workspace,
                   Stream stream) const = 0;
};

// A backend's form of a layer's weights: in its memory, in its kernels' layouts, each tensor
// borrowed from the caller or copied (the backend says which in its prepare).
struct BackendWeights {
  virtual ~BackendWeights() = default;
  TensorView bias;              // [E] the routing bias in the backend's memory; absent when not given
  std::size_t owned_bytes = 0;  // what preparing them allocated
};

// layout_only: the views' dtypes, shapes and presence, without memory: nothing is read, copied
// or allocated (for capability checks; stages bound to them must not run). memory: usable.
enum class Preparation : std::uint8_t { layout_only, memory };

// Prepare, Experts and Finalize are bound to experts_config(config) (core/shared.h), Router and
// Shared take the layer's config.
struct StageSet {
  std::shared_ptr<const void> keep_alive;  // what the stages share (the prepared weights); freed last
  std::unique_ptr<RouterStage> router;
  std::unique_ptr<SharedStage> shared;
  std::unique_ptr<PrepareStage> prepare;
  std::unique_ptr<ExpertsStage> experts;
  std::unique_ptr<FinalizeStage> finalize;
};

class EpStages;  // core/ep_stages.h

// Memory of a backend's device, released by the deleter.
using DeviceBuffer = std::unique_ptr<std::byte, void (*)(std::byte*)>;

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual Status can_implement(const MoEConfig& config) const = 0;
  // The weights (checked by the caller: on the host or on this backend's device) in this
  // backend's form. Device work runs on `stream` and has finished when this returns. prepare and
  // make_stages are given experts_config(config) (core/shared.h): shared experts are local ones.
  virtual std::shared_ptr<const BackendWeights> prepare(const MoEConfig& config, const Weights& weights,
                                                        Preparation how, Stream stream) const = 0;
  // Stages bound to prepared weights, which they keep alive. tuning: the layer's tuning cache
  // (core/tuning.h), for the stages that choose tactics; null: none (capability checks).
  virtual StageSet make_stages(const MoEConfig& config, std::shared_ptr<const BackendWeights> weights,
                               const TuningOptions* tuning) const = 0;
  virtual DeviceBuffer allocate(std::size_t bytes) const = 0;
  // Its expert-parallel data movement; null when it has none.
  virtual std::unique_ptr<EpStages> make_ep_stages() const;
};

// Whether `backend` can run a layer of these weights for every T in [0, max_tokens]: its
// can_implement, the weights' memory (host, or the backend's device), and each stage bound to
// the weights' layout at T = 1 and T = max_tokens (a stage's limits on T are upper bounds).
Status can_run(const BackendImpl& backend, const MoEConfig& config, const Weights& weights, std::int64_t max_tokens);
// Each stage's can_implement for p (the layer's config; the stages after routing are asked with
// experts_config's): the first refusal.
Status check_stages(const StageSet& stages, const StageProblem& p);

// Priority order (first is preferred).
const std::vector<const BackendImpl*>& registered_backends();
const BackendImpl& cpu_backend();
#ifdef MOEKIT_HAVE_CUDA
const BackendImpl& cuda_backend();
#endif

}  // namespace moekit::core
