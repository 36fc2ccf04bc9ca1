// Permutation plan: the kernels (their steps in plan.cuh), launchers and the op entry.
#include "cuda/permute/plan.h"

#include <algorithm>
#include <sstream>

#include "core/stages.h"
#include "cuda/common/check.h"
#include "cuda/common/dependent_launch.cuh"
#include "cuda/common/launch.h"
#include "cuda/permute/plan.cuh"
#include "cuda/permute/plan_one_block.cuh"
#include "cuda/permute/prepare_plan.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::permute {
namespace {

__global__ void __launch_bounds__(256) count_subtiles(PlanParams p) {
  extern __shared__ int shared_counts[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int subtile = blockIdx.x * (blockDim.x / 32) + warp;
  if (subtile >= p.subtiles) return;  // warp-uniform; no block barrier below
  int* counter = shared_counts + warp * p.experts;
  for (int e = lane; e < p.experts; e += 32) counter[e] = 0;
  __syncwarp();
  const std::int64_t first_slot = std::int64_t(subtile) * p.pieces * 32;
  for (int piece = 0; piece < p.pieces; ++piece) {
    const int e = local_expert(p, first_slot + piece * 32 + lane);
    const unsigned peers = __match_any_sync(kFullMask, e);
    if (e >= 0 && lane == __ffs(peers) - 1) counter[e] += __popc(peers);
    __syncwarp();
  }
  for (int e = lane; e < p.experts; e += 32) p.subtile_counts[std::int64_t(e) * p.subtiles + subtile] = counter[e];
}

__global__ void __launch_bounds__(256) scan_subtiles(PlanParams p) {
  __shared__ int shared[33];
  const int e = blockIdx.x;
  std::int32_t* row = p.subtile_counts + std::int64_t(e) * p.subtiles;
  int carry = 0;
  for (int base = 0; base < p.subtiles; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const int value = i < p.subtiles ? row[i] : 0;
    int chunk = 0;
    const int prefix = block_exclusive_scan(value, shared, &chunk);
    if (i < p.subtiles) row[i] = carry + prefix;
    carry += chunk;
  }
  if (threadIdx.x == 0) p.totals[e] = carry;
}

__global__ void __launch_bounds__(256) assign_rows(PlanParams p) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  int* offsets = shared_ints;                 // [E_local + 1] padded first rows
  int* running = shared_ints + p.experts + 1;  // [warps, E_local] next row of each expert
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;

  // Expert offsets from the totals (every block, redundantly: E_local values).
  int carry = 0, dropped = 0;
  for (int base = 0; base < p.experts; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int total = e < p.experts ? p.totals[e] : 0;
    const int rows = p.masked ? min(total, p.capacity) : round_up_int(total, p.alignment);
    int chunk = 0;
    const int prefix = block_exclusive_scan(rows, scan_shared, &chunk);
    if (e < p.experts) {
      offsets[e] = carry + prefix;
      if (blockIdx.x == 0) {
        p.counts[e] = p.masked ? rows : total;
        if (p.offsets) p.offsets[e] = p.masked ? e * p.capacity : carry + prefix;
      }
    }
    carry += chunk;
    if (p.masked) {
      int over = 0;
      block_exclusive_scan(e < p.experts ? max(total - p.capacity, 0) : 0, scan_shared, &over);
      dropped += over;
    }
  }
  if (threadIdx.x == 0) {
    offsets[p.experts] = carry;
    if (blockIdx.x == 0) {
      if (p.offsets) p.offsets[p.experts] = p.masked ? p.experts * p.capacity : carry;
      if (p.masked && p.dropped) *p.dropped = dropped;
    }
  }
  __syncthreads();

  // Local expert of every row (contiguous), grid-stride.
  if (p.row_expert)
    write_row_experts(p, offsets, std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                      std::int64_t(gridDim.x) * blockDim.x);

  // Replay this warp's subtile in slot order.
  const int subtile = blockIdx.x * warps + warp;
  if (subtile >= p.subtiles) return;
  int* next = running + warp * p.experts;
  for (int e = lane; e < p.experts; e += 32)
    next[e] = p.subtile_counts[std::int64_t(e) * p.subtiles + subtile] + (p.masked ? 0 : offsets[e]);
  __syncwarp();
  replay_slots(p, std::int64_t(subtile) * p.pieces * 32, next);
}

__global__ void __launch_bounds__(kOneBlockThreads) plan_one_block(PlanParams p) {
  extern __shared__ int shared_ints[];
  __shared__ int scan_shared[33];
  plan_in_block(p, shared_ints, scan_shared);
}


constexpr int kThreads = 256;
constexpr std::int64_t kMaxExperts = 8192;
constexpr std::int64_t kMaxSubtiles = 4096;
constexpr std::size_t kDefaultShared = 48 * 1024;
constexpr std::size_t kStaticShared = 256;  // block_exclusive_scan's 33 ints, rounded up

// The one-block path (choose_path) takes the problems where a memset and three dependent
// kernels cost more than the work: decode, T up to a few hundred tokens. Its bounds:
//   T·k ≤ 4096        the slots are replayed in order by at most 32 warps, each a subtile of
//                     ceil(T·k / (32·NS)) pieces of 32 slots; with NS ≥ 10 subtiles (next rule)
//                     that is ≤ 13 serial steps per warp, a few µs, under the launches it saves.
//                     Past it, the multi-kernel path spreads the replay over many SMs.
//   E_local ≤ 1024    thread e of the 1024 owns expert e in the scans (one pass, no loop), and
//                     the offsets plus NS ≥ 10 subtile counters ([NS, E_local] ints, 4 KiB each
//                     at 1024) fit the 48 KiB of shared memory a block has without opting in.
//   max_rows ≤ 65536  one SM writes every row of row_token and row_expert: ≤ 512 KiB of stores
//                     (masked rows are E_local × capacity, whatever T is).
constexpr std::int64_t kOneBlockMaxSlots = 4096;
constexpr std::int64_t kOneBlockMaxExperts = kOneBlockThreads;
constexpr std::int64_t kOneBlockMaxRows = 65536;

struct Tiling {
  int pieces;    // 32-slot pieces per subtile
  int subtiles;  // NS
};

Tiling tiling(const PlanProblem& p) {
  const std::int64_t slots = p.tokens * p.top_k;
  const std::int64_t pieces = std::max<std::int64_t>(8, ceil_div(slots, kMaxSubtiles * 32));
  return {int(pieces), int(ceil_div(slots, pieces * 32))};
}

// Warps per block whose private counters [E_local] fit next to `fixed` bytes of shared memory.
int warps_for(std::int64_t experts, std::size_t fixed, int max_warps = kThreads / 32) {
  const std::size_t per_warp = std::size_t(experts) * sizeof(int);
  const std::size_t room = kDefaultShared > fixed ? kDefaultShared - fixed : 0;
  return int(std::clamp<std::size_t>(room / per_warp, 1, std::size_t(max_warps)));
}

// The one-block path: as many subtiles (one per warp) as counters fit, then as few pieces per
// subtile as cover the slots.
struct OneBlockTiling {
  int pieces;          // 32-slot pieces per subtile
  int subtiles;        // NS ≤ 32 (0 when T = 0)
  std::size_t shared;  // dynamic shared memory: offsets [E_local + 1], counters [NS, E_local]
};

OneBlockTiling one_block_tiling(const PlanProblem& p) {
  const std::size_t fixed = std::size_t(p.rows.experts + 1) * sizeof(int);
  const int warps = warps_for(p.rows.experts, fixed + kStaticShared, kOneBlockThreads / 32);
  const std::int64_t slots = p.tokens * p.top_k;
  const std::int64_t pieces = std::max<std::int64_t>(1, ceil_div(slots, std::int64_t(warps) * 32));
  const int subtiles = int(ceil_div(slots, pieces * 32));
  return {int(pieces), subtiles, fixed + std::size_t(subtiles) * std::size_t(p.rows.experts) * sizeof(int)};
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > kDefaultShared) allow_dynamic_shared(reinterpret_cast<const void*>(kernel), int(bytes));
}

}  // namespace

std::string PlanProblem::to_string() const {
  std::ostringstream os;
  os << "permute plan " << rows.to_string() << " T=" << tokens << " k=" << top_k << " first_expert=" << first_expert;
  return os.str();
}

std::string_view to_string(PlanPath v) { return v == PlanPath::one_block ? "one_block" : "multi_kernel"; }

PlanPath choose_path(const PlanProblem& p) {
  if (p.tokens * p.top_k > kOneBlockMaxSlots) return PlanPath::multi_kernel;
  if (p.rows.experts > kOneBlockMaxExperts) return PlanPath::multi_kernel;
  if (p.max_rows() > kOneBlockMaxRows) return PlanPath::multi_kernel;
  return PlanPath::one_block;
}

Status can_implement(const PlanProblem& p) {
  if (Status s = p.rows.check(); !s) return Status::no("permute plan: " + s.reason());
  if (p.rows.experts > kMaxExperts)
    return Status::no("permute plan: at most " + std::to_string(kMaxExperts) + " local experts, given " +
                      std::to_string(p.rows.experts));
  if (p.tokens < 0 || p.top_k < 1) return Status::no("permute plan: needs T >= 0 and k >= 1");
  if (p.max_rows() >= (std::int64_t(1) << 31) || p.tokens * p.top_k >= (std::int64_t(1) << 31))
    return Status::no("permute plan: rows must stay below 2^31, given " + std::to_string(p.max_rows()));
  return Status::ok();
}

// What the multi-kernel path carves; the one-block path needs none, so this covers both.
std::size_t workspace_size(const PlanProblem& p) {
  core::Carver c(nullptr);
  c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts) * std::size_t(tiling(p).subtiles));
  c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts));
  return c.used();
}

namespace {

PlanParams params_of(const PlanProblem& p, const PlanArgs& args) {
  PlanParams kp{};
  kp.ids = args.topk_ids;
  kp.slots = p.tokens * p.top_k;
  kp.top_k = p.top_k;
  kp.first = int(p.first_expert);
  kp.experts = int(p.rows.experts);
  kp.alignment = int(p.rows.alignment);
  kp.capacity = int(p.rows.capacity);
  kp.masked = p.rows.format == RowFormat::masked;
  kp.counts = args.counts;
  kp.offsets = args.offsets;
  kp.slot_rows = args.slot_rows;
  kp.row_token = args.row_token;
  kp.row_expert = kp.masked ? nullptr : args.row_expert;
  kp.dropped = args.dropped;
  kp.max_rows = p.max_rows();
  kp.work = args.work;
  kp.work_rows = args.work_rows;
  kp.zeroed = args.zeroed;
  kp.zeroed_count = args.zeroed ? args.zeroed_count : 0;
  return kp;
}

}  // namespace

OneBlockLaunch one_block_launch(const PlanProblem& p, const PlanArgs& args) {
  require(choose_path(p) == PlanPath::one_block, [&] { return "permute plan: " + p.to_string() + " is not a one-block problem"; });
  OneBlockLaunch l{params_of(p, args), 0};
  const OneBlockTiling tiles = one_block_tiling(p);
  l.params.pieces = tiles.pieces;
  l.params.subtiles = tiles.subtiles;
  l.shared = tiles.shared;
  return l;
}

void run_prepared(const PlanProblem& p, const PlanArgs& args, const PrepareArgs& prepare, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(choose_path(p) == PlanPath::one_block, [&] { return "permute plan: " + p.to_string() + " is not a one-block problem"; });
  require(prepare.hidden && prepare.x && (!prepare.fp8 || prepare.x_scales) && prepare.hidden_size % (prepare.fp8 ? 128 : 64) == 0,
          "permute plan: the preparation needs hidden, x (and x_scales for fp8) and H a multiple of 128 (bf16: 64)");
  if (p.tokens == 0) return;
  const OneBlockLaunch l = one_block_launch(p, args);
  const PrepareParams q{static_cast<const std::uint16_t*>(prepare.hidden), prepare.weights,
                        static_cast<std::uint8_t*>(prepare.x), prepare.x_scales, p.tokens, int(prepare.hidden_size),
                        prepare.ue8m0};
  // Block 0 plans; the rest prepare the input, a warp per two 128-column groups of a row.
  const std::int64_t warps = p.tokens * ((ceil_div(prepare.hidden_size, 128) + 1) / 2);
  const std::int64_t preparers =
      std::clamp<std::int64_t>(ceil_div(warps, std::int64_t(kOneBlockThreads / 32)), 1, multiprocessor_count() - 1);
  const cudaStream_t s = as_cuda(stream);
  const dim3 grid(unsigned(1 + preparers)), block(kOneBlockThreads);
  if (prepare.fp8) launch_dependent(prepare_and_plan<true>, grid, block, l.shared, s, q, l.params);
  else launch_dependent(prepare_and_plan<false>, grid, block, l.shared, s, q, l.params);
}

void run(const PlanProblem& p, const PlanArgs& args, core::Workspace workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(workspace.size >= workspace_size(p), "permute plan: workspace too small");
  require(args.counts && args.row_token && (p.tokens == 0 || (args.topk_ids && args.slot_rows)),
          "permute plan: topk_ids, counts, slot_rows and row_token are required");
  require(p.rows.format == RowFormat::masked || args.offsets, "permute plan: the contiguous format needs offsets");
  const cudaStream_t s = as_cuda(stream);
  require(!args.work || args.work_rows > 0, "permute plan: work_rows must be positive with a work list");
  if (choose_path(p) == PlanPath::one_block) {
    const OneBlockLaunch l = one_block_launch(p, args);
    allow_shared(plan_one_block, l.shared);
    plan_one_block<<<1, kOneBlockThreads, l.shared, s>>>(l.params);
    MOEKIT_CUDA_CHECK_LAUNCH("plan_one_block");
    return;
  }
  PlanParams kp = params_of(p, args);

  require(!args.work && !args.zeroed, "permute plan: the work list and zeroed counters need the one-block path");
  const Tiling tiles = tiling(p);
  core::Carver c(workspace.data);
  kp.subtile_counts = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts) *
                                                             std::size_t(tiles.subtiles)));
  kp.totals = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts)));
  kp.pieces = tiles.pieces;
  kp.subtiles = tiles.subtiles;

  if (kp.max_rows > 0)
    MOEKIT_CUDA_CHECK(cudaMemsetAsync(args.row_token, 0xff, sizeof(std::int32_t) * std::size_t(kp.max_rows), s));
  const std::int64_t experts = p.rows.experts;
  if (tiles.subtiles > 0) {
    const int warps = warps_for(experts, 0);
    const std::size_t shared = std::size_t(warps) * std::size_t(experts) * sizeof(int);
    allow_shared(count_subtiles, shared);
    count_subtiles<<<grid_size(tiles.subtiles, warps), warps * 32, shared, s>>>(kp);
    MOEKIT_CUDA_CHECK_LAUNCH("count_subtiles");
  }
  scan_subtiles<<<unsigned(experts), kThreads, 0, s>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("scan_subtiles");

  const std::size_t fixed = std::size_t(experts + 1) * sizeof(int);
  const int warps = warps_for(experts, fixed);
  const std::size_t shared = fixed + std::size_t(warps) * std::size_t(experts) * sizeof(int);
  std::int64_t blocks = std::max<std::int64_t>(1, ceil_div(tiles.subtiles, warps));
  if (kp.row_expert) blocks = std::max<std::int64_t>(blocks, std::min<std::int64_t>(ceil_div(kp.max_rows, kThreads * 8), 4096));
  allow_shared(assign_rows, shared);
  // Full blocks: the expert-offset scan uses block barriers, so every warp takes part in it.
  assign_rows<<<unsigned(blocks), warps * 32, shared, s>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("assign_rows");
}

}  // namespace moekit::cuda::permute
