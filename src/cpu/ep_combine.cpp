#include "cpu/ep_combine.h"

#include <cstring>

#include "core/parallel.h"

namespace moekit::cpu {

void gather_expert_rows(const core::EpGatherArgs& a) {
  const std::size_t row_bytes = sizeof(bf16) * std::size_t(a.hidden);
  core::parallel_for(a.count, 64, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      bf16* dst = a.out + i * a.hidden;
      const std::int32_t row = a.rows[i];
      if (row < 0) std::memset(dst, 0, row_bytes);
      else std::memcpy(dst, a.expert_out + std::int64_t(row) * a.hidden, row_bytes);
    }
  });
}

void sum_token_rows(const core::EpSumArgs& a) {
  core::parallel_for(a.tokens, 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t h = 0; h < a.hidden; ++h) {
        float sum = 0.0f;
        for (int d = 0; d < a.ranks; ++d) {
          const std::int32_t row = a.token_rows[t * a.ranks + d];
          if (row >= 0) sum += bf16_to_float(a.rows[std::int64_t(row) * a.hidden + h]);
        }
        a.out[t * a.hidden + h] = float_to_bf16(sum);
      }
    }
  });
}

}  // namespace moekit::cpu
