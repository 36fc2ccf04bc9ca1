// The EP forward of one rank, after routing (DESIGN §7):
//   plan (fixed capacity: on the backend, no host in the loop; else on the host, then
//   exchange counts) ─► Prepare (quantize; fp8-tensor amax over the group)
//   ─► pack records ─► all-to-all ─► unpack ─► Experts (this rank's experts, received rows)
//   ─► combine: exact (rows per (token, expert) back; the source's own Finalize sums them
//      in slot order, bit-identical to ep = 1) or partial (each rank's Finalize, summed by
//      the source in rank order) ─► out.
// Fixed capacity replaces the count exchange with worst-case blocks (padding records carry
// no ids) and returns rows at fixed positions: nothing waits on the host, so a CUDA graph can
// capture the forward; the caller waits (Communicator::synchronize fails within the timeout).
#pragma once

#include <memory>
#include <vector>

#include "core/ep_plan.h"
#include "core/ep_stages.h"
#include "core/stages.h"
#include "moekit/comm.h"
#include "moekit/layer.h"

namespace moekit::core {

class EpPipeline {
 public:
  // Checks the communicator against the config and the backend (size, rank, memory) and that
  // the backend has EP stages. Throws Error.
  EpPipeline(const MoEConfig& config, const BackendImpl& backend, const StageSet& stages, Communicator& comm,
             const EpOptions& options);
  ~EpPipeline();

  // Collective. hidden [T, H], topk_ids/topk_weights [T, k] (this rank's tokens), out [T, H].
  void run(const StageProblem& problem, const TensorView& hidden, const TensorView& topk_ids,
           const TensorView& topk_weights, const TensorView& out, Stream stream);

  // Buffers for calls in which no rank has more than max_tokens tokens (fixed capacity: any).
  void reserve(std::int64_t max_tokens);
  std::size_t buffer_bytes() const { return buffer_size_; }

  EpCombine combine() const { return combine_; }
  const EpStats& stats() const { return stats_; }

 private:
  struct Sizes;
  struct Buffers;
  Sizes fixed_sizes() const;
  Buffers carve(Carver& c, const Sizes& s) const;
  Buffers buffers_for(const Sizes& s);
  void exchange_counts(Stream stream);
  void combine_exact(const StageProblem& p, const Buffers& b, const TensorView& weights, const TensorView& out,
                     Stream stream);
  void combine_partial(const StageProblem& p, const Buffers& b, const TensorView& out, Stream stream);
  bool weights_left() const;
  // EpTiming::barriers: waits for every rank, counted apart from the step being timed.
  void barrier_for_timing(Stream stream);
  // EpTiming::barriers: waits for the step's device work, so that its time covers its kernels
  // (else a GPU step's time is its host time, and the combine's sync absorbs the experts).
  void finish_step(Stream stream);

  MoEConfig config_;
  const BackendImpl& backend_;
  const StageSet& stages_;
  Communicator& comm_;
  EpOptions options_;
  EpCombine combine_;
  EpRecordLayout layout_;
  std::unique_ptr<EpStages> ep_;
  DeviceBuffer buffer_{nullptr, [](std::byte*) {}};
  std::size_t buffer_size_ = 0;
  DeviceBuffer counts_buffer_{nullptr, [](std::byte*) {}};  // [2, ep, ep] i64 for the count exchange

  // Host state, reused call to call.
  EpSendPlan plan_;
  EpReturnPlan return_plan_;
  std::vector<std::int32_t> host_ids_, host_slot_rows_;
  std::vector<float> host_weights_;
  std::vector<std::int64_t> recv_counts_, recv_offsets_, count_matrix_;
  EpStats stats_;
};

}  // namespace moekit::core
