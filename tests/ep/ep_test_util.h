// Shared by the EP tests, which run as N MPI ranks (mpirun -np N): every rank runs every
// test, in the same order, so each test makes the same collective calls on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/comm.h"
#include "test_util.h"

namespace moekit::test {

// The communicator over all ranks of the run (set by ep_main.cpp).
Communicator& world();

// A fresh seed drawn by rank 0 and shared, so that every rank generates the same data.
inline std::uint64_t shared_seed() {
  std::uint64_t seed = fresh_seed();
  world().broadcast(&seed, sizeof seed, 0, nullptr);
  return seed;
}

// counts[r] tokens on rank r; the first token of each rank in the global batch.
inline std::vector<std::int64_t> first_tokens(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> first(counts.size() + 1, 0);
  for (std::size_t r = 0; r < counts.size(); ++r) first[r + 1] = first[r] + counts[r];
  return first;
}

// Rows [begin, begin + rows) of a contiguous [N, C] tensor, as a view.
inline TensorView rows_of(const TensorView& t, std::int64_t begin, std::int64_t rows) {
  const std::int64_t cols = t.size(1);
  return TensorView::contiguous(static_cast<std::byte*>(t.data) + std::size_t(begin * cols) * dtype_size(t.dtype),
                                t.dtype, {rows, cols}, t.device);
}

}  // namespace moekit::test
