#include "core/ep_pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <string>

#include "moekit/error.h"

namespace moekit {

std::string_view to_string(EpCombine v) {
  switch (v) {
    case EpCombine::automatic: return "auto";
    case EpCombine::exact: return "exact";
    case EpCombine::partial: return "partial";
  }
  return "?";
}

namespace core {

std::unique_ptr<EpStages> BackendImpl::make_ep_stages() const { return nullptr; }

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point& t) {
  const Clock::time_point now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - t).count();
  t = now;
  return ms;
}

std::int64_t sum(const std::vector<std::int64_t>& v) { return std::accumulate(v.begin(), v.end(), std::int64_t(0)); }

QuantizedRows rows_tensor(Carver& c, QuantScheme scheme, std::int64_t rows, std::int64_t cols, Device d) {
  QuantizedRows r;
  r.q = c.tensor(activation_dtype(scheme), {rows, cols}, d);
  if (scheme != QuantScheme::bf16) r.scales = c.tensor(DType::f32, scale_shape(scheme, rows, cols), d);
  return r;
}

}  // namespace

// Sizes of one call: tokens here (T), records sent (S) and received (R), rows coming back.
struct EpPipeline::Sizes {
  std::int64_t tokens = 0, sent = 0, received = 0, rows_back = 0;
};

struct EpPipeline::Buffers {
  QuantizedRows prepared;                     // [T, H]
  TensorView plan_token, plan_ids, plan_weights;  // [S], [S, k], [S, k]
  std::byte* send = nullptr;                  // [S, record]
  std::byte* recv = nullptr;                  // [R, record]
  QuantizedRows received;                     // [R, H]
  TensorView recv_ids, recv_weights;          // [R, k]
  TensorView expert_out, slot_rows;           // [max_rows(R), H], [R, k]
  TensorView return_rows, return_send;        // exact: [R * k], [R * k, H]; partial: -, [R, H]
  TensorView combine_recv;                    // [rows back, H]
  TensorView source_slot_rows;                // exact: [T, k]
  TensorView token_rows;                      // partial: [T, ep]
  Workspace prepare_ws, experts_ws, finalize_ws;
};

EpPipeline::EpPipeline(const MoEConfig& config, const BackendImpl& backend, const StageSet& stages,
                       Communicator& comm, const EpOptions& options)
    : config_(config), backend_(backend), stages_(stages), comm_(comm), options_(options) {
  require(comm.size() == config.ep_size && comm.rank() == config.ep_rank,
          "comm: expected " + std::to_string(config.ep_size) + " ranks with this one rank " +
              std::to_string(config.ep_rank) + " (config ep_size/ep_rank), given " + std::string(comm.name()) +
              " rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
  require(comm.device() == backend.device(),
          "comm: the " + std::string(comm.name()) + " communicator moves " + std::string(moekit::to_string(comm.device())) +
              " memory, backend " + std::string(backend.name()) + " needs " +
              std::string(moekit::to_string(backend.device())));
  require(options.capacity >= 0, "ep.capacity: expected >= 0, given " + std::to_string(options.capacity));
  ep_ = backend.make_ep_stages();
  require(ep_ != nullptr, "backend " + std::string(backend.name()) + ": no expert-parallel stages (ep_size " +
                              std::to_string(config.ep_size) + ")");
  combine_ = options.combine;
  if (combine_ == EpCombine::automatic)
    combine_ = backend.device() == Device::cpu ? EpCombine::exact : EpCombine::partial;
  layout_ = EpRecordLayout::of(config);
  const std::size_t ep = std::size_t(config.ep_size);
  counts_buffer_ = backend.allocate(sizeof(std::int64_t) * ep * (ep + 1));
  if (options.capacity > 0) {
    // Row numbers of the returned rows are i32 (slot_rows).
    const std::int64_t rows = fixed_sizes().rows_back;
    require(rows <= std::numeric_limits<std::int32_t>::max(),
            "ep.capacity: " + std::to_string(options.capacity) + " tokens per rank return " + std::to_string(rows) +
                " rows, more than 2^31 - 1");
    // The blocks every call moves, known here: nothing about them is exchanged.
    plan_.capacity = options.capacity;
    plan_.counts.assign(ep, options.capacity);
    plan_.offsets = exclusive_sum(plan_.counts);
    plan_.rows_back.assign(ep, fixed_sizes().rows_back / std::int64_t(ep));
    plan_.rows_back_offsets = exclusive_sum(plan_.rows_back);
    recv_counts_ = plan_.counts;
    recv_offsets_ = plan_.offsets;
    return_plan_.counts = plan_.rows_back;
    return_plan_.offsets = plan_.rows_back_offsets;
    reserve(options.capacity);  // allocated before any capture
  }
}

EpPipeline::~EpPipeline() = default;

void EpPipeline::finish_step(Stream stream) {
  if (options_.timing == EpTiming::barriers) comm_.synchronize(stream);
}

void EpPipeline::barrier_for_timing(Stream stream) {
  if (options_.timing != EpTiming::barriers) return;
  comm_.synchronize(stream);
  const Clock::time_point start = Clock::now();
  comm_.barrier(stream);
  stats_.wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool EpPipeline::weights_left() const {
  return config_.routing.effective_placement() != WeightPlacement::input && !stages_.experts->applies_weights();
}

EpPipeline::Buffers EpPipeline::carve(Carver& c, const Sizes& s) const {
  const Device d = backend_.device();
  const QuantScheme scheme = config_.quant.scheme;
  const std::int64_t k = config_.top_k(), h = config_.hidden_size;
  Buffers b;
  b.prepared = rows_tensor(c, scheme, s.tokens, h, d);
  b.plan_token = c.tensor(DType::i32, {s.sent}, d);
  b.plan_ids = c.tensor(DType::i32, {s.sent, k}, d);
  b.plan_weights = c.tensor(DType::f32, {s.sent, k}, d);
  b.send = c.take(std::size_t(s.sent) * layout_.bytes);
  b.recv = c.take(std::size_t(s.received) * layout_.bytes);
  b.received = rows_tensor(c, scheme, s.received, h, d);
  b.recv_ids = c.tensor(DType::i32, {s.received, k}, d);
  b.recv_weights = c.tensor(DType::f32, {s.received, k}, d);
  b.expert_out = c.tensor(DType::bf16, {stages_.experts->max_rows(StageProblem{config_, s.received}), h}, d);
  b.slot_rows = c.tensor(DType::i32, {s.received, k}, d);
  if (combine_ == EpCombine::exact) {
    b.return_rows = c.tensor(DType::i32, {s.received * k}, d);
    b.return_send = c.tensor(DType::bf16, {s.received * k, h}, d);
    b.source_slot_rows = c.tensor(DType::i32, {s.tokens, k}, d);
  } else {
    b.return_send = c.tensor(DType::bf16, {s.received, h}, d);
    b.token_rows = c.tensor(DType::i32, {s.tokens, std::int64_t(config_.ep_size)}, d);
  }
  b.combine_recv = c.tensor(DType::bf16, {s.rows_back, h}, d);
  auto workspace = [&](const Stage& stage, std::int64_t tokens) {
    const std::size_t n = stage.workspace_size(StageProblem{config_, tokens});
    return Workspace{c.take(n), n};
  };
  b.prepare_ws = workspace(*stages_.prepare, s.tokens);
  b.experts_ws = workspace(*stages_.experts, s.received);
  b.finalize_ws = workspace(*stages_.finalize, std::max(s.tokens, s.received));
  return b;
}

EpPipeline::Buffers EpPipeline::buffers_for(const Sizes& s) {
  Carver counter(nullptr);
  carve(counter, s);
  if (counter.used() > buffer_size_) {
    buffer_ = backend_.allocate(counter.used());
    buffer_size_ = counter.used();
  }
  Carver c(buffer_.get());
  return carve(c, s);
}

// Fixed blocks: capacity records to and from every rank, every slot position back (exact); the
// same buffers for every call, whatever its T (at most the capacity).
EpPipeline::Sizes EpPipeline::fixed_sizes() const {
  const std::int64_t ep = config_.ep_size, k = config_.top_k(), capacity = options_.capacity;
  return {capacity, ep * capacity, ep * capacity, combine_ == EpCombine::exact ? ep * capacity * k : ep * capacity};
}

void EpPipeline::reserve(std::int64_t max_tokens) {
  const std::int64_t ep = config_.ep_size, k = config_.top_k();
  Sizes s;
  s.tokens = max_tokens;
  if (options_.capacity > 0) {
    s = fixed_sizes();
  } else {
    // At most one record per (token, rank), from each of the ep ranks; exact returns a row per
    // owned slot, partial one per record.
    s.sent = max_tokens * std::min(k, ep);
    s.received = ep * max_tokens;
    s.rows_back = combine_ == EpCombine::exact ? max_tokens * k : s.sent;
  }
  buffers_for(s);
}

// recv_counts_[s] = records rank s sends here: every rank's send counts, gathered.
void EpPipeline::exchange_counts(Stream stream) {
  const std::size_t ep = std::size_t(config_.ep_size), me = std::size_t(config_.ep_rank);
  auto* send = reinterpret_cast<std::int64_t*>(counts_buffer_.get());
  std::int64_t* matrix = send + ep;
  ep_->to_device(send, plan_.counts.data(), sizeof(std::int64_t) * ep, stream);
  comm_.all_gather(send, matrix, sizeof(std::int64_t) * ep, stream);
  comm_.synchronize(stream);
  count_matrix_.resize(ep * ep);
  ep_->to_host(count_matrix_.data(), matrix, sizeof(std::int64_t) * ep * ep, stream);
  recv_counts_.resize(ep);
  for (std::size_t s = 0; s < ep; ++s) recv_counts_[s] = count_matrix_[s * ep + me];
}

void EpPipeline::run(const StageProblem& p, const TensorView& hidden, const TensorView& topk_ids,
                     const TensorView& topk_weights, const TensorView& out, Stream stream) {
  const MoEConfig& c = config_;
  const std::int64_t tokens = p.tokens, k = c.top_k();
  const std::size_t me = std::size_t(c.ep_rank);
  const bool fixed = options_.capacity > 0;
  // Before any collective, so that a rank over capacity fails alone and at once.
  require(!fixed || tokens <= options_.capacity, "hidden: expected at most the EP capacity " +
                                                     std::to_string(options_.capacity) + " tokens per rank, given " +
                                                     std::to_string(tokens));
  const bool capturing = ep_->capturing(stream);
  require(!capturing || fixed, "ep.capacity: a CUDA graph captures an EP layer of fixed capacity only (capacity > 0): "
                               "the variable mode learns the counts on the host");
  require(!capturing || options_.timing == EpTiming::plain,
          "ep.timing: barriers wait on the host, which a CUDA graph's capture does not allow");
  stats_ = EpStats{};
  stats_.tokens = tokens;
  Clock::time_point clock = Clock::now();

  // 1. Plan: fixed capacity where the routing is (no host copy, no wait), else on the host,
  //    then learn what arrives.
  mark_step(p, "plan", stream);
  Sizes sizes;
  Buffers b;
  if (fixed) {
    sizes = fixed_sizes();
    b = buffers_for(sizes);  // reserved at construction: no allocation
    ep_->plan_fixed({topk_ids.ptr<std::int32_t>(), topk_weights.ptr<float>(), tokens, options_.capacity, int(k),
                     c.ep_size, c.local_experts(), b.plan_token.ptr<std::int32_t>(), b.plan_ids.ptr<std::int32_t>(),
                     b.plan_weights.ptr<float>(),
                     combine_ == EpCombine::exact ? b.source_slot_rows.ptr<std::int32_t>() : nullptr,
                     combine_ == EpCombine::partial ? b.token_rows.ptr<std::int32_t>() : nullptr},
                    stream);
  } else {
    host_ids_.resize(std::size_t(tokens * k));
    host_weights_.resize(std::size_t(tokens * k));
    ep_->to_host(host_ids_.data(), topk_ids.data, topk_ids.nbytes(), stream);
    ep_->to_host(host_weights_.data(), topk_weights.data, topk_weights.nbytes(), stream);
    plan_dispatch(host_ids_.data(), host_weights_.data(), tokens, c, 0, combine_, plan_);
    exchange_counts(stream);
    recv_offsets_ = exclusive_sum(recv_counts_);
    sizes = Sizes{tokens, plan_.records(), sum(recv_counts_), plan_.rows_back_total()};
    b = buffers_for(sizes);
    ep_->to_device(b.plan_token.data, plan_.token.data(), b.plan_token.nbytes(), stream);
    ep_->to_device(b.plan_ids.data, plan_.ids.data(), b.plan_ids.nbytes(), stream);
    ep_->to_device(b.plan_weights.data, plan_.weights.data(), b.plan_weights.nbytes(), stream);
    if (combine_ == EpCombine::exact)
      ep_->to_device(b.source_slot_rows.data, plan_.slot_rows.data(), b.source_slot_rows.nbytes(), stream);
    else
      ep_->to_device(b.token_rows.data, plan_.token_rows.data(), sizeof(std::int32_t) * plan_.token_rows.size(), stream);
  }

  // 2. Prepare: quantized on this (the source) rank.
  mark_step(p, "quantize", stream);
  stages_.prepare->run(StageProblem{c, tokens, &comm_}, {hidden, topk_weights, b.prepared}, b.prepare_ws, stream);
  finish_step(stream);
  stats_.prepare_ms = ms_since(clock);

  // 3. Dispatch: one record per (token, destination rank).
  mark_step(p, "dispatch", stream);
  ep_->pack(layout_, {b.prepared, b.plan_token.ptr<std::int32_t>(), b.plan_ids.ptr<std::int32_t>(),
                      b.plan_weights.ptr<float>(), sizes.sent, b.send},
            stream);
  barrier_for_timing(stream);
  comm_.all_to_all_v({b.send, plan_.counts, plan_.offsets, b.recv, recv_counts_, recv_offsets_, layout_.bytes},
                     stream);
  ep_->unpack(layout_,
              {b.recv, sizes.received, b.received, b.recv_ids, b.recv_weights,
               c.quant.scheme == QuantScheme::fp8_tensor ? b.prepared.scales.ptr<float>() : nullptr},
              stream);
  stats_.records_sent = sizes.sent;
  stats_.records_received = sizes.received;
  stats_.record_bytes = std::int64_t(layout_.bytes);
  stats_.dispatch_bytes = sizes.sent * std::int64_t(layout_.bytes);
  stats_.dispatch_remote_bytes = (sizes.sent - plan_.counts[me]) * std::int64_t(layout_.bytes);
  finish_step(stream);
  stats_.dispatch_ms = ms_since(clock) - stats_.wait_ms;

  // 4. This rank's experts on what it received.
  stages_.experts->run(StageProblem{c, sizes.received, &comm_, p.observer},
                       {b.received, b.recv_ids, b.recv_weights, b.expert_out, b.slot_rows, {}, {}}, b.experts_ws, stream);
  finish_step(stream);
  stats_.experts_ms = ms_since(clock);

  // 5. Combine. The variable mode waits for it (failing within the communicator's timeout);
  //    fixed capacity leaves the wait to the caller (Communicator::synchronize), as a graph must.
  mark_step(p, "combine", stream);
  const double waited = stats_.wait_ms;
  if (combine_ == EpCombine::exact) combine_exact(p, b, topk_weights, out, stream);
  else combine_partial(p, b, out, stream);
  if (!fixed || options_.timing == EpTiming::barriers) comm_.synchronize(stream);
  stats_.combine_ms = ms_since(clock) - (stats_.wait_ms - waited);
}

void EpPipeline::combine_exact(const StageProblem& p, const Buffers& b, const TensorView& weights,
                               const TensorView& out, Stream stream) {
  const MoEConfig& c = config_;
  const std::int64_t k = c.top_k(), h = c.hidden_size, received = b.recv_ids.size(0);
  const std::size_t me = std::size_t(c.ep_rank);
  const bool fixed = options_.capacity > 0;
  // Which expert_out rows go back: every slot position (fixed), or the owned slots in order.
  const std::int32_t* rows = b.slot_rows.ptr<std::int32_t>();
  std::int64_t count = received * k;
  if (!fixed) {
    host_slot_rows_.resize(std::size_t(received * k));
    ep_->to_host(host_slot_rows_.data(), b.slot_rows.data, b.slot_rows.nbytes(), stream);
    plan_return(recv_counts_, recv_offsets_, host_slot_rows_.data(), int(k), false, return_plan_);
    count = std::int64_t(return_plan_.rows.size());
    ep_->to_device(b.return_rows.data, return_plan_.rows.data(), sizeof(std::int32_t) * std::size_t(count), stream);
    rows = b.return_rows.ptr<std::int32_t>();
  }
  ep_->gather_rows({b.expert_out.ptr<bf16>(), rows, count, h, b.return_send.ptr<bf16>()}, stream);
  barrier_for_timing(stream);
  comm_.all_to_all_v({b.return_send.data, return_plan_.counts, return_plan_.offsets, b.combine_recv.data,
                      plan_.rows_back, plan_.rows_back_offsets, sizeof(bf16) * std::size_t(h)},
                     stream);
  stats_.combine_bytes = count * h * std::int64_t(sizeof(bf16));
  stats_.combine_remote_bytes = (count - return_plan_.counts[me]) * h * std::int64_t(sizeof(bf16));

  // The source's own Finalize, over rows placed where ep = 1 would find them.
  stages_.finalize->run(StageProblem{c, p.tokens},
                        {b.combine_recv, b.source_slot_rows, weights_left() ? weights : TensorView{}, out},
                        b.finalize_ws, stream);
}

void EpPipeline::combine_partial(const StageProblem& p, const Buffers& b, const TensorView& out, Stream stream) {
  const MoEConfig& c = config_;
  const std::int64_t h = c.hidden_size, received = b.recv_ids.size(0);
  const std::size_t me = std::size_t(c.ep_rank);
  // Each rank's weighted sum over its experts, one row per received record.
  stages_.finalize->run(StageProblem{c, received},
                        {b.expert_out, b.slot_rows, weights_left() ? b.recv_weights : TensorView{}, b.return_send},
                        b.finalize_ws, stream);
  barrier_for_timing(stream);
  comm_.all_to_all_v({b.return_send.data, recv_counts_, recv_offsets_, b.combine_recv.data, plan_.rows_back,
                      plan_.rows_back_offsets, sizeof(bf16) * std::size_t(h)},
                     stream);
  stats_.combine_bytes = received * h * std::int64_t(sizeof(bf16));
  stats_.combine_remote_bytes = (received - recv_counts_[me]) * h * std::int64_t(sizeof(bf16));
  ep_->sum_rows({b.combine_recv.ptr<bf16>(), b.token_rows.ptr<std::int32_t>(), c.ep_size, p.tokens, h, out.ptr<bf16>()},
                stream);
}

}  // namespace core
}  // namespace moekit
