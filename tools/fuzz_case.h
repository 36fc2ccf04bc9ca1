// `moekit fuzz` (issue #19): one problem of the differential campaign, drawn from a seed.
// A case is a pure function of (seed, target): `moekit fuzz --replay SEED --backend B` draws it
// again. Most cases are valid problems the target backend can run; a few break one argument on
// purpose and must be refused by name.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/tensor.h"

namespace moekit::cli::fuzz {

// splitmix64: a case's whole draw is one stream of it, the same on every platform (the standard
// distributions are not).
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Draw {
 public:
  explicit Draw(std::uint64_t seed) : state_(mix(seed)) {}
  std::uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ull); }
  double unit() { return double(next() >> 11) * 0x1p-53; }  // [0, 1)
  bool chance(double p) { return unit() < p; }
  std::int64_t between(std::int64_t lo, std::int64_t hi) {  // [lo, hi]
    return lo + std::int64_t(next() % std::uint64_t(hi - lo + 1));
  }
  template <class T>
  T pick(std::initializer_list<T> list) {
    return *(list.begin() + between(0, std::int64_t(list.size()) - 1));
  }
  template <class T>
  T pick(const std::vector<T>& list) {
    return list[std::size_t(between(0, std::int64_t(list.size()) - 1))];
  }

 private:
  std::uint64_t state_;
};

// What the backend under test runs, so that only problems it takes are drawn as valid.
struct Target {
  std::string backend;       // "cpu" or "cuda"
  bool gemm_sizes_of_16 = false;  // H and I multiples of 16 (the CUDA grouped GEMMs)
  bool min_latency = false;       // has the min-latency experts path
  static Target of(std::string_view backend);
};

// How the router logits look (fused routing, and the routed ids of external routing).
//   normal N(0, 1) | wide: times 5..50 (saturated sigmoids) | ties: rounded to 1/4 |
//   nonfinite: NaN, +Inf, -Inf sprinkled, one token all NaN, one all -Inf | one_expert: one
//   expert +30 above the rest for every token.
enum class Logits : std::uint8_t { normal, wide, ties, nonfinite, one_expert };
// External routing's ids: the CPU router's | some slots -1 (weight NaN: never read) | every
// slot on one expert | uniform in [-1, E) with uniform weights.
enum class Ids : std::uint8_t { routed, some_none, one_expert, random };
// The hidden states: N(0, 1) times hidden_scale | with zero rows | a few elements of 1e3..1e4.
enum class Hidden : std::uint8_t { normal, zero_rows, outliers };

// An argument broken on purpose; `argument` is the name the error must start with.
enum class Breaks : std::uint8_t {
  nothing,
  top_k,                  // config: top_k > E
  n_group,                // config: n_group not a divisor of E
  topk_group,             // config: topk_group > n_group
  block_intermediate,     // config: fp8-block with I % 128 != 0
  ep_size,                // config: ep_size not a divisor of E
  ep_rank,                // config: ep_rank == ep_size
  bf16_scale_format,      // config: ue8m0 with bf16
  bf16_accumulation,      // config: exact accumulation with bf16
  invariant_fp8_tensor,   // config: batch_invariant with fp8-tensor
  top1_k,                 // config: top1_sigmoid with k = 2
  scaling_factor,         // config: routed_scaling_factor 0
  hidden_size,            // config: H = 0
  w13_shape,              // weights: w13 for another H
  w2_scale,               // weights: fp8 without w2_scale
  bias,                   // weights: a *_bias_* method without e_score_correction_bias
  input_scale,            // weights: fp8-tensor static w13_input_scale 0
  hidden_shape,           // args: hidden [T, H + 1]
  hidden_dtype,           // args: hidden f32
  logits_shape,           // args (fused): router_logits [T, E + 1]
  out_shape,              // args: out [T + 1, H]
  ids_shape,              // args (external): topk_ids [T, k + 1]
  weights_dtype,          // args (external): topk_weights bf16
  one_routing_output,     // args (fused): topk_ids without topk_weights
  external_fused,         // args: a fused call on a layer whose method is external
};
std::string_view to_string(Breaks b);
// The argument the refusal's message must begin with ("top_k", "hidden", ...).
std::string_view argument_of(Breaks b);

struct Case {
  std::uint64_t seed = 0;
  MoEConfig config;  // valid (a broken config is made from it at run time)
  bool fused = true;
  DType logits_dtype = DType::f32;
  std::int64_t tokens = 0;
  Logits logits = Logits::normal;
  Ids ids = Ids::routed;
  Hidden hidden = Hidden::normal;
  double hidden_scale = 1.0;   // |x| up to ~4e4 (outliers: 1e4)
  int weight_exponent = 0;     // real weights times 2^weight_exponent (FP8: their scales)
  bool static_scales = false;  // fp8-tensor: static activation scales
  bool larger_call_first = false;  // the layer runs a batch of 2T + 5 tokens (its first T these) first
  Breaks breaks = Breaks::nothing;

  bool valid() const { return breaks == Breaks::nothing; }
  // "T=37 fused logits=f32:nonfinite hidden=zero_rows*1e+00 weights*2^-3 | E=64 k=6 ..."
  std::string to_string() const;
};

// Case `index` of the campaign of `seed`: its own seed, below 2^62 (a --replay argument).
std::uint64_t case_seed(std::uint64_t seed, std::int64_t index);

Case draw_case(std::uint64_t seed, const Target& target);

}  // namespace moekit::cli::fuzz
