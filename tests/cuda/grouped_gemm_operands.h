// The grouped GEMM tests' operands (grouped_gemm_test.cu, grouped_gemm_fused_test.cu): random
// groups in the CPU GEMM's layouts, the same on the device as the layer's plan lays them out, and a
// CUDA graph's replays of a GEMM.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "cuda/gemm/grouped_gemm.h"
#include "cuda_test_util.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::test {

using cuda::GemmKind;
using cuda::GemmTile;

struct Shape {
  const char* name;
  std::vector<std::int64_t> rows;  // per group
  std::int64_t n, k;
};

inline QuantScheme scheme_of(GemmKind kind) {
  switch (kind) {
    case GemmKind::bf16: return QuantScheme::bf16;
    case GemmKind::fp8_block: return QuantScheme::fp8_block;
    case GemmKind::fp8_channel: return QuantScheme::fp8_rowwise;
  }
  return QuantScheme::bf16;
}

// Random codes/values and scales in the public layouts the CPU GEMM reads.
struct HostOperands {
  Tensor a, a_scales, w, w_scales;
  std::vector<std::int64_t> offsets;
};

inline HostOperands make_operands(GemmKind kind, const Shape& s, std::mt19937_64& rng) {
  HostOperands h;
  h.offsets = {0};
  for (std::int64_t r : s.rows) h.offsets.push_back(h.offsets.back() + r);
  const std::int64_t rows = h.offsets.back(), groups = std::int64_t(s.rows.size());
  const QuantScheme scheme = scheme_of(kind);
  const DType dtype = activation_dtype(scheme);
  h.a = Tensor(dtype, {rows, s.k});
  h.w = Tensor(dtype, {groups, s.n, s.k});
  std::uniform_real_distribution<float> value(-2.0f, 2.0f), scale(0.01f, 0.1f);
  auto fill = [&](Tensor& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      if (dtype == DType::bf16) t.ptr<bf16>()[i] = float_to_bf16(value(rng) * 0.1f);
      else t.ptr<std::uint8_t>()[i] = fp8_e4m3_encode(value(rng) * 100.0f);
    }
  };
  fill(h.a);
  fill(h.w);
  if (scheme == QuantScheme::fp8_block) {
    h.a_scales = Tensor(DType::f32, {rows, ceil_div(s.k, kBlock)});
    h.w_scales = Tensor(DType::f32, {groups, ceil_div(s.n, kBlock), ceil_div(s.k, kBlock)});
  } else if (scheme == QuantScheme::fp8_rowwise) {
    h.a_scales = Tensor(DType::f32, {rows});
    h.w_scales = Tensor(DType::f32, {groups, s.n});
  }
  for (Tensor* t : {&h.a_scales, &h.w_scales})
    if (t->defined())
      for (std::int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = scale(rng);
  return h;
}

// The device's scale layouts: MN-major per 128 of K (fp8_channel repeats its one scale).
inline std::vector<float> device_a_scales(GemmKind kind, const HostOperands& h, std::int64_t k) {
  const std::int64_t kb = ceil_div(k, kBlock);
  std::vector<float> out(std::size_t(h.offsets.back() * kb));
  for (std::size_t e = 0; e + 1 < h.offsets.size(); ++e) {
    const std::int64_t row0 = h.offsets[e], m = h.offsets[e + 1] - row0;
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t b = 0; b < kb; ++b)
        out[std::size_t(row0 * kb + b * m + r)] =
            kind == GemmKind::fp8_channel ? h.a_scales.ptr<float>()[row0 + r] : h.a_scales.ptr<float>()[(row0 + r) * kb + b];
  }
  return out;
}

inline std::vector<float> device_w_scales(GemmKind kind, const HostOperands& h, std::int64_t n, std::int64_t k) {
  const float* w = h.w_scales.ptr<float>();
  const std::int64_t groups = h.w_scales.size(0), kb = ceil_div(k, kBlock);
  const std::int64_t nb = kind == GemmKind::fp8_channel ? n : ceil_div(n, kBlock);
  std::vector<float> out(std::size_t(groups * kb * nb));
  for (std::int64_t e = 0; e < groups; ++e)
    for (std::int64_t j = 0; j < nb; ++j)
      for (std::int64_t b = 0; b < kb; ++b)
        out[std::size_t((e * kb + b) * nb + j)] = kind == GemmKind::fp8_channel ? w[e * n + j] : w[(e * nb + j) * kb + b];
  return out;
}

// How the rows of a group sit in A and D.
//   none      back to back, no counts given
//   aligned   each group padded to 16 rows, as the layer's contiguous plan pads them; counts given
//   masked    each group in a block of `capacity` rows (the masked format); counts given
// Padding rows carry NaN codes and scales, must not be read, and stay unwritten.
enum class Padding { none, aligned, masked };

// A, its scales and the offsets as the layer's plan lays them out: each group padded to
// `align` rows (1: none) or to `capacity` rows (> 0), NaN codes and scales in the padding rows.
struct DeviceLayout {
  std::vector<std::uint8_t> a;
  std::vector<float> a_scales;
  std::vector<std::int32_t> offsets, counts;
  std::vector<std::int64_t> source_row;  // per device row: the host row, -1 for padding
};

inline DeviceLayout device_layout(GemmKind kind, const HostOperands& h, std::int64_t k, std::int64_t align,
                           std::int64_t capacity) {
  DeviceLayout d;
  const std::size_t row_bytes = h.a.nbytes() / std::size_t(std::max<std::int64_t>(h.offsets.back(), 1));
  const std::int64_t kb = ceil_div(k, kBlock);
  const std::vector<float> unpadded = kind == GemmKind::bf16 ? std::vector<float>{} : device_a_scales(kind, h, k);
  d.offsets = {0};
  for (std::size_t e = 0; e + 1 < h.offsets.size(); ++e) {
    const std::int64_t row0 = h.offsets[e], m = h.offsets[e + 1] - row0;
    const std::int64_t mp = capacity > 0 ? capacity : ceil_div(m, align) * align;
    const std::int64_t at = d.offsets.back();
    d.counts.push_back(std::int32_t(m));
    d.offsets.push_back(std::int32_t(at + mp));
    for (std::int64_t r = 0; r < mp; ++r) {
      d.source_row.push_back(r < m ? row0 + r : -1);
      const std::uint8_t* src = h.a.ptr<std::uint8_t>() + std::size_t(row0 + r) * row_bytes;
      if (r < m) d.a.insert(d.a.end(), src, src + row_bytes);
      else d.a.insert(d.a.end(), row_bytes, std::uint8_t(0x7f));  // e4m3 NaN
    }
    if (unpadded.empty()) continue;
    d.a_scales.resize(std::size_t((at + mp) * kb), NAN);
    for (std::int64_t b = 0; b < kb; ++b)
      for (std::int64_t r = 0; r < m; ++r)
        d.a_scales[std::size_t(at * kb + b * mp + r)] = unpadded[std::size_t(row0 * kb + b * m + r)];
  }
  return d;
}

// fp8-block operands on the device in the layer's layout (each group padded to `align` rows, counts
// given), and the desc and args of a bf16-out GEMM over them.
struct BlockGemmOnDevice {
  BlockGemmOnDevice(const Shape& s, std::int64_t align, std::mt19937_64& rng)
      : h(make_operands(GemmKind::fp8_block, s, rng)),
        layout(device_layout(GemmKind::fp8_block, h, s.k, align, 0)),
        a(layout.a.size()),
        w(h.w.nbytes()),
        a_scales(padded(layout.a_scales)),
        w_scales(device_w_scales(GemmKind::fp8_block, h, s.n, s.k)),
        offsets(layout.offsets),
        counts(layout.counts),
        d(std::size_t(layout.offsets.back() * s.n)),
        desc{GemmKind::fp8_block, std::int64_t(s.rows.size()), s.n, s.k, layout.offsets.back(), h.offsets.back()},
        args{a.data(), a_scales.data(), offsets.data(), w.data(), w_scales.data(), d.data(), counts.data()} {
    a.upload(layout.a);
    w.upload({h.w.ptr<std::uint8_t>(), h.w.ptr<std::uint8_t>() + h.w.nbytes()});
  }
  // Slack past the last row's scales: a partial tile may read scales of rows it does not store.
  static std::vector<float> padded(std::vector<float> v) {
    v.resize(v.size() + 128 * 64, 1.0f);
    return v;
  }

  HostOperands h;
  DeviceLayout layout;
  DeviceArray<std::uint8_t> a, w;
  DeviceArray<float> a_scales, w_scales;
  DeviceArray<std::int32_t> offsets, counts;
  DeviceArray<bf16> d;
  cuda::GroupedGemmDesc desc;
  cuda::GroupedGemmArgs args;
};

// run(stream) captured in a CUDA graph, then two replays, each after poison() (on the legacy
// stream, finished before the replay) and followed by check(replay).
inline void replay_in_graph(const std::function<void(cudaStream_t)>& run, const std::function<void()>& poison,
                            const std::function<void(int)>& check) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    check(replay);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace moekit::test
