// `mpirun -np N moekit run --ep N ...`: one forward pass with expert parallelism over N MPI
// ranks. Each rank generates (or reads) only its own experts and takes its slice of the
// batch; rank 0 gathers the output and prints. --check compares with the ep = 1 pipeline
// reference of the whole batch, computed without any rank holding every weight: each rank
// computes its experts' rows for every (token, slot) of the batch, rank 0 adds them in slot
// order as the ep = 1 finalize does. The CPU backend (exact combine) must match it bit for bit.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "commands.h"
#include "core/check.h"
#include "cpu/reference.h"
#include "ep_ranks.h"
#include "io/layer_file.h"
#include "io/safetensors.h"
#include "moekit/device.h"
#include "run_setup.h"

namespace moekit::cli {
namespace {

struct Split {
  std::vector<std::int64_t> counts, first;  // [ep] tokens of each rank, its first token
};

Split split_batch(std::int64_t tokens, int ep) {
  Split s;
  for (int r = 0; r < ep; ++r) {
    s.first.push_back(tokens * r / ep);
    s.counts.push_back(tokens * (r + 1) / ep - s.first.back());
  }
  return s;
}

// Every rank's rows [counts[r], C] of a tensor, concatenated in rank order, on rank 0 alone
// (to_all: on every rank).
Tensor gather_rows(Communicator& comm, const TensorView& mine, const Split& split, bool to_all) {
  const std::size_t ep = std::size_t(comm.size());
  const std::int64_t total = split.first.back() + split.counts.back(), cols = mine.size(1);
  const bool receives = to_all || comm.rank() == 0;
  Tensor all(mine.dtype, {receives ? total : 0, cols});
  std::vector<std::int64_t> send_counts(ep, 0), send_offsets(ep, 0), recv_counts(ep, 0);
  for (std::size_t r = 0; r < ep; ++r) {
    if (to_all || r == 0) send_counts[r] = mine.size(0);
    if (receives) recv_counts[r] = split.counts[r];
  }
  comm.all_to_all_v({mine.data, send_counts, send_offsets, all.view().data, recv_counts, split.first,
                     std::size_t(cols) * dtype_size(mine.dtype)},
                    nullptr);
  return all;
}

EpOptions ep_options(const Args& args) {
  EpOptions o;
  const std::string combine = args.get("ep-combine", "auto");
  if (combine == "exact") o.combine = EpCombine::exact;
  else if (combine == "partial") o.combine = EpCombine::partial;
  else if (combine != "auto") throw UsageError("--ep-combine: expected one of auto|exact|partial, given '" + combine + "'");
  o.capacity = args.get_int("ep-capacity", 0, 0, std::int64_t(1) << 24);
  if (args.has("ep-profile")) o.timing = EpTiming::barriers;
  return o;
}

// Traffic and times of every rank, gathered: [ep][kStats] on every rank.
constexpr int kStats = 12;
std::vector<double> gather_stats(Communicator& comm, const EpStats& s, double forward_ms) {
  const double mine[kStats] = {double(s.records_sent), double(s.record_bytes), double(s.dispatch_bytes),
                               double(s.dispatch_remote_bytes), double(s.combine_bytes),
                               double(s.combine_remote_bytes), s.dispatch_ms, s.combine_ms, forward_ms, s.wait_ms,
                               s.prepare_ms, s.experts_ms};
  std::vector<double> all(std::size_t(comm.size() * kStats));
  comm.all_gather(mine, all.data(), sizeof mine, nullptr);
  return all;
}

bool layer_profiled(const Layer& layer) { return layer.ep_stats().wait_ms > 0; }

void print_run(const RunSetup& s, const Layer& layer, const Communicator& comm, const Split& split,
               const std::vector<double>& stats) {
  const int ep = int(split.counts.size());
  const double gb = double(s.weights.w13.nbytes() + s.weights.w2.nbytes()) / 1e9;
  std::printf("moekit run: %s\n", s.source.c_str());
  std::printf("  config   %s\n", s.config.to_string().c_str());
  std::printf("  hidden   %s, routing %s\n", s.hidden.view().to_string().c_str(),
              s.routing == RoutingMode::fused ? "fused" : "external");
  std::printf("  weights  per rank: w13 %s, w2 %s (%.2f GB)\n", s.weights.w13.to_string().c_str(),
              s.weights.w2.to_string().c_str(), gb);
  std::printf("  backend  %s\n", std::string(layer.backend_name()).c_str());
  std::string tokens;
  for (std::int64_t t : split.counts) tokens += " " + std::to_string(t);
  std::printf("  ep       %d ranks over %s, combine %s, experts per rank %lld, tokens per rank%s\n", ep,
              std::string(comm.name()).c_str(), std::string(to_string(layer.ep_combine())).c_str(), static_cast<long long>(s.config.local_experts()),
              tokens.c_str());
  double sum[kStats] = {}, max[kStats] = {};
  for (int r = 0; r < ep; ++r)
    for (int i = 0; i < kStats; ++i) {
      sum[i] += stats[std::size_t(r * kStats + i)];
      max[i] = std::max(max[i], stats[std::size_t(r * kStats + i)]);
    }
  const double total_tokens = double(split.first.back() + split.counts.back());
  std::printf("  forward  %.3f ms (%s, wall clock, slowest of %d ranks%s)\n", max[8],
              std::string(layer.backend_name()).c_str(), ep, layer.device() == Device::cuda ? ", second call" : "");
  std::printf("  dispatch %.0f token records of %.0f B (%s): %.3f MB sent, %.3f MB to other ranks, %.1f B/token on "
              "the wire; %.3f ms (slowest rank)\n",
              sum[0], max[1], std::string(to_string(s.config.quant.scheme)).c_str(), sum[2] / 1e6, sum[3] / 1e6,
              total_tokens > 0 ? sum[3] / total_tokens : 0.0, max[6]);
  std::printf("  combine  %.3f MB sent back, %.3f MB to other ranks, %.1f B/token on the wire; %.3f ms (slowest rank)\n",
              sum[4] / 1e6, sum[5] / 1e6, total_tokens > 0 ? sum[5] / total_tokens : 0.0, max[7]);
  if (layer_profiled(layer))
    std::printf("  profile  barriers before each exchange, each step waits for its device work: prepare %.3f ms, "
                "experts %.3f ms (slowest rank); the times exclude up to %.3f ms of waiting for the slowest rank\n",
                max[10], max[11], max[9]);
}

// The ep = 1 pipeline reference of the whole batch, on rank 0 (empty elsewhere).
Tensor distributed_reference(Communicator& comm, const RunSetup& s, const Tensor& ids, const Tensor& weights) {
  const MoEConfig& c = s.config;
  const std::int64_t tokens = s.hidden.size(0), h = c.hidden_size;
  const int k = int(c.top_k() + c.shared_experts);  // slots, the shared experts' included
  cpu::ReferenceInputs in{c, s.weights, s.hidden.view(), ids.view(), weights.view()};
  in.shared_rows = comm.rank() == 0;  // every rank holds the shared experts: one computes their rows
  const cpu::ExpertRows rows = cpu::pipeline_reference_rows(in, [&](float m) {
    comm.all_reduce_max(&m, 1, nullptr);
    return m;
  });
  // Rank 0 collects every rank's rows with their (token, slot).
  const std::int64_t mine = std::int64_t(rows.token.size());
  std::vector<std::int64_t> counts(std::size_t(comm.size()));
  comm.all_gather(&mine, counts.data(), sizeof mine, nullptr);
  Split split;
  split.counts = counts;
  std::int64_t at = 0;
  for (std::int64_t n : counts) {
    split.first.push_back(at);
    at += n;
  }
  Tensor where(DType::i64, {mine, 1});
  for (std::int64_t p = 0; p < mine; ++p) where.ptr<std::int64_t>()[p] = rows.token[std::size_t(p)] * k + rows.slot[std::size_t(p)];
  const Tensor all_where = gather_rows(comm, where.view(), split, false);
  const Tensor all_rows = gather_rows(
      comm, TensorView::contiguous(const_cast<bf16*>(rows.values.data()), DType::bf16, {mine, h}), split, false);
  if (comm.rank() != 0) return Tensor();
  std::vector<const bf16*> slots(std::size_t(tokens * k), nullptr);
  for (std::int64_t p = 0; p < all_where.size(0); ++p) slots[std::size_t(all_where.ptr<std::int64_t>()[p])] = all_rows.ptr<bf16>() + p * h;
  Tensor out(DType::bf16, {tokens, h});
  const bool on_input = c.routing.effective_placement() == WeightPlacement::input;
  cpu::sum_slots(slots.data(), on_input ? nullptr : cpu::slot_weights(in).data(), tokens, k, h, out.ptr<bf16>());
  return out;
}

// Rank 0: the gathered output against the reference; true when it passes. The exact combine
// must give ep = 1's bits; any other is held to DESIGN §8's rule, without the ideal reference
// (no rank holds every weight).
bool report_check(const Tensor& out, const Tensor& ref, bool exact, const QuantConfig& quant) {
  std::int64_t same = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i) same += out.ptr<bf16>()[i].bits == ref.ptr<bf16>()[i].bits;
  const core::CheckResult r = core::check_output({out.view(), ref.view(), {}, quant});
  std::printf("  vs the ep=1 pipeline reference of the whole batch (each rank: its experts' rows; rank 0: the sum in "
              "slot order): %lld of %lld elements bit-identical, rel_err=%.3e\n",
              static_cast<long long>(same), static_cast<long long>(out.numel()), r.rel_err);
  if (!exact) {
    std::printf("check: %s\n", r.to_string().c_str());
    return r.pass();
  }
  const bool pass = same == out.numel();
  std::printf("check: %s rel_err=%.3e (exact combine: bit-identical required)\n", pass ? "PASS" : "FAIL", r.rel_err);
  return pass;
}

int run_ranks(const Args& args, const MpiSession& mpi, Communicator& comm, std::chrono::milliseconds timeout) {
  const int ep = comm.size(), rank = comm.rank();
  const RunSetup s = setup_from_args(args, ep, rank);
  // CPU ranks exchange over MPI; GPU ranks (one per GPU of the node) over NCCL, which MPI starts.
  const std::string backend = select_backend(s.config, args.get("backend", "auto")).chosen;
  const int gpu = mpi.local_rank();
  std::unique_ptr<Communicator> nccl;
  if (backend == "cuda") nccl = make_nccl_communicator(comm, gpu, {timeout});
  Communicator& layer_comm = nccl ? *nccl : comm;
  LayerOptions options;
  options.backend = backend;
  options.comm = &layer_comm;
  options.ep = ep_options(args);
  Layer layer(s.config, s.weights, options);

  // This rank's slice of the batch, and its routing when the caller routes.
  const std::int64_t total = s.hidden.size(0);
  const int k = s.config.top_k();
  const Split split = split_batch(total, ep);
  const std::int64_t first = split.first[std::size_t(rank)], count = split.counts[std::size_t(rank)];
  Tensor ids(DType::i32, {count, k}), weights(DType::f32, {count, k}), out(DType::bf16, {count, s.config.hidden_size});
  std::memset(out.view().data, 0xff, out.nbytes());  // NaN: an unwritten element cannot pass
  if (s.routing == RoutingMode::external) {
    Tensor all_ids(DType::i32, {total, k}), all_weights(DType::f32, {total, k});
    route(s.config.routing,
          {s.router_logits.view(), s.config.routing.uses_bias() ? s.weights.e_score_correction_bias : TensorView{}},
          {all_ids.view(), all_weights.view()});
    std::memcpy(ids.view().data, rows_of(all_ids.view(), first, count).data, ids.nbytes());
    std::memcpy(weights.view().data, rows_of(all_weights.view(), first, count).data, weights.nbytes());
  }

  // The layer's tensors live on its device.
  const Device device = layer.device();
  auto on_device = [&](const TensorView& host) {
    DeviceTensor t(host.dtype, host.shape_vector(), device);
    t.copy_from(host);
    return t;
  };
  DeviceTensor d_hidden = on_device(rows_of(s.hidden.view(), first, count)), d_out = on_device(out.view());
  DeviceTensor d_ids = on_device(ids.view()), d_weights = on_device(weights.view());
  DeviceTensor d_logits = on_device(s.router_logits.defined() ? rows_of(s.router_logits.view(), first, count)
                                                              : TensorView::contiguous(nullptr, DType::f32, {0, 0}));
  auto forward = [&] {
    comm.barrier(nullptr);
    const auto start = std::chrono::steady_clock::now();
    if (s.routing == RoutingMode::fused)
      layer.forward(FusedArgs{d_hidden.view(), d_logits.view(), d_out.view(), d_ids.view(), d_weights.view()});
    else
      layer.forward(ExternalArgs{d_hidden.view(), d_ids.view(), d_weights.view(), d_out.view()});
    synchronize(device);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  double ms = forward();
  if (device == Device::cuda) ms = forward();  // the first call allocates and loads kernels
  d_out.copy_to(out.view());
  d_ids.copy_to(ids.view());
  d_weights.copy_to(weights.view());

  const std::vector<double> stats = gather_stats(comm, layer.ep_stats(), ms);
  const Tensor all_out = gather_rows(comm, out.view(), split, false);
  const Tensor all_ids = gather_rows(comm, ids.view(), split, true);
  const Tensor all_weights = gather_rows(comm, weights.view(), split, true);
  if (rank == 0) {
    print_run(s, layer, layer_comm, split, stats);
    std::printf("  routing  %s\n", core::routing_load(all_ids.view(), s.config.num_experts).to_string().c_str());
  }
  if (args.has("dump") && rank == 0) {
    MoEConfig whole = s.config;  // the file describes the whole layer's result, as ep = 1 writes it
    whole.ep_size = 1;
    whole.ep_rank = 0;
    const std::string path = args.get("dump", "");
    io::write_safetensors(path, {{"out", all_out.view()}, {"topk_ids", all_ids.view()}, {"topk_weights", all_weights.view()}},
                          io::config_metadata(whole));
    std::printf("  dumped   out, topk_ids, topk_weights of the whole batch to %s\n", path.c_str());
  }
  int code = 0;
  if (args.has("check")) {
    const Tensor ref = distributed_reference(comm, s, all_ids, all_weights);
    std::int32_t pass = 1;
    if (rank == 0) {
      std::printf("  ideal reference: not computed with --ep (run --ep 1 for the quantization error)\n");
      // The CPU's exact combine must give the bits of ep = 1; anything else, the tolerance.
      const bool exact = layer.backend_name() == "cpu" && layer.ep_combine() == EpCombine::exact;
      pass = report_check(all_out, ref, exact, s.config.quant) ? 1 : 0;
    }
    comm.broadcast(&pass, sizeof pass, 0, nullptr);
    code = pass ? 0 : 1;
  }
  std::fflush(stdout);
  comm.barrier(nullptr);
  return code;
}

}  // namespace

int cmd_run_ep(const Args& args) {
  const int ep = int(args.get_int("ep", 1, 1, 1 << 16));
  if (args.has("save-layer")) throw UsageError("--save-layer: a layer file holds every expert; drop --ep");
  require_mpi_launch(ep, "run");
  const auto timeout = std::chrono::seconds(args.get_int("comm-timeout", 120, 1, 86400));
  MpiSession mpi(nullptr, nullptr);
  std::unique_ptr<Communicator> comm = make_mpi_communicator({timeout});
  const int rank = comm->rank();
  try {
    return run_ranks(args, mpi, *comm, timeout);
  } catch (const UsageError& e) {
    // Every rank has the same command line, hence the same complaint: rank 0 says it.
    if (rank == 0) std::fprintf(stderr, "moekit run: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // A failed rank may leave the others waiting in a collective: end them all.
    std::fprintf(stderr, "moekit run: error: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace moekit::cli
