#include "cpu/ep_dispatch.h"

#include <cstring>

#include "core/parallel.h"

namespace moekit::cpu {

void pack_records(const core::EpRecordLayout& l, const core::EpPackArgs& a) {
  const std::size_t k = std::size_t(l.top_k), n_scales = std::size_t(l.n_scales);
  const auto* values = static_cast<const std::byte*>(a.in.q.data);
  core::parallel_for(a.records, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      std::byte* rec = a.out + std::size_t(r) * l.bytes;
      std::memcpy(rec + l.weights, a.weights + std::size_t(r) * k, sizeof(float) * k);
      std::memcpy(rec + l.ids, a.ids + std::size_t(r) * k, sizeof(std::int32_t) * k);
      const std::int32_t t = a.token[r];
      if (t < 0) {  // padding of a fixed-capacity block: no ids, zero values
        std::memset(rec + l.scales, 0, l.bytes - l.scales);
        continue;
      }
      if (n_scales)
        std::memcpy(rec + l.scales, a.in.scales.ptr<float>() + std::size_t(t) * n_scales, sizeof(float) * n_scales);
      std::memcpy(rec + l.values, values + std::size_t(t) * l.value_bytes, l.value_bytes);
      std::memset(rec + l.values + l.value_bytes, 0, l.bytes - l.values - l.value_bytes);
    }
  });
}

void unpack_records(const core::EpRecordLayout& l, const core::EpUnpackArgs& a) {
  const std::size_t k = std::size_t(l.top_k), n_scales = std::size_t(l.n_scales);
  auto* values = static_cast<std::byte*>(a.rows.q.data);
  if (a.tensor_scale) a.rows.scales.ptr<float>()[0] = a.tensor_scale[0];
  core::parallel_for(a.count, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const std::byte* rec = a.records + std::size_t(i) * l.bytes;
      std::memcpy(a.topk_weights.ptr<float>() + std::size_t(i) * k, rec + l.weights, sizeof(float) * k);
      std::memcpy(a.topk_ids.ptr<std::int32_t>() + std::size_t(i) * k, rec + l.ids, sizeof(std::int32_t) * k);
      if (n_scales)
        std::memcpy(a.rows.scales.ptr<float>() + std::size_t(i) * n_scales, rec + l.scales, sizeof(float) * n_scales);
      std::memcpy(values + std::size_t(i) * l.value_bytes, rec + l.values, l.value_bytes);
    }
  });
}

}  // namespace moekit::cpu
