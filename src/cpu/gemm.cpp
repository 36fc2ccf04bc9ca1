#include "cpu/gemm.h"

#include <algorithm>

#include "core/parallel.h"
#include "moekit/quant.h"

namespace moekit::cpu {
namespace {

constexpr std::int64_t kTileN = 64;

// Decodes values[begin, begin + n) of a row to f32 (without scales).
void decode(const void* values, bool fp8, std::int64_t begin, std::int64_t n, float* out) {
  if (fp8) {
    const float* table = fp8_decode_table();
    const auto* q = static_cast<const std::uint8_t*>(values) + begin;
    for (std::int64_t i = 0; i < n; ++i) out[i] = table[q[i]];
  } else {
    const auto* q = static_cast<const bf16*>(values) + begin;
    for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(q[i]);
  }
}

// sum_{i < n} a[i] * w[i], w being fp8 codes or bf16, ascending i.
float dot_chunk(const float* a, const void* w, bool fp8, std::int64_t n) {
  float p = 0.0f;
  if (fp8) {
    const float* table = fp8_decode_table();
    const auto* q = static_cast<const std::uint8_t*>(w);
    for (std::int64_t i = 0; i < n; ++i) p += a[i] * table[q[i]];
  } else {
    const auto* q = static_cast<const bf16*>(w);
    for (std::int64_t i = 0; i < n; ++i) p += a[i] * bf16_to_float(q[i]);
  }
  return p;
}

// dot_chunk for four rows of W, row_bytes apart: four independent sums the CPU overlaps, each
// the same sum, in the same order, as dot_chunk of that row alone.
void dot_chunk4(const float* a, const std::byte* w, std::int64_t row_bytes, bool fp8, std::int64_t n, float* out) {
  float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
  if (fp8) {
    const float* table = fp8_decode_table();
    const auto* q = reinterpret_cast<const std::uint8_t*>(w);
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = a[i];
      p0 += x * table[q[i]];
      p1 += x * table[q[row_bytes + i]];
      p2 += x * table[q[2 * row_bytes + i]];
      p3 += x * table[q[3 * row_bytes + i]];
    }
  } else {
    const auto* q = reinterpret_cast<const bf16*>(w);
    const std::int64_t row = row_bytes / std::int64_t(sizeof(bf16));
    for (std::int64_t i = 0; i < n; ++i) {
      const float x = a[i];
      p0 += x * bf16_to_float(q[i]);
      p1 += x * bf16_to_float(q[row + i]);
      p2 += x * bf16_to_float(q[2 * row + i]);
      p3 += x * bf16_to_float(q[3 * row + i]);
    }
  }
  out[0] = p0, out[1] = p1, out[2] = p2, out[3] = p3;
}

}  // namespace

ExpertMatrix expert_matrix(const TensorView& weights, const TensorView& scales, QuantScheme scheme,
                           std::int64_t expert) {
  ExpertMatrix m;
  m.n = weights.size(1);
  m.k = weights.size(2);
  m.values = static_cast<const std::byte*>(weights.data) +
             expert * m.n * m.k * std::int64_t(dtype_size(weights.dtype));
  switch (scheme) {
    case QuantScheme::bf16: break;
    case QuantScheme::fp8_tensor: m.scales = scales.ptr<float>() + expert; break;
    case QuantScheme::fp8_rowwise: m.scales = scales.ptr<float>() + expert * m.n; break;
    case QuantScheme::fp8_block:
      m.scales = scales.ptr<float>() + expert * ceil_div(m.n, kBlock) * ceil_div(m.k, kBlock);
      break;
  }
  return m;
}

ActivationRow activation_row(const QuantizedRows& rows, QuantScheme scheme, std::int64_t row) {
  const std::int64_t k = rows.q.size(1);
  ActivationRow a;
  a.values = static_cast<const std::byte*>(rows.q.data) + row * k * std::int64_t(dtype_size(rows.q.dtype));
  switch (scheme) {
    case QuantScheme::bf16: break;
    case QuantScheme::fp8_tensor: a.scales = rows.scales.ptr<float>(); break;
    case QuantScheme::fp8_rowwise: a.scales = rows.scales.ptr<float>() + row; break;
    case QuantScheme::fp8_block: a.scales = rows.scales.ptr<float>() + row * ceil_div(k, kBlock); break;
  }
  return a;
}

void gemm_row(QuantScheme scheme, const ActivationRow& a, const ExpertMatrix& w, std::int64_t n0,
              std::int64_t n1, bf16* out) {
  const bool fp8 = scheme != QuantScheme::bf16;
  const std::int64_t k_blocks = ceil_div(w.k, kBlock);
  for (std::int64_t tile = n0; tile < n1; tile += kTileN) {
    const std::int64_t tile_end = std::min(n1, tile + kTileN);
    float acc[kTileN] = {};
    float a_chunk[kBlock];
    for (std::int64_t kb = 0; kb < k_blocks; ++kb) {
      const std::int64_t k0 = kb * kBlock;
      const std::int64_t len = std::min(kBlock, w.k - k0);
      decode(a.values, fp8, k0, len, a_chunk);
      const std::int64_t row_bytes = w.k * std::int64_t(fp8 ? 1 : 2);
      float sums[kTileN];
      for (std::int64_t n = tile; n < tile_end; n += 4) {
        const std::byte* w_row = static_cast<const std::byte*>(w.values) + n * row_bytes + k0 * (fp8 ? 1 : 2);
        if (n + 4 <= tile_end) dot_chunk4(a_chunk, w_row, row_bytes, fp8, len, sums + (n - tile));
        else
          for (std::int64_t r = n; r < tile_end; ++r)
            sums[r - tile] = dot_chunk(a_chunk, w_row + (r - n) * row_bytes, fp8, len);
      }
      for (std::int64_t n = tile; n < tile_end; ++n) {
        const float p = sums[n - tile];
        if (scheme == QuantScheme::fp8_block)
          acc[n - tile] += (a.scales[kb] * w.scales[(n / kBlock) * k_blocks + kb]) * p;
        else
          acc[n - tile] += p;
      }
    }
    for (std::int64_t n = tile; n < tile_end; ++n) {
      float v = acc[n - tile];
      if (scheme == QuantScheme::fp8_tensor) v = v * a.scales[0] * w.scales[0];
      if (scheme == QuantScheme::fp8_rowwise) v = v * a.scales[0] * w.scales[n];
      out[n] = float_to_bf16(v);
    }
  }
}

void grouped_gemm(const GroupedGemmArgs& args) {
  const std::int64_t rows = args.a.q.size(0);
  const std::int64_t n = args.weights.size(1);
  // Split N too, so that a handful of rows (decode) still spreads over the threads.
  constexpr std::int64_t kSplitN = 256;
  const std::int64_t n_parts = ceil_div(n, kSplitN);
  core::parallel_for(rows * n_parts, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t task = begin; task < end; ++task) {
      const std::int64_t m = task / n_parts;
      const std::int64_t n0 = (task % n_parts) * kSplitN;
      // The expert owning row m: the last e with offsets[e] <= m.
      std::int64_t e = 0;
      while (args.offsets[e + 1] <= m) ++e;
      const ExpertMatrix w = expert_matrix(args.weights, args.weight_scales, args.scheme, e);
      gemm_row(args.scheme, activation_row(args.a, args.scheme, m), w, n0, std::min(n, n0 + kSplitN),
               args.out + m * n);
    }
  });
}

}  // namespace moekit::cpu
