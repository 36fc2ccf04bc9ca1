#include "core/rows.h"

#include "moekit/quant.h"

namespace moekit {

std::vector<std::int64_t> scale_shape(QuantScheme scheme, std::int64_t rows, std::int64_t cols) {
  switch (scheme) {
    case QuantScheme::bf16: return {};
    case QuantScheme::fp8_tensor: return {1};
    case QuantScheme::fp8_rowwise: return {rows};
    case QuantScheme::fp8_block: return {rows, ceil_div(cols, kBlock)};
  }
  return {};
}

}  // namespace moekit
