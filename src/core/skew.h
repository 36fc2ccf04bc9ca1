// Skewed routing for benchmarks and layer files: a fixed per-expert bias added to generated
// router logits before routing, so that a few experts hold most rows and many hold none, for
// every routing method alike (each sees only the biased logits). And the load a routing puts on
// its experts, to show what a skew did.
//
//   none        no bias (the logits are left untouched, bit for bit)
//   zipf:ALPHA  bias_e = -ALPHA * ln(rank_e + 1): expert of rank 0 unbiased, rank r by -ALPHA ln(r+1)
//   hot:N:B     the N experts of rank < N get +B, the others 0
//
// rank_e is a permutation of the experts drawn from the seed, so the hot experts are spread over
// the expert ids (and DeepSeek-V3's expert groups) instead of being experts 0..N-1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/tensor.h"

namespace moekit::core {

enum class SkewKind : std::uint8_t { none, zipf, hot };

struct RouterSkew {
  SkewKind kind = SkewKind::none;
  double alpha = 0.0;       // zipf: in [0, 100]
  std::int64_t hot = 0;     // hot: N, in [1, E] (E checked by router_skew_bias)
  double boost = 0.0;       // hot: B, in [-100, 100]
  std::string to_string() const;  // the spec again: "none", "zipf:1.2", "hot:8:4"
};

// Parses none | zipf:ALPHA | hot:N:B; throws Error naming `argument` and the expected forms.
RouterSkew parse_router_skew(std::string_view text, std::string_view argument = "skew");

// rank_e for e in [0, E): a permutation of 0..E-1, a pure function of (E, seed).
std::vector<std::int64_t> skew_ranks(std::int64_t experts, std::uint64_t seed);

// The bias of each expert, [E]; empty for none. Throws Error naming `argument` when hot's N > E.
std::vector<float> router_skew_bias(const RouterSkew& skew, std::int64_t experts, std::uint64_t seed,
                                    std::string_view argument = "skew");

// logits [T, E] f32 or bf16 (host) += bias [E] per row; an empty bias leaves them untouched.
void add_router_bias(const TensorView& logits, const std::vector<float>& bias);

// How a routing's rows fall on the experts [0, E): ids outside (-1: dropped) are not counted.
struct RoutingLoad {
  std::int64_t experts = 0;         // E
  std::int64_t rows = 0;            // (token, expert) pairs counted
  std::int64_t busiest = 0;         // rows of the busiest expert
  std::int64_t busiest_expert = -1;  // the first such expert; -1 without rows
  std::int64_t empty = 0;           // experts without a row
  double mean() const { return experts > 0 ? double(rows) / double(experts) : 0.0; }
  // "E=256 rows=32768 busiest=2302 (expert 17, 18.0x the mean 128.0) empty=44"
  std::string to_string() const;
};

// topk_ids [T, k] i32 (host).
RoutingLoad routing_load(const TensorView& topk_ids, std::int64_t experts);

}  // namespace moekit::core
