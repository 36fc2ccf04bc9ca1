#include "cpu/finalize.h"

#include "core/parallel.h"

namespace moekit::cpu {

void finalize(const FinalizeArgs& a) {
  core::parallel_for(a.tokens, 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t h = 0; h < a.hidden; ++h) {
        float sum = 0.0f;
        for (int j = 0; j < a.top_k; ++j) {
          const std::int32_t row = a.slot_rows[t * a.top_k + j];
          if (row < 0) continue;
          const float weight = a.topk_weights ? a.topk_weights[t * a.top_k + j] : 1.0f;
          sum += weight * bf16_to_float(a.expert_out[std::int64_t(row) * a.hidden + h]);
        }
        a.out[t * a.hidden + h] = float_to_bf16(sum);
      }
    }
  });
}

}  // namespace moekit::cpu
