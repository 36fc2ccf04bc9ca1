// How the permuted rows of the local experts are laid out: what permute writes, and what
// the GEMMs, the activation and finalize read. Host-only (C++17), no CUDA types.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "moekit/error.h"

namespace moekit::cuda {

// Where an expert's fp8-block activation scales go.
//   k_major              [rows, ceil(K/128)], the public layout (DESIGN §4).
//   mn_major_per_expert  for expert e with padded rows Mp_e starting at padded row o_e, a
//                        [ceil(K/128), Mp_e] block starting at float o_e * ceil(K/128): what a
//                        TMA-fed grouped GEMM loads (M contiguous per K block).
enum class ScaleLayout : std::uint8_t { k_major, mn_major_per_expert };

//   contiguous  rows grouped by expert, each expert padded up to `alignment` rows (DESIGN §6)
//   masked      [E_local, capacity] rows, expert e's tokens in its first counts[e] rows
enum class RowFormat : std::uint8_t { contiguous, masked };

std::string_view to_string(ScaleLayout v);
std::string_view to_string(RowFormat v);

struct ExpertRows {
  RowFormat format = RowFormat::contiguous;
  std::int64_t experts = 0;    // E_local
  std::int64_t alignment = 1;  // rows of an expert are padded (zero rows) up to a multiple of this
  std::int64_t capacity = 0;   // masked only: rows per expert; slots beyond are dropped

  // Rows a buffer must hold for `slots` token-expert pairs, whatever the routing:
  //   contiguous  slots + min(E_local, slots) * (alignment - 1)     masked  E_local * capacity
  std::int64_t max_rows(std::int64_t slots) const;
  Status check() const;
  std::string to_string() const;
};

// The plan on the device, as permute writes it (int32: rows stay below 2^31).
struct RowPlan {
  const std::int32_t* offsets = nullptr;  // [E_local + 1] contiguous: first padded row of each expert,
                                          //   offsets[E_local] = padded rows in use; unused for masked
  const std::int32_t* counts = nullptr;   // [E_local] rows holding a token (masked: at most capacity)
  // Optional, contiguous: [max_rows] the local expert of each row, padding included, -1 past the
  // rows in use (the permutation plan's row_expert). Given, a kernel finds a row's expert with one
  // load instead of a search over the offsets (8 dependent loads for 256 experts, and a walk past
  // each expert without rows: most of them at decode sizes).
  const std::int32_t* row_expert = nullptr;
};

}  // namespace moekit::cuda
