// Quantization: the typed launchers and the op entry.
#include "cuda/quant/quantize.h"

#include <algorithm>
#include <sstream>

#include "cuda/common/check.h"
#include "cuda/common/launch.h"
#include "cuda/quant/quantize.cuh"
#include "moekit/quant.h"

namespace moekit::cuda::quant {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxRowwiseHidden = 48 * 1024;  // the row stays in shared memory as f32

bool on_input(const Problem& p) { return p.placement == WeightPlacement::input; }

// Elementwise kernels: enough blocks to fill the GPU a few times over, then grid-stride.
unsigned elementwise_blocks(std::int64_t vectors) {
  return grid_size(vectors, kThreads, std::int64_t(multiprocessor_count()) * 16);
}

// One wave of resident blocks at most, each warp walking several steps: the pipelined loads
// then run ahead across rows too.
template <bool kOnInput, int kPairs>
void launch_groups(const Problem& p, const KernelParams& kp, cudaStream_t stream) {
  constexpr int kAhead = 1;  // steps whose loads are in flight: 2 and 3 were slower on the H200 (docs/PERF.md)
  static int resident = 0;
  if (resident == 0)
    MOEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, quantize_groups<kOnInput, kPairs, kAhead>, kThreads, 0));
  const std::int64_t wave = std::int64_t(multiprocessor_count()) * std::max(resident, 1);
  const std::int64_t steps = p.tokens * ceil_div(ceil_div(p.hidden, kBlock), 2 * kPairs);
  quantize_groups<kOnInput, kPairs, kAhead><<<grid_size(steps, kThreads / 32, wave), kThreads, 0, stream>>>(kp);
}

template <bool kOnInput, bool kVector>
void launch_scheme(const Problem& p, const KernelParams& kp, const Args& args, cudaStream_t stream) {
  const std::int64_t n = p.tokens * p.hidden;
  const std::int64_t vectors = kVector ? n / 8 : n;
  switch (p.quant.scheme) {
    case QuantScheme::bf16:
      weighted_bf16<kVector><<<elementwise_blocks(vectors), kThreads, 0, stream>>>(kp);
      break;
    case QuantScheme::fp8_tensor:
      if (p.tensor_scale == TensorScale::dynamic) {
        MOEKIT_CUDA_CHECK(cudaMemsetAsync(kp.amax, 0, sizeof(float), stream));
        tensor_amax<kOnInput, kVector><<<elementwise_blocks(vectors), kThreads, 0, stream>>>(kp);
        MOEKIT_CUDA_CHECK_LAUNCH("tensor_amax");
        if (args.reduce_amax) args.reduce_amax(kp.amax);
      }
      tensor_quantize<kOnInput, kVector><<<elementwise_blocks(vectors), kThreads, 0, stream>>>(kp);
      break;
    case QuantScheme::fp8_rowwise: {
      const std::size_t shared = std::size_t(p.hidden) * sizeof(float);
      auto kernel = quantize_rows<kOnInput, kVector>;
      if (shared > 48 * 1024) allow_dynamic_shared(reinterpret_cast<const void*>(kernel), int(shared));
      kernel<<<grid_size(p.tokens, 1, std::int64_t(multiprocessor_count()) * 8), kThreads, shared, stream>>>(kp);
      break;
    }
    case QuantScheme::fp8_block:
      // Rows of 32+ groups (H >= 4096) go 4 pairs of groups a step, narrower ones 2 (more
      // steps to deal out evenly, a lighter kernel with more warps resident): the faster of the
      // two on the H200 at H = 7168 and at H = 2048 (docs/PERF.md).
      if (ceil_div(p.hidden, kBlock) >= 32) launch_groups<kOnInput, 4>(p, kp, stream);
      else launch_groups<kOnInput, 2>(p, kp, stream);
      break;
  }
  MOEKIT_CUDA_CHECK_LAUNCH("quantize");
}

}  // namespace

std::string Problem::to_string() const {
  std::ostringstream os;
  os << "quantize " << quant.to_string() << " T=" << tokens << " H=" << hidden << " weights_on="
     << moekit::to_string(placement);
  if (quant.scheme == QuantScheme::fp8_tensor) os << (tensor_scale == TensorScale::given ? " scale=given" : " scale=dynamic");
  return os.str();
}

Status can_implement(const Problem& p) {
  if (p.tokens < 0) return Status::no("quantize: tokens must be >= 0, given " + std::to_string(p.tokens));
  if (p.hidden < 1 || p.hidden > (std::int64_t(1) << 30))
    return Status::no("quantize: hidden size must lie in [1, 2^30], given " + std::to_string(p.hidden));
  if (p.quant.scheme == QuantScheme::fp8_block && p.hidden % 16 != 0)
    return Status::no("quantize: fp8-block needs H % 16 == 0, given H=" + std::to_string(p.hidden));
  if (p.quant.scheme == QuantScheme::fp8_rowwise && p.hidden > kMaxRowwiseHidden)
    return Status::no("quantize: fp8-rowwise keeps a row in shared memory, H <= " + std::to_string(kMaxRowwiseHidden) +
                      ", given " + std::to_string(p.hidden));
  return Status::ok();
}

std::size_t workspace_size(const Problem& p) {
  return p.quant.scheme == QuantScheme::fp8_tensor && p.tensor_scale == TensorScale::dynamic ? 256 : 0;
}

void run(const Problem& p, const Args& args, core::Workspace workspace, Stream stream) {
  const Status status = can_implement(p);
  require(status.is_ok(), status.reason());
  require(workspace.size >= workspace_size(p), "quantize: workspace too small");
  if (p.tokens == 0) {
    // Under EP every rank takes part in the amax's reduction, also one without tokens.
    if (p.quant.scheme == QuantScheme::fp8_tensor && p.tensor_scale == TensorScale::dynamic && args.reduce_amax) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(workspace.data, 0, sizeof(float), as_cuda(stream)));
      args.reduce_amax(reinterpret_cast<float*>(workspace.data));
    }
    return;
  }
  require(args.hidden && args.q, "quantize: hidden and q are required");
  require(p.quant.scheme == QuantScheme::bf16 || args.scales, "quantize: scales are required");
  require(!on_input(p) || args.topk_weights, "quantize: the weight on the input needs topk_weights");
  require(p.quant.scheme != QuantScheme::fp8_tensor || p.tensor_scale == TensorScale::dynamic || args.given_scale,
          "quantize: fp8-tensor with a given scale needs given_scale");
  const cudaStream_t s = as_cuda(stream);
  if (p.quant.scheme == QuantScheme::bf16 && !on_input(p)) {
    MOEKIT_CUDA_CHECK(cudaMemcpyAsync(args.q, args.hidden, std::size_t(p.tokens * p.hidden) * 2,
                                      cudaMemcpyDeviceToDevice, s));
    return;
  }
  KernelParams kp{};
  kp.hidden = static_cast<const std::uint16_t*>(args.hidden);
  kp.weights = args.topk_weights;
  kp.given_scale = p.tensor_scale == TensorScale::given ? args.given_scale : nullptr;
  kp.q = args.q;
  kp.scales = args.scales;
  kp.amax = reinterpret_cast<float*>(workspace.data);
  kp.tokens = p.tokens;
  kp.hidden_size = int(p.hidden);
  kp.ue8m0 = p.quant.scale_format == ScaleFormat::ue8m0;
  // 16-byte rows: H a multiple of 8 and the buffers aligned.
  const bool vector = p.hidden % 8 == 0 && reinterpret_cast<std::uintptr_t>(args.hidden) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(args.q) % 16 == 0;
  require(vector || p.quant.scheme != QuantScheme::fp8_block, "quantize: fp8-block needs 16-byte aligned hidden and q");
  if (on_input(p)) {
    if (vector) launch_scheme<true, true>(p, kp, args, s);
    else launch_scheme<true, false>(p, kp, args, s);
  } else {
    if (vector) launch_scheme<false, true>(p, kp, args, s);
    else launch_scheme<false, false>(p, kp, args, s);
  }
}

}  // namespace moekit::cuda::quant
