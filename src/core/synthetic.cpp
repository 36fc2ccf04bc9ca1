#include "core/synthetic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "core/shared.h"
#include "cpu/quant.h"
#include "moekit/quant.h"

namespace moekit::core {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

std::uint64_t hash(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return mix64(mix64(seed ^ (stream * 0xd1342543de82ef95ull)) ^ index);
}

// Uniform in [0, 1) from 24 bits.
double unit(std::uint64_t h) { return double(h >> 40) * (1.0 / 16777216.0); }

double normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const double u1 = unit(hash(seed, stream, 2 * index)) + 1.0 / 33554432.0;
  const double u2 = unit(hash(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

enum Stream : std::uint64_t { kW13 = 1, kW2 = 2, kRowGain = 3, kHidden = 4, kLogits = 5, kBias = 6 };

struct MatrixShape {
  std::int64_t n, k;
};

MatrixShape shape_of(const MoEConfig& c, Projection p) {
  return p == Projection::w13 ? MatrixShape{c.gemm1_width(), c.hidden_size}
                              : MatrixShape{c.hidden_size, c.intermediate_size};
}

// Row n of a projection: uniform values with std 1/sqrt(K) times a per-row gain in
// [0.5, 1.5], so that row and block scales differ the way trained weights' do.
struct MasterRow {
  std::uint64_t stream, first_index;
  double half_width;
  std::int64_t k;

  MasterRow(std::uint64_t seed, Projection p, const MoEConfig& c, std::int64_t global_expert, std::int64_t n) {
    const MatrixShape s = shape_of(c, p);
    stream = p == Projection::w13 ? kW13 : kW2;
    const std::uint64_t row = std::uint64_t(global_expert * s.n + n);
    const double gain = 0.5 + unit(hash(seed, kRowGain + 16 * stream, row));
    half_width = std::sqrt(3.0 / double(s.k)) * gain;
    first_index = row * std::uint64_t(s.k);
    k = s.k;
  }
  template <class T>
  void fill(std::uint64_t seed, T* out) const {
    const std::uint64_t key = mix64(seed ^ (stream * 0xd1342543de82ef95ull));
    for (std::int64_t i = 0; i < k; ++i)
      out[i] = T((2.0 * unit(mix64(key ^ (first_index + std::uint64_t(i)))) - 1.0) * half_width);
  }
};

void master_rows(std::uint64_t seed, Projection p, const MoEConfig& c, std::int64_t global_expert,
                 std::int64_t n0, std::int64_t rows, float* out) {
  const std::int64_t k = shape_of(c, p).k;
  for (std::int64_t r = 0; r < rows; ++r) MasterRow(seed, p, c, global_expert, n0 + r).fill(seed, out + r * k);
}

// Fills values [E_local + S, N, K] and scales of one projection, a band of rows at a time.
void quantize_projection(const MoEConfig& c, std::uint64_t seed, Projection p, Tensor& values,
                         Tensor& scales) {
  const MatrixShape s = shape_of(c, p);
  const QuantScheme scheme = c.quant.scheme;
  const ScaleFormat format = c.quant.scale_format;
  const std::int64_t band = scheme == QuantScheme::fp8_block ? kBlock : 1;
  const std::int64_t bands = ceil_div(s.n, band);
  const std::int64_t experts = c.weight_experts();
  if (scheme == QuantScheme::fp8_tensor) {
    // One scale per expert: its amax comes first, from a pass of its own.
    parallel_for(experts, 1, [&](std::int64_t b, std::int64_t e) {
      std::vector<float> row(std::size_t(s.k));
      for (std::int64_t x = b; x < e; ++x) {
        float m = 0.0f;
        for (std::int64_t n = 0; n < s.n; ++n) {
          master_rows(seed, p, c, weight_owner(c, x), n, 1, row.data());
          m = std::max(m, cpu::amax(row.data(), s.k));
        }
        scales.ptr<float>()[x] = fp8_scale(m, format);
      }
    });
  }
  parallel_for(experts * bands, 1, [&](std::int64_t b, std::int64_t e) {
    std::vector<float> buf(std::size_t(band * s.k));
    for (std::int64_t task = b; task < e; ++task) {
      const std::int64_t x = task / bands, n0 = (task % bands) * band;
      const std::int64_t rows = std::min(band, s.n - n0);
      master_rows(seed, p, c, weight_owner(c, x), n0, rows, buf.data());
      const std::int64_t offset = (x * s.n + n0) * s.k;
      if (scheme == QuantScheme::bf16) {
        for (std::int64_t i = 0; i < rows * s.k; ++i) values.ptr<bf16>()[offset + i] = float_to_bf16(buf[std::size_t(i)]);
        continue;
      }
      std::uint8_t* q = values.ptr<std::uint8_t>() + offset;
      if (scheme == QuantScheme::fp8_tensor) {
        cpu::quantize_with_scale(buf.data(), rows * s.k, scales.ptr<float>()[x], q);
      } else if (scheme == QuantScheme::fp8_rowwise) {
        const float scale = fp8_scale(cpu::amax(buf.data(), s.k), format);
        scales.ptr<float>()[x * s.n + n0] = scale;
        cpu::quantize_with_scale(buf.data(), s.k, scale, q);
      } else {
        const std::int64_t kbs = ceil_div(s.k, kBlock);
        for (std::int64_t kb = 0; kb < kbs; ++kb) {
          const std::int64_t k0 = kb * kBlock, len = std::min(kBlock, s.k - k0);
          float m = 0.0f;
          for (std::int64_t r = 0; r < rows; ++r) m = std::max(m, cpu::amax(buf.data() + r * s.k + k0, len));
          const float scale = fp8_scale(m, format);
          scales.ptr<float>()[(x * bands + n0 / kBlock) * kbs + kb] = scale;
          for (std::int64_t r = 0; r < rows; ++r)
            cpu::quantize_with_scale(buf.data() + r * s.k + k0, len, scale, q + r * s.k + k0);
        }
      }
    }
  });
}

Tensor make_scales(const MoEConfig& c, Projection p) {
  const MatrixShape s = shape_of(c, p);
  const std::int64_t el = c.weight_experts();
  switch (c.quant.scheme) {
    case QuantScheme::bf16: return Tensor();
    case QuantScheme::fp8_tensor: return Tensor(DType::f32, {el});
    case QuantScheme::fp8_rowwise: return Tensor(DType::f32, {el, s.n});
    case QuantScheme::fp8_block: return Tensor(DType::f32, {el, ceil_div(s.n, kBlock), ceil_div(s.k, kBlock)});
  }
  return Tensor();
}

}  // namespace

SyntheticLayer make_synthetic_layer(const MoEConfig& c, std::uint64_t seed) {
  validate(c);
  SyntheticLayer layer;
  layer.config = c;
  layer.seed = seed;
  const DType dtype = c.quant.scheme == QuantScheme::bf16 ? DType::bf16 : DType::fp8_e4m3;
  const std::int64_t el = c.weight_experts();  // the shared experts follow the routed ones
  // Checked products (tensor.h): a config of valid sizes can still ask for more than int64 holds.
  layer.w13 = Tensor(dtype, {el, c.gemm1_width(), c.hidden_size}, "synthetic w13 [E_local, 2I, H]");
  layer.w2 = Tensor(dtype, {el, c.hidden_size, c.intermediate_size}, "synthetic w2 [E_local, H, I]");
  layer.w13_scale = make_scales(c, Projection::w13);
  layer.w2_scale = make_scales(c, Projection::w2);
  quantize_projection(c, seed, Projection::w13, layer.w13, layer.w13_scale);
  quantize_projection(c, seed, Projection::w2, layer.w2, layer.w2_scale);
  if (c.routing.uses_bias()) {
    layer.e_score_correction_bias = Tensor(DType::f32, {c.num_experts});
    for (std::int64_t e = 0; e < c.num_experts; ++e)
      layer.e_score_correction_bias.ptr<float>()[e] = float(0.1 * normal(seed, kBias, std::uint64_t(e)));
  }
  return layer;
}

Tensor make_hidden(std::int64_t tokens, std::int64_t hidden_size, std::uint64_t seed) {
  Tensor t(DType::bf16, {tokens, hidden_size});
  parallel_for(tokens * hidden_size, 1 << 14, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) t.ptr<bf16>()[i] = float_to_bf16(float(normal(seed, kHidden, std::uint64_t(i))));
  });
  return t;
}

Tensor make_router_logits(std::int64_t tokens, std::int64_t experts, DType dtype, std::uint64_t seed) {
  Tensor t(dtype, {tokens, experts});
  for (std::int64_t i = 0; i < tokens * experts; ++i) {
    const float v = float(normal(seed, kLogits, std::uint64_t(i)));
    if (dtype == DType::bf16) t.ptr<bf16>()[i] = float_to_bf16(v);
    else t.ptr<float>()[i] = v;
  }
  return t;
}

void SyntheticMaster::row(Projection which, std::int64_t local_expert, std::int64_t n, double* out) const {
  MasterRow(seed_, which, config_, weight_owner(config_, local_expert), n).fill(seed_, out);
}

}  // namespace moekit::core
