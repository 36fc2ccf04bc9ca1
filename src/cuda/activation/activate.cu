// Activation + requantization: launchers and op entry.
#include "cuda/activation/activate.h"

#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/activation/activate.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::activation {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxRowwiseWidth = 48 * 1024;  // the row stays in shared memory as f32

template <Emit kEmit, Activation kAct>
void launch_groups(const ActParams& kp, cudaStream_t stream) {
  // Runs of kItemsPerWarp items (256 columns of a row) or more per warp, 8 warps per block, a few
  // waves of resident blocks.
  const std::int64_t items = std::int64_t(kp.max_rows) * ceil_div(kp.groups, 2);
  const unsigned blocks = grid_size(ceil_div(items, kItemsPerWarp), kThreads / 32, std::int64_t(multiprocessor_count()) * 32);
  activate_groups<kEmit, kAct><<<blocks, kThreads, 0, stream>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("activate_groups");
}

template <Emit kEmit>
void launch_groups(const ActParams& kp, cudaStream_t stream) {
  switch (kp.act) {
    case Activation::silu_and_mul: launch_groups<kEmit, Activation::silu_and_mul>(kp, stream); break;
    case Activation::gelu_and_mul: launch_groups<kEmit, Activation::gelu_and_mul>(kp, stream); break;
    case Activation::swiglu_oai: launch_groups<kEmit, Activation::swiglu_oai>(kp, stream); break;
    case Activation::relu2: launch_groups<kEmit, Activation::relu2>(kp, stream); break;
  }
}

template <Activation kAct>
void launch_rows(const ActParams& kp, std::size_t shared, cudaStream_t stream) {
  if (shared > 48 * 1024) allow_dynamic_shared(reinterpret_cast<const void*>(&activate_rows<kAct>), int(shared));
  activate_rows<kAct><<<grid_size(kp.max_rows, 1, std::int64_t(multiprocessor_count()) * 8), kThreads, shared, stream>>>(kp);
  MOEKIT_CUDA_CHECK_LAUNCH("activate_rows");
}

}  // namespace

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "activation " << moekit::to_string(activation) << " " << rows.to_string() << " T=" << tokens << " k=" << top_k
     << " I=" << intermediate << " -> " << quant.to_string();
  if (quant.scheme == QuantScheme::fp8_block) os << " scales=" << cuda::to_string(scale_layout);
  if (quant.scheme == QuantScheme::fp8_tensor)
    os << (tensor_scale == quant::TensorScale::given ? " scale=given" : " scale=dynamic");
  return os.str();
}

Status can_implement(const Problem& p) {
  if (Status s = p.rows.check(); !s) return Status::no("activation: " + s.reason());
  if (p.tokens < 0 || p.top_k < 1) return Status::no("activation: needs T >= 0 and k >= 1");
  if (p.intermediate < 8 || p.intermediate % 8 != 0)
    return Status::no("activation: needs I a multiple of 8 (16-byte bf16 loads), given I=" + std::to_string(p.intermediate));
  if (p.max_rows() >= (std::int64_t(1) << 31) || p.max_rows() * p.input_width() >= (std::int64_t(1) << 40))
    return Status::no("activation: too many rows");
  if (p.quant.scheme == QuantScheme::fp8_block && p.intermediate % 16 != 0)
    return Status::no("activation: fp8-block needs I % 16 == 0, given I=" + std::to_string(p.intermediate));
  if (p.quant.scheme == QuantScheme::fp8_rowwise && p.intermediate > kMaxRowwiseWidth)
    return Status::no("activation: fp8-rowwise keeps a row in shared memory, I <= " + std::to_string(kMaxRowwiseWidth));
  return Status::ok();
}

std::size_t workspace_size(const Problem& p) {
  return p.quant.scheme == QuantScheme::fp8_tensor && p.tensor_scale == quant::TensorScale::dynamic ? 256 : 0;
}

void run(const Problem& p, const Args& args, core::Workspace workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(workspace.size >= workspace_size(p), "activation: workspace too small");
  const std::int64_t max_rows = p.max_rows();
  const bool dynamic = p.quant.scheme == QuantScheme::fp8_tensor && p.tensor_scale == quant::TensorScale::dynamic;
  if (max_rows == 0) {
    if (dynamic && args.reduce_amax) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(workspace.data, 0, sizeof(float), as_cuda(stream)));
      args.reduce_amax(reinterpret_cast<float*>(workspace.data));
    }
    return;
  }
  require(args.gemm1_out && args.q && args.plan.counts, "activation: gemm1_out, q and counts are required");
  require(p.rows.format == RowFormat::masked || args.plan.offsets, "activation: the contiguous format needs offsets");
  require(p.quant.scheme == QuantScheme::bf16 || args.scales, "activation: scales are required");
  const bool given = p.quant.scheme == QuantScheme::fp8_tensor && p.tensor_scale == quant::TensorScale::given;
  require(!given || args.given_scale, "activation: fp8-tensor with a given scale needs given_scale");
  require(reinterpret_cast<std::uintptr_t>(args.gemm1_out) % 16 == 0 && reinterpret_cast<std::uintptr_t>(args.q) % 16 == 0,
          "activation: gemm1_out and q must be 16-byte aligned");

  ActParams kp{};
  kp.rows = rows_params(p.rows, args.plan);
  kp.in = static_cast<const std::uint16_t*>(args.gemm1_out);
  kp.in_width = int(p.input_width());
  kp.inter = int(p.intermediate);
  kp.groups = int(ceil_div(p.intermediate, kBlock));
  kp.max_rows = int(max_rows);
  kp.act = p.activation;
  kp.alpha = p.swiglu_alpha;
  kp.limit = p.swiglu_limit;
  kp.ue8m0 = p.quant.scale_format == ScaleFormat::ue8m0;
  kp.layout = p.scale_layout;
  kp.given_scale = given ? args.given_scale : nullptr;
  kp.amax = reinterpret_cast<float*>(workspace.data);
  kp.q = args.q;
  kp.scales = args.scales;
  const cudaStream_t s = as_cuda(stream);
  switch (p.quant.scheme) {
    case QuantScheme::bf16: launch_groups<Emit::bf16>(kp, s); break;
    case QuantScheme::fp8_block: launch_groups<Emit::group_fp8>(kp, s); break;
    case QuantScheme::fp8_tensor:
      if (!given) {
        MOEKIT_CUDA_CHECK(cudaMemsetAsync(kp.amax, 0, sizeof(float), s));
        launch_groups<Emit::amax>(kp, s);
        if (args.reduce_amax) args.reduce_amax(kp.amax);
      }
      launch_groups<Emit::tensor_fp8>(kp, s);
      break;
    case QuantScheme::fp8_rowwise: {
      const std::size_t shared = std::size_t(p.intermediate) * sizeof(float);
      switch (p.activation) {
        case Activation::silu_and_mul: launch_rows<Activation::silu_and_mul>(kp, shared, s); break;
        case Activation::gelu_and_mul: launch_rows<Activation::gelu_and_mul>(kp, shared, s); break;
        case Activation::swiglu_oai: launch_rows<Activation::swiglu_oai>(kp, shared, s); break;
        case Activation::relu2: launch_rows<Activation::relu2>(kp, shared, s); break;
      }
      break;
    }
  }
}

}  // namespace moekit::cuda::activation
