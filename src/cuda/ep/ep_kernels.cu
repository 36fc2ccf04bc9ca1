// EP plan/pack/unpack/gather/sum on the GPU. One block per destination (plan), record or row;
// threads stride over its bytes. Plain by design: these move bytes, the arithmetic of ep = 1 stays in the
// backend's own stages (sum_rows adds in the CPU's order, so partial combines match it).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/ep/ep_kernels.h"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 128;

// Copies n bytes; 16 bytes at a time when both ends allow it.
__device__ void copy_bytes(std::uint8_t* dst, const std::uint8_t* src, std::size_t n) {
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | n) & 15) == 0) {
    for (std::size_t i = threadIdx.x; i < n / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    return;
  }
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

__device__ void zero_bytes(std::uint8_t* dst, std::size_t n) {
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = 0;
}

constexpr int kPlanThreads = 512;

// One block per destination rank d: its tokens in order, placed by a scan of the "goes to d"
// flags (a ballot per warp, warp totals in shared memory), chunk after chunk of tokens; then
// the block's padding records.
__global__ void plan_fixed_kernel(PlanLaunch a) {
  __shared__ int warp_counts[kPlanThreads / 32];
  const int d = int(blockIdx.x), k = a.top_k, lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const std::int64_t experts = a.local_experts * a.ranks, block = std::int64_t(d) * a.capacity;
  auto owner = [&](std::int32_t e) { return e >= 0 && e < experts ? int(e / a.local_experts) : -1; };
  std::int64_t placed = 0;
  for (std::int64_t t0 = 0; t0 < a.tokens; t0 += kPlanThreads) {
    const std::int64_t t = t0 + threadIdx.x;
    bool goes = false;
    if (t < a.tokens)
      for (int j = 0; j < k; ++j) goes = goes || owner(a.topk_ids[t * k + j]) == d;
    const unsigned ballot = __ballot_sync(0xffffffffu, goes);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kPlanThreads / 32; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    const std::int64_t record = block + placed + before + __popc(ballot & ((1u << lane) - 1u));
    if (goes) {
      a.token[record] = std::int32_t(t);
      for (int j = 0; j < k; ++j) {
        const std::int32_t e = a.topk_ids[t * k + j];
        const bool own = owner(e) == d;
        a.ids[record * k + j] = own ? e : -1;
        a.weights[record * k + j] = own ? a.topk_weights[t * k + j] : 0.0f;
        if (own && a.slot_rows) a.slot_rows[t * k + j] = std::int32_t(record * k + j);
      }
    }
    if (t < a.tokens && a.token_rows) a.token_rows[t * a.ranks + d] = goes ? std::int32_t(record) : -1;
    if (t < a.tokens && a.slot_rows && d == 0)
      for (int j = 0; j < k; ++j)
        if (owner(a.topk_ids[t * k + j]) < 0) a.slot_rows[t * k + j] = -1;
    placed += total;
    __syncthreads();  // warp_counts is written again
  }
  for (std::int64_t r = block + placed + threadIdx.x; r < block + a.capacity; r += kPlanThreads) {
    a.token[r] = -1;
    for (int j = 0; j < k; ++j) {
      a.ids[r * k + j] = -1;
      a.weights[r * k + j] = 0.0f;
    }
  }
}

__global__ void pack_kernel(RecordLayout l, PackLaunch a) {
  const std::int64_t r = blockIdx.x;
  std::uint8_t* rec = a.out + std::size_t(r) * l.bytes;
  const std::size_t k = std::size_t(l.top_k);
  copy_bytes(rec + l.weights, reinterpret_cast<const std::uint8_t*>(a.weights + r * k), sizeof(float) * k);
  copy_bytes(rec + l.ids, reinterpret_cast<const std::uint8_t*>(a.ids + r * k), sizeof(std::int32_t) * k);
  const std::int32_t t = a.token[r];
  if (t < 0) {
    zero_bytes(rec + l.scales, l.bytes - l.scales);
    return;
  }
  if (l.n_scales)
    copy_bytes(rec + l.scales, reinterpret_cast<const std::uint8_t*>(a.scales + std::size_t(t) * std::size_t(l.n_scales)),
               sizeof(float) * std::size_t(l.n_scales));
  copy_bytes(rec + l.values, a.values + std::size_t(t) * l.value_bytes, l.value_bytes);
  zero_bytes(rec + l.values + l.value_bytes, l.bytes - l.values - l.value_bytes);
}

__global__ void unpack_kernel(RecordLayout l, UnpackLaunch a) {
  const std::int64_t i = blockIdx.x;
  const std::uint8_t* rec = a.records + std::size_t(i) * l.bytes;
  const std::size_t k = std::size_t(l.top_k);
  copy_bytes(reinterpret_cast<std::uint8_t*>(a.weights + i * k), rec + l.weights, sizeof(float) * k);
  copy_bytes(reinterpret_cast<std::uint8_t*>(a.ids + i * k), rec + l.ids, sizeof(std::int32_t) * k);
  if (l.n_scales)
    copy_bytes(reinterpret_cast<std::uint8_t*>(a.scales + std::size_t(i) * std::size_t(l.n_scales)), rec + l.scales,
               sizeof(float) * std::size_t(l.n_scales));
  copy_bytes(a.values + std::size_t(i) * l.value_bytes, rec + l.values, l.value_bytes);
}

__global__ void copy_scale_kernel(const float* src, float* dst) { dst[0] = src[0]; }

__global__ void gather_kernel(const std::uint16_t* expert_out, const std::int32_t* rows, std::int64_t hidden,
                              std::uint16_t* out) {
  const std::int64_t i = blockIdx.x;
  const std::int32_t row = rows[i];
  auto* dst = reinterpret_cast<std::uint8_t*>(out + i * hidden);
  const std::size_t n = sizeof(std::uint16_t) * std::size_t(hidden);
  if (row < 0) zero_bytes(dst, n);
  else copy_bytes(dst, reinterpret_cast<const std::uint8_t*>(expert_out + std::int64_t(row) * hidden), n);
}

__global__ void sum_kernel(const std::uint16_t* rows, const std::int32_t* token_rows, int ranks, std::int64_t hidden,
                           std::uint16_t* out) {
  const std::int64_t t = blockIdx.x;
  const __nv_bfloat16* r = reinterpret_cast<const __nv_bfloat16*>(rows);
  for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float sum = 0.0f;
    for (int d = 0; d < ranks; ++d) {
      const std::int32_t row = token_rows[t * ranks + d];
      if (row >= 0) sum = __fadd_rn(sum, __bfloat162float(r[std::int64_t(row) * hidden + h]));
    }
    reinterpret_cast<__nv_bfloat16*>(out)[t * hidden + h] = __float2bfloat16_rn(sum);
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

void launch_plan_fixed(const PlanLaunch& a, void* stream) {
  plan_fixed_kernel<<<unsigned(a.ranks), kPlanThreads, 0, as_stream(stream)>>>(a);
}

void launch_pack(const RecordLayout& l, const PackLaunch& a, void* stream) {
  if (a.records > 0) pack_kernel<<<unsigned(a.records), kThreads, 0, as_stream(stream)>>>(l, a);
}

void launch_unpack(const RecordLayout& l, const UnpackLaunch& a, void* stream) {
  if (a.tensor_scale) copy_scale_kernel<<<1, 1, 0, as_stream(stream)>>>(a.tensor_scale, a.scales);
  if (a.count > 0) unpack_kernel<<<unsigned(a.count), kThreads, 0, as_stream(stream)>>>(l, a);
}

void launch_gather_rows(const std::uint16_t* expert_out, const std::int32_t* rows, std::int64_t count,
                        std::int64_t hidden, std::uint16_t* out, void* stream) {
  if (count > 0) gather_kernel<<<unsigned(count), kThreads, 0, as_stream(stream)>>>(expert_out, rows, hidden, out);
}

void launch_sum_rows(const std::uint16_t* rows, const std::int32_t* token_rows, int ranks, std::int64_t tokens,
                     std::int64_t hidden, std::uint16_t* out, void* stream) {
  if (tokens > 0) sum_kernel<<<unsigned(tokens), kThreads, 0, as_stream(stream)>>>(rows, token_rows, ranks, hidden, out);
}

}  // namespace moekit::cuda
