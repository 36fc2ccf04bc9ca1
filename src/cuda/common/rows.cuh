// Device side of ExpertRows: which expert a permuted row belongs to, and whether it holds a
// token, is padding (to be zero-filled) or lies past the rows in use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/rows.h"

namespace moekit::cuda {

struct RowsParams {
  RowFormat format;
  int experts;    // E_local
  int alignment;
  int capacity;   // masked
  const std::int32_t* offsets;     // [E_local + 1] contiguous
  const std::int32_t* counts;      // [E_local]
  const std::int32_t* row_expert;  // optional, contiguous (RowPlan::row_expert)
};

inline RowsParams rows_params(const ExpertRows& rows, const RowPlan& plan) {
  return {rows.format, int(rows.experts), int(rows.alignment), int(rows.capacity), plan.offsets, plan.counts, plan.row_expert};
}

enum class RowKind : std::uint8_t { token, padding, unused };

struct RowInfo {
  RowKind kind;
  int expert;
  int index;  // row within the expert
  int base;   // first row of the expert's block (o_e, or e * capacity)
  int span;   // rows of the expert's block (Mp_e, or capacity): the M extent of its scales
};

__device__ __forceinline__ int round_up(int x, int m) { return (x + m - 1) / m * m; }

__device__ __forceinline__ RowInfo locate_row(const RowsParams& p, int row) {
  RowInfo info{RowKind::unused, 0, 0, 0, 0};
  if (p.format == RowFormat::masked) {
    const int e = row / p.capacity;
    if (e >= p.experts) return info;
    const int j = row - e * p.capacity;
    const int count = __ldg(p.counts + e);
    info = {RowKind::unused, e, j, e * p.capacity, p.capacity};
    if (j < count) info.kind = RowKind::token;
    else if (j < min(round_up(count, p.alignment), p.capacity)) info.kind = RowKind::padding;
    return info;
  }
  int lo = 0;  // the last expert whose first row is <= row (experts without rows share their start)
  if (p.row_expert) {
    lo = __ldg(p.row_expert + row);
    if (lo < 0) return info;
  } else {
    if (row >= __ldg(p.offsets + p.experts)) return info;
    int hi = p.experts;  // offsets[lo] <= row < offsets[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (__ldg(p.offsets + mid) <= row) lo = mid;
      else hi = mid;
    }
  }
  const int base = __ldg(p.offsets + lo);
  info = {RowKind::padding, lo, row - base, base, __ldg(p.offsets + lo + 1) - base};
  if (info.index < __ldg(p.counts + lo)) info.kind = RowKind::token;
  return info;
}

// Float index of scale group g (of `groups` per row) of a row.
__device__ __forceinline__ std::int64_t scale_index(ScaleLayout layout, const RowInfo& info, int row, int g,
                                                    int groups) {
  if (layout == ScaleLayout::k_major) return std::int64_t(row) * groups + g;
  return std::int64_t(info.base) * groups + std::int64_t(g) * info.span + info.index;
}

}  // namespace moekit::cuda
