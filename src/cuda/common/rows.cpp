#include "cuda/common/rows.h"

#include <algorithm>
#include <limits>

namespace moekit::cuda {

std::string_view to_string(ScaleLayout v) {
  return v == ScaleLayout::k_major ? "k_major" : "mn_major_per_expert";
}

std::string_view to_string(RowFormat v) { return v == RowFormat::contiguous ? "contiguous" : "masked"; }

std::int64_t ExpertRows::max_rows(std::int64_t slots) const {
  if (format == RowFormat::masked) return experts * capacity;
  return slots + std::min(experts, slots) * (alignment - 1);
}

Status ExpertRows::check() const {
  if (experts < 1) return Status::no("experts: expected E_local >= 1, given " + std::to_string(experts));
  if (alignment < 1 || alignment > 4096)
    return Status::no("alignment: expected 1..4096 rows, given " + std::to_string(alignment));
  if (format == RowFormat::masked && capacity < 1)
    return Status::no("capacity: the masked format needs capacity >= 1, given " + std::to_string(capacity));
  return Status::ok();
}

std::string ExpertRows::to_string() const {
  std::string s = std::string(cuda::to_string(format)) + " E_local=" + std::to_string(experts) +
                  " alignment=" + std::to_string(alignment);
  if (format == RowFormat::masked) s += " capacity=" + std::to_string(capacity);
  return s;
}

}  // namespace moekit::cuda
