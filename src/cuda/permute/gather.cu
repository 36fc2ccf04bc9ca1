// Gather: launcher and op entry.
#include "cuda/permute/gather.h"

#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/permute/gather.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::permute {
namespace {

int scale_groups(const GatherProblem& p) {
  switch (p.scheme) {
    case QuantScheme::fp8_block: return int(ceil_div(p.hidden, kBlock));
    case QuantScheme::fp8_rowwise: return 1;
    default: return 0;
  }
}

// The widest vector that divides the row and both buffers' alignment.
int vector_bytes(const GatherProblem& p, const GatherArgs& a, int row_bytes) {
  const auto align = reinterpret_cast<std::uintptr_t>(a.q) | reinterpret_cast<std::uintptr_t>(a.out_q);
  for (int bytes = 16; bytes > 1; bytes /= 2)
    if (row_bytes % bytes == 0 && align % std::uintptr_t(bytes) == 0) return bytes;
  (void)p;
  return 1;
}

}  // namespace

std::string GatherProblem::to_string() const {
  std::ostringstream os;
  os << "permute gather " << rows.to_string() << " T=" << tokens << " k=" << top_k << " H=" << hidden << " "
     << moekit::to_string(scheme);
  if (scheme == QuantScheme::fp8_block) os << " scales=" << cuda::to_string(scale_layout);
  return os.str();
}

Status can_implement(const GatherProblem& p) {
  if (Status s = p.rows.check(); !s) return Status::no("permute gather: " + s.reason());
  if (p.tokens < 0 || p.top_k < 1 || p.hidden < 1) return Status::no("permute gather: needs T >= 0, k >= 1, H >= 1");
  if (p.max_rows() >= (std::int64_t(1) << 31)) return Status::no("permute gather: rows must stay below 2^31");
  if (p.hidden * (p.scheme == QuantScheme::bf16 ? 2 : 1) >= (std::int64_t(1) << 31))
    return Status::no("permute gather: a row must stay below 2 GB");
  if (p.scheme == QuantScheme::fp8_block && p.hidden % 16 != 0)
    return Status::no("permute gather: fp8-block needs H % 16 == 0, given H=" + std::to_string(p.hidden));
  return Status::ok();
}

std::size_t workspace_size(const GatherProblem&) { return 0; }

void run(const GatherProblem& p, const GatherArgs& args, core::Workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  const std::int64_t max_rows = p.max_rows();
  if (p.tokens == 0) return;  // no token rows, hence no padding either
  require(args.q && args.out_q && args.row_token && args.plan.counts, "permute gather: q, out_q, row_token, counts are required");
  require(p.rows.format == RowFormat::masked || args.plan.offsets, "permute gather: the contiguous format needs offsets");
  require(p.scheme == QuantScheme::bf16 || (args.scales && args.out_scales), "permute gather: scales are required");
  GatherParams kp{};
  kp.rows = rows_params(p.rows, args.plan);
  kp.q = args.q;
  kp.scales = args.scales;
  kp.row_token = args.row_token;
  kp.out_q = args.out_q;
  kp.out_scales = args.out_scales;
  kp.max_rows = max_rows;
  kp.row_bytes = int(p.hidden * (p.scheme == QuantScheme::bf16 ? 2 : 1));
  kp.groups = scale_groups(p);
  kp.scheme = p.scheme;
  kp.layout = p.scale_layout;
  const unsigned blocks = unsigned(ceil_div(max_rows, kGatherRows));
  const cudaStream_t s = as_cuda(stream);
  switch (vector_bytes(p, args, kp.row_bytes)) {
    case 16: gather_rows<16><<<blocks, kGatherRows * 32, 0, s>>>(kp); break;
    case 8: gather_rows<8><<<blocks, kGatherRows * 32, 0, s>>>(kp); break;
    case 4: gather_rows<4><<<blocks, kGatherRows * 32, 0, s>>>(kp); break;
    case 2: gather_rows<2><<<blocks, kGatherRows * 32, 0, s>>>(kp); break;
    default: gather_rows<1><<<blocks, kGatherRows * 32, 0, s>>>(kp); break;
  }
  MOEKIT_CUDA_CHECK_LAUNCH("gather_rows");
}

}  // namespace moekit::cuda::permute
