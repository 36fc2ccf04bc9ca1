#include "cpu/permute.h"

#include <cstring>

#include "core/parallel.h"
#include "moekit/quant.h"

namespace moekit::cpu {

std::int64_t plan_permutation(const std::int32_t* ids, std::int64_t tokens, int top_k,
                              ExpertRange experts, const PermutePlan& plan) {
  const std::int64_t slots = tokens * top_k;
  auto local = [&](std::int64_t s) { return std::int64_t(ids[s]) - experts.first; };
  auto is_local = [&](std::int64_t e) { return e >= 0 && e < experts.count; };

  for (std::int64_t e = 0; e <= experts.count; ++e) plan.offsets[e] = 0;
  for (std::int64_t s = 0; s < slots; ++s)
    if (is_local(local(s))) ++plan.offsets[local(s) + 1];
  for (std::int64_t e = 0; e < experts.count; ++e) plan.offsets[e + 1] += plan.offsets[e];

  // Walking slots in (token, slot) order fills each expert's rows in token order.
  std::int64_t* cursor = plan.offsets;  // reused: after the walk, cursor[e] = old offsets[e+1]
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::int64_t e = local(s);
    if (!is_local(e)) {
      plan.slot_rows[s] = -1;
      continue;
    }
    const std::int64_t row = cursor[e]++;
    plan.slot_rows[s] = std::int32_t(row);
    plan.row_token[row] = std::int32_t(s / top_k);
  }
  // Undo the cursor walk: shift back by one expert.
  for (std::int64_t e = experts.count; e > 0; --e) plan.offsets[e] = plan.offsets[e - 1];
  plan.offsets[0] = 0;
  return plan.offsets[experts.count];
}

void gather_rows(QuantScheme scheme, const QuantizedRows& src, const std::int32_t* row_token,
                 std::int64_t rows, const QuantizedRows& dst) {
  const std::int64_t cols = src.q.size(1);
  const std::size_t row_bytes = std::size_t(cols) * dtype_size(src.q.dtype);
  const std::int64_t groups = scheme == QuantScheme::fp8_block ? ceil_div(cols, kBlock) : 1;
  const bool per_row_scales = scheme == QuantScheme::fp8_rowwise || scheme == QuantScheme::fp8_block;
  if (scheme == QuantScheme::fp8_tensor) dst.scales.ptr<float>()[0] = src.scales.ptr<float>()[0];
  core::parallel_for(rows, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r) {
      const std::int64_t t = row_token[r];
      std::memcpy(static_cast<std::byte*>(dst.q.data) + std::size_t(r) * row_bytes,
                  static_cast<const std::byte*>(src.q.data) + std::size_t(t) * row_bytes, row_bytes);
      if (per_row_scales)
        std::memcpy(dst.scales.ptr<float>() + r * groups, src.scales.ptr<float>() + t * groups,
                    sizeof(float) * std::size_t(groups));
    }
  });
}

}  // namespace moekit::cpu
