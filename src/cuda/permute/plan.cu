// Permutation plan: launchers and the op entry.
#include "cuda/permute/plan.h"

#include <algorithm>
#include <sstream>

#include "core/stages.h"
#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/permute/plan.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::permute {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxExperts = 8192;
constexpr std::int64_t kMaxSubtiles = 4096;
constexpr std::size_t kDefaultShared = 48 * 1024;

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
int warps_for(std::int64_t experts, std::size_t fixed) {
  const std::size_t per_warp = std::size_t(experts) * sizeof(int);
  const std::size_t room = kDefaultShared > fixed ? kDefaultShared - fixed : 0;
  return int(std::clamp<std::size_t>(room / per_warp, 1, kThreads / 32));
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > kDefaultShared)
    MOEKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

std::string PlanProblem::to_string() const {
  std::ostringstream os;
  os << "permute plan " << rows.to_string() << " T=" << tokens << " k=" << top_k << " first_expert=" << first_expert;
  return os.str();
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

std::size_t workspace_size(const PlanProblem& p) {
  core::Carver c(nullptr);
  c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts) * std::size_t(tiling(p).subtiles));
  c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts));
  return c.used();
}

void run(const PlanProblem& p, const PlanArgs& args, core::Workspace workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(workspace.size >= workspace_size(p), "permute plan: workspace too small");
  require(args.counts && args.row_token && (p.tokens == 0 || (args.topk_ids && args.slot_rows)),
          "permute plan: topk_ids, counts, slot_rows and row_token are required");
  require(p.rows.format == RowFormat::masked || args.offsets, "permute plan: the contiguous format needs offsets");
  const cudaStream_t s = as_cuda(stream);
  const Tiling tiles = tiling(p);
  core::Carver c(workspace.data);
  PlanParams kp{};
  kp.subtile_counts = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts) *
                                                             std::size_t(tiles.subtiles)));
  kp.totals = reinterpret_cast<std::int32_t*>(c.take(sizeof(std::int32_t) * std::size_t(p.rows.experts)));
  kp.ids = args.topk_ids;
  kp.slots = p.tokens * p.top_k;
  kp.top_k = p.top_k;
  kp.first = int(p.first_expert);
  kp.experts = int(p.rows.experts);
  kp.alignment = int(p.rows.alignment);
  kp.capacity = int(p.rows.capacity);
  kp.masked = p.rows.format == RowFormat::masked;
  kp.pieces = tiles.pieces;
  kp.subtiles = tiles.subtiles;
  kp.counts = args.counts;
  kp.offsets = args.offsets;
  kp.slot_rows = args.slot_rows;
  kp.row_token = args.row_token;
  kp.row_expert = kp.masked ? nullptr : args.row_expert;
  kp.dropped = args.dropped;
  kp.max_rows = p.max_rows();

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
