// The masked format (MaskedArgs) in the Layer tests: blocks of C rows per local expert with a
// count each, NaN past the counts (never to be read), and what each row must get: the layer's
// output for that row routed to its expert alone with weight 1, which is the expert's output
// itself (finalize multiplies one bf16 value by 1 and rounds it back).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/layer_util.h"
#include "cpu/quant.h"

namespace moekit::test {

struct MaskedCase {
  std::string name;
  LayerCase layer;                    // the config (its routing is not used) and the synthetic weights
  std::int64_t capacity = 16;         // C
  std::vector<std::int32_t> counts;   // per local expert; outside [0, C] is clamped
  bool fp8_input = false;             // fp8 rows with their scales (fp8-block), else bf16 rows
  bool scales_mn_major = false;       // fp8 input: scales with C contiguous (DeepEP's layout)
  std::int64_t expected_rows = 0;
};
inline void PrintTo(const MaskedCase& c, std::ostream* os) { *os << c.name; }

inline std::int64_t clamped(const MaskedCase& c, std::size_t e) {
  return std::clamp<std::int64_t>(c.counts[e], 0, c.capacity);
}

struct MaskedInputs {
  Tensor hidden;        // [E_local, C, H] bf16, NaN past the counts
  Tensor q, scales;     // fp8 input: [E_local, C, H] codes (NaN past the counts) and their scales,
                        //   [E_local, C, kb] or, C contiguous, stored as [E_local, kb, C]
  Tensor counts;        // [E_local] i32
  Tensor rows;          // [R, H] bf16: the rows below the counts, block after block
  Routing routing;      // [R, k]: each row to its block's expert with weight 1
};

inline MaskedInputs make_masked_inputs(const MaskedCase& c, std::uint64_t seed) {
  const MoEConfig config = config_of(c.layer);
  const std::int64_t el = config.local_experts(), cap = c.capacity, h = config.hidden_size, k = config.top_k();
  const std::int64_t kb = ceil_div(h, kBlock);
  MaskedInputs in;
  const Tensor dense = core::make_hidden(el * cap, h, seed + 1);
  in.hidden = Tensor(DType::bf16, {el, cap, h});
  in.counts = Tensor(DType::i32, {el});
  std::int64_t total = 0;
  for (std::size_t e = 0; e < std::size_t(el); ++e) {
    in.counts.ptr<std::int32_t>()[e] = c.counts[e];
    total += clamped(c, e);
  }
  in.rows = Tensor(DType::bf16, {total, h});
  in.routing = {Tensor(DType::i32, {total, k}), Tensor(DType::f32, {total, k})};
  const bf16 nan = float_to_bf16(NAN);
  std::int64_t r = 0;
  for (std::int64_t e = 0; e < el; ++e)
    for (std::int64_t j = 0; j < cap; ++j) {
      const bf16* src = dense.ptr<bf16>() + (e * cap + j) * h;
      bf16* dst = in.hidden.ptr<bf16>() + (e * cap + j) * h;
      if (j >= clamped(c, std::size_t(e))) {
        std::fill(dst, dst + h, nan);
        continue;
      }
      std::copy(src, src + h, dst);
      std::copy(src, src + h, in.rows.ptr<bf16>() + r * h);
      for (std::int64_t s = 0; s < k; ++s) {
        in.routing.ids.ptr<std::int32_t>()[r * k + s] = s == 0 ? std::int32_t(config.first_local_expert() + e) : -1;
        in.routing.weights.ptr<float>()[r * k + s] = s == 0 ? 1.0f : 0.0f;
      }
      ++r;
    }
  if (!c.fp8_input) return in;
  // The codes and scales the layer's own quantization gives (cpu::quantize_rows), per row.
  std::vector<float> x(std::size_t(el * cap * h));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(in.hidden.ptr<bf16>()[i]);
  Tensor q(DType::fp8_e4m3, {el * cap, h}), s(DType::f32, {el * cap, kb});
  cpu::quantize_rows({config.quant, 0.0f}, x.data(), el * cap, h, {q.view(), s.view()});
  in.q = Tensor(DType::fp8_e4m3, {el, cap, h});
  std::copy(q.ptr<std::uint8_t>(), q.ptr<std::uint8_t>() + q.numel(), in.q.ptr<std::uint8_t>());
  in.scales = c.scales_mn_major ? Tensor(DType::f32, {el, kb, cap}) : Tensor(DType::f32, {el, cap, kb});
  for (std::int64_t e = 0; e < el; ++e)
    for (std::int64_t j = 0; j < cap; ++j)
      for (std::int64_t g = 0; g < kb; ++g) {
        const float v = j < clamped(c, std::size_t(e)) ? s.ptr<float>()[(e * cap + j) * kb + g] : NAN;
        in.scales.ptr<float>()[c.scales_mn_major ? (e * kb + g) * cap + j : (e * cap + j) * kb + g] = v;
      }
  for (std::int64_t e = 0; e < el; ++e)  // NaN codes past the counts
    std::fill(in.q.ptr<std::uint8_t>() + (e * cap + clamped(c, std::size_t(e))) * h,
              in.q.ptr<std::uint8_t>() + (e + 1) * cap * h, std::uint8_t(0x7f));
  return in;
}

// The view of the scales that MaskedArgs takes: [E_local, C, kb], in either stride order.
inline TensorView masked_scale_view(const MaskedCase& c, const TensorView& stored) {
  if (!c.scales_mn_major) return stored;
  TensorView v = stored;
  const std::int64_t el = stored.size(0), kb = stored.size(1), cap = stored.size(2);
  v.shape = {el, cap, kb};
  v.strides = {kb * cap, 1, cap};
  return v;
}

// The rows below the counts of a masked output [E_local, C, H], block after block, as [R, H];
// false (with a message) when a row past a count was written (it must keep its poison).
inline bool masked_rows(const MaskedCase& c, const Tensor& out, Tensor& rows, std::string& why) {
  const std::int64_t el = out.size(0), cap = out.size(1), h = out.size(2);
  std::int64_t total = 0;
  for (std::size_t e = 0; e < std::size_t(el); ++e) total += clamped(c, e);
  rows = Tensor(DType::bf16, {total, h});
  std::int64_t r = 0;
  for (std::int64_t e = 0; e < el; ++e)
    for (std::int64_t j = 0; j < cap; ++j) {
      const bf16* src = out.ptr<bf16>() + (e * cap + j) * h;
      if (j < clamped(c, std::size_t(e))) {
        std::copy(src, src + h, rows.ptr<bf16>() + r++ * h);
        continue;
      }
      for (std::int64_t i = 0; i < h; ++i)
        if (src[i].bits != 0xffff) {
          why = "expert " + std::to_string(e) + " row " + std::to_string(j) + " past its count was written";
          return false;
        }
    }
  return true;
}

// Counts that cover the edges: empty and full blocks, one row, and values the layer must clamp.
inline std::vector<std::int32_t> edge_counts(std::int64_t experts, std::int64_t capacity, std::uint64_t seed) {
  std::vector<std::int32_t> counts(static_cast<std::size_t>(experts));
  std::mt19937_64 rng(seed);
  for (std::size_t e = 0; e < counts.size(); ++e) {
    switch (e % 6) {
      case 0: counts[e] = 0; break;
      case 1: counts[e] = std::int32_t(capacity); break;
      case 2: counts[e] = 1; break;
      case 3: counts[e] = std::int32_t(capacity) + 5; break;  // clamped to C
      case 4: counts[e] = -3; break;                           // clamped to 0
      default: counts[e] = std::int32_t(rng() % std::uint64_t(capacity + 1)); break;
    }
  }
  return counts;
}

// A case of the table: counts from edge_counts(seed) for the layer's local experts.
inline MaskedCase masked_case(std::string name, const LayerCase& layer, std::int64_t capacity, bool fp8_input,
                              bool scales_mn_major, std::int64_t expected_rows, std::uint64_t seed) {
  MaskedCase m;
  m.name = std::move(name);
  m.layer = layer;
  m.capacity = capacity;
  m.counts = edge_counts(layer.ep_size > 1 ? layer.experts / layer.ep_size : layer.experts, capacity, seed);
  m.fp8_input = fp8_input;
  m.scales_mn_major = scales_mn_major;
  m.expected_rows = expected_rows;
  return m;
}

}  // namespace moekit::test
