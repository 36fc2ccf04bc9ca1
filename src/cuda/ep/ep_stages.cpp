#include "cuda/ep/ep_stages.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda/ep/ep_kernels.h"
#include "moekit/comm.h"
#include "moekit/error.h"

namespace moekit::cuda {
namespace {

void check(cudaError_t status, const char* what) {
  require(status == cudaSuccess, std::string("cuda ep: ") + what + ": " + cudaGetErrorString(status));
}

RecordLayout flat(const core::EpRecordLayout& l) {
  return {l.top_k, l.n_scales, l.weights, l.ids, l.scales, l.values, l.value_bytes, l.bytes};
}

class CudaEpStages final : public core::EpStages {
 public:
  void to_device(void* dst, const void* src, std::size_t bytes, Stream stream) const override {
    // From pageable memory the copy has read src when it returns, so the host plan may change.
    if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStream_t(stream)), "to_device");
  }
  void to_host(void* dst, const void* src, std::size_t bytes, Stream stream) const override {
    if (!bytes) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cudaStream_t(stream)), "to_host");
    check(cudaStreamSynchronize(cudaStream_t(stream)), "to_host");
  }
  bool capturing(Stream stream) const override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(cudaStream_t(stream), &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }
  void plan_fixed(const core::EpPlanArgs& a, Stream stream) const override {
    launch_plan_fixed({a.topk_ids, a.topk_weights, a.tokens, a.capacity, a.top_k, a.ranks, a.local_experts, a.token,
                       a.ids, a.weights, a.slot_rows, a.token_rows},
                      stream);
    check(cudaGetLastError(), "plan_fixed");
  }
  void pack(const core::EpRecordLayout& layout, const core::EpPackArgs& a, Stream stream) const override {
    launch_pack(flat(layout),
                {static_cast<const std::uint8_t*>(a.in.q.data), a.in.scales.defined() ? a.in.scales.ptr<float>() : nullptr,
                 a.token, a.ids, a.weights, a.records, reinterpret_cast<std::uint8_t*>(a.out)},
                stream);
    check(cudaGetLastError(), "pack");
  }
  void unpack(const core::EpRecordLayout& layout, const core::EpUnpackArgs& a, Stream stream) const override {
    launch_unpack(flat(layout),
                  {reinterpret_cast<const std::uint8_t*>(a.records), a.count, static_cast<std::uint8_t*>(a.rows.q.data),
                   a.rows.scales.defined() ? a.rows.scales.ptr<float>() : nullptr, a.topk_ids.ptr<std::int32_t>(),
                   a.topk_weights.ptr<float>(), a.tensor_scale},
                  stream);
    check(cudaGetLastError(), "unpack");
  }
  void gather_rows(const core::EpGatherArgs& a, Stream stream) const override {
    launch_gather_rows(reinterpret_cast<const std::uint16_t*>(a.expert_out), a.rows, a.count, a.hidden,
                       reinterpret_cast<std::uint16_t*>(a.out), stream);
    check(cudaGetLastError(), "gather_rows");
  }
  void sum_rows(const core::EpSumArgs& a, Stream stream) const override {
    launch_sum_rows(reinterpret_cast<const std::uint16_t*>(a.rows), a.token_rows, a.ranks, a.tokens, a.hidden,
                    reinterpret_cast<std::uint16_t*>(a.out), stream);
    check(cudaGetLastError(), "sum_rows");
  }
};

}  // namespace

std::unique_ptr<core::EpStages> make_ep_stages() { return std::make_unique<CudaEpStages>(); }

std::function<void(float* amax)> group_amax(const core::StageProblem& p, Stream stream) {
  if (!p.group || p.config.quant.scheme != QuantScheme::fp8_tensor) return {};
  return [group = p.group, stream](float* amax) { group->all_reduce_max(amax, 1, stream); };
}

}  // namespace moekit::cuda
