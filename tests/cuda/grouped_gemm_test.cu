// The CUTLASS grouped GEMMs against the CPU grouped GEMM (src/cpu/gemm.cpp): every kind x
// tile x edge shape, fresh random data, poisoned output, every element checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/rows.h"
#include "cpu/activation.h"
#include "cpu/finalize.h"
#include "cpu/gemm.h"
#include "cpu/quant.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda_test_util.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::test {
namespace {

using cuda::GemmKind;
using cuda::GemmTile;

struct Shape {
  const char* name;
  std::vector<std::int64_t> rows;  // per group
  std::int64_t n, k;
};

const Shape kShapes[] = {
    {"uniform_4x100_n256_k512", {100, 100, 100, 100}, 256, 512},
    {"empty_groups_n384_k256", {0, 37, 0, 0, 129, 1, 0, 64}, 384, 256},
    {"one_group_all_rows_n128_k128", {0, 0, 300, 0, 0, 0}, 128, 128},
    {"single_row_n512_k1024", {0, 1, 0}, 512, 1024},
    {"partial_k_block_k144", {17, 200}, 256, 144},
    {"smallest_n16_k16", {3, 0, 5}, 16, 16},
    {"decode_rows_le8_n1536_k2048", {1, 0, 8, 3, 0, 0, 2, 1, 0, 7}, 1536, 2048},
    {"decode_one_row_n7168_k2048", {0, 0, 1, 0, 1}, 7168, 2048},
    {"rows_past_8_n256_k384", {9, 17, 0, 24}, 256, 384},
    {"prefill_rows_n256_k7168", {155, 0, 160, 129, 140}, 256, 7168},
    // ragged group sizes around the tile edges (64, 128, 192), and a block's tiles past the grid:
    // 24 groups x 5 column tiles is more tiles than an H200 has SMs, so persistent blocks take
    // several and their rings run on across tiles
    {"ragged_edges_n256_k384", {0, 1, 7, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300, 383, 384, 385}, 256, 384},
    {"many_tiles_n640_k512", {150, 131, 0, 177, 149, 160, 140, 0, 0, 199, 133, 151, 155, 162, 148, 170, 139, 145, 0, 158,
                              166, 142, 137, 1},
     640, 512},
    {"one_group_4096_rows_n128_k256", {0, 4096, 0}, 128, 256},
    // most groups empty, a few of 8 and 63 rows; one hot group holding most rows (skewed routing)
    {"most_empty_n384_k256", {0, 0, 0, 8, 0, 0, 63, 0, 0, 0, 0, 1, 0, 0, 0, 0}, 384, 256},
    {"skewed_hot_group_n576_k640", {3, 0, 0, 1500, 0, 12, 0, 0, 70, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 140}, 576, 640},
};

// MOEKIT_CUDA_TEST_SMALL (sanitizer runs): the shapes of more than 2^20 weights per group give
// way to these, with the same rows per group.
const Shape kSmallShapes[] = {
    {"decode_rows_le8_n256_k512", {1, 0, 8, 3, 0, 0, 2, 1, 0, 7}, 256, 512},
    {"decode_one_row_n1024_k1024", {0, 0, 1, 0, 1}, 1024, 1024},
    {"prefill_rows_n256_k1024", {155, 0, 160, 129, 140}, 256, 1024},
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (const Shape& s : kShapes)
    if (!small_cases() || s.n * s.k <= (1 << 20)) out.push_back(s);
  if (small_cases()) out.insert(out.end(), std::begin(kSmallShapes), std::end(kSmallShapes));
  return out;
}

QuantScheme scheme_of(GemmKind kind) {
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

HostOperands make_operands(GemmKind kind, const Shape& s, std::mt19937_64& rng) {
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
std::vector<float> device_a_scales(GemmKind kind, const HostOperands& h, std::int64_t k) {
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

std::vector<float> device_w_scales(GemmKind kind, const HostOperands& h, std::int64_t n, std::int64_t k) {
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

DeviceLayout device_layout(GemmKind kind, const HostOperands& h, std::int64_t k, std::int64_t align,
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

struct Case {
  GemmKind kind;
  GemmTile tile;
  Shape shape;
  Padding padding = Padding::none;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string kind(cuda::to_string(info.param.kind));
  for (char& c : kind)
    if (c == '-') c = '_';
  const char* tile = info.param.tile == GemmTile::m64_n128_pingpong   ? "_m64_"
                     : info.param.tile == GemmTile::rows8_warp_mma ? "_rows8_"
                     : info.param.tile == GemmTile::m192_n128_wgmma ? "_wgmma192_"
                     : info.param.tile == GemmTile::m128_n128_wgmma ? "_wgmma128_"
                     : info.param.tile == GemmTile::m64_n128_wgmma ? "_wgmma64_"
                     : info.param.tile == GemmTile::m192_n128_wgmma_k128 ? "_wgmma192_k128_"
                     : info.param.tile == GemmTile::m128_n128_f16 ? "_f16_128_"
                     : info.param.tile == GemmTile::m64_n128_f16 ? "_f16_64_"
                     : info.param.tile == GemmTile::tokens8_n128_wgmma ? "_decode8_"
                     : info.param.tile == GemmTile::tokens16_n128_wgmma ? "_decode16_"
                     : info.param.tile == GemmTile::tokens32_n128_wgmma ? "_decode32_"
                     : info.param.tile == GemmTile::m128_n128_persistent ? "_persistent128_"
                     : info.param.tile == GemmTile::m128_n192_persistent ? "_persistent192_"
                     : info.param.tile == GemmTile::tokens192_n128_persistent ? "_swapped_"
                     : info.param.tile == GemmTile::m128_n128_persistent_k32 ? "_persistent128_k32_"
                     : info.param.tile == GemmTile::m128_n128_persistent_x2 ? "_persistent128_x2_"
                     : info.param.tile == GemmTile::m128_n192_persistent_x2 ? "_persistent192_x2_"
                     : info.param.tile == GemmTile::tokens192_n128_persistent_x2 ? "_swapped_x2_"
                                                                   : "_m128_";
  const Padding pad = info.param.padding;
  return kind + tile + info.param.shape.name + (pad == Padding::aligned ? "_padded" : pad == Padding::masked ? "_masked" : "");
}

class CudaGroupedGemm : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGroupedGemm, MatchesTheCpuGemm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const HostOperands h = make_operands(c.kind, c.shape, rng);
  const std::int64_t rows = h.offsets.back(), groups = std::int64_t(c.shape.rows.size());
  const std::int64_t n = c.shape.n, k = c.shape.k;

  const cuda::GroupedGemmDesc desc{c.kind, groups, n, k, rows, rows};  // for can_implement
  const cuda::GroupedGemmConfig config{c.tile};
  const Status status = cuda::can_implement(desc, config);
  ASSERT_TRUE(status) << status.reason();

  // The CPU GEMM: the oracle.
  const QuantScheme scheme = scheme_of(c.kind);
  std::vector<bf16> expected(std::size_t(rows * n));
  cpu::grouped_gemm({scheme, {h.a.view(), h.a_scales.view()}, h.offsets.data(), h.w.view(), h.w_scales.view(),
                     expected.data()});

  // The masked blocks: room for the largest group and an empty tail of at least 16 rows.
  const std::int64_t capacity =
      c.padding == Padding::masked ? ceil_div(*std::max_element(c.shape.rows.begin(), c.shape.rows.end()), 16) * 16 + 16 : 0;
  const DeviceLayout layout = device_layout(c.kind, h, k, c.padding == Padding::aligned ? 16 : 1, capacity);
  const std::int64_t device_rows = layout.offsets.back();
  DeviceArray<std::uint8_t> a(layout.a.size()), w(h.w.nbytes());
  a.upload(layout.a);
  w.upload({h.w.ptr<std::uint8_t>(), h.w.ptr<std::uint8_t>() + h.w.nbytes()});
  DeviceArray<std::int32_t> offsets(layout.offsets), counts(layout.counts);
  DeviceArray<bf16> d(std::size_t(device_rows * n));
  const cuda::GroupedGemmDesc run_desc{c.kind, groups, n, k, device_rows, rows};
  DeviceArray<std::uint8_t> workspace(cuda::workspace_size(run_desc, config));
  // Scales get slack past the end: a partial tile may read scales of rows it does not store.
  std::vector<float> sa = layout.a_scales, sw;
  if (scheme != QuantScheme::bf16) sw = device_w_scales(c.kind, h, n, k);
  sa.resize(sa.size() + 128 * 64, 1.0f);
  sw.resize(sw.size() + 128, 1.0f);
  DeviceArray<float> a_scales(sa), w_scales(sw);
  d.poison();

  cuda::GroupedGemmArgs args;
  args.a = a.data();
  args.a_scales = scheme == QuantScheme::bf16 ? nullptr : a_scales.data();
  args.offsets = offsets.data();
  args.w = w.data();
  args.w_scales = scheme == QuantScheme::bf16 ? nullptr : w_scales.data();
  args.d = d.data();
  if (c.padding != Padding::none) args.counts = counts.data();
  cuda::run_grouped_gemm(run_desc, config, args, workspace.data(), nullptr);
  sync_and_check();
  const std::vector<bf16> device_out = d.download();
  // Back to the host rows; the padding rows must be left as poisoned.
  std::vector<bf16> got(expected.size());
  // (CUTLASS's FP8 tiles compute every row of a group's block: theirs may be written.)
  const bool untouched = c.padding == Padding::none || cuda::honours_counts(c.kind, c.tile);
  for (std::int64_t r = 0; r < device_rows; ++r) {
    const std::int64_t src = layout.source_row[std::size_t(r)];
    for (std::int64_t j = 0; j < n; ++j) {
      const bf16 v = device_out[std::size_t(r * n + j)];
      if (src >= 0) got[std::size_t(src * n + j)] = v;
      else if (untouched) ASSERT_EQ(v.bits, 0xffff) << "padding row " << r << " written";
    }
  }

  double diff = 0.0, norm = 0.0, max_ref = 0.0;
  std::int64_t unwritten = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), r = bf16_to_float(expected[i]);
    if (std::isnan(g)) ++unwritten;
    diff += (g - r) * (g - r);
    norm += r * r;
    max_ref = std::max(max_ref, std::fabs(r));
  }
  EXPECT_EQ(unwritten, 0) << "elements left unwritten (NaN poison) of " << got.size();
  // bf16 output: each element may differ by a rounding of the other accumulation order. The
  // warp-MMA kernel (mma.sync) and the f16 WGMMA kernel sum like the CPU: only f32 rounding
  // differs, so an element's bf16 rounding rarely flips (measured <= 6e-5). FP8 WGMMA sums at
  // reduced precision even within one 32-wide K step: moekit's FP8 WGMMA kernels (f32 every 32)
  // land near 4.4e-4, CUTLASS's (128) 6.4e-4.
  const double rel = std::sqrt(diff / std::max(norm, 1e-30));
  const bool exact = c.tile == GemmTile::rows8_warp_mma || c.tile == GemmTile::m128_n128_f16 || c.tile == GemmTile::m64_n128_f16;
  RecordProperty("rel_err", std::to_string(rel));
  std::printf("rel_err %.3g\n", rel);
  EXPECT_LE(rel, exact ? 1.5e-4 : 4e-3) << desc.to_string() << " " << config.to_string();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), r = bf16_to_float(expected[i]);
    ASSERT_LE(std::fabs(g - r), 1e-2 * max_ref + 1e-2 * std::fabs(r)) << "element " << i << " (row " << i / std::size_t(n) << ")";
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  // The padded forms on the shapes that run in milliseconds (not the 7168-wide ones).
  auto takes = [](Padding padding, const Shape& s) { return padding == Padding::none || (s.n < 7168 && s.k < 7168); };
  for (Padding padding : {Padding::none, Padding::aligned, Padding::masked}) {
    for (GemmKind kind : {GemmKind::bf16, GemmKind::fp8_block, GemmKind::fp8_channel})
      for (GemmTile tile : {GemmTile::m128_n128_cooperative, GemmTile::m64_n128_pingpong})
        for (const Shape& s : shapes())
          if (takes(padding, s)) cases.push_back({kind, tile, s, padding});
    for (GemmKind kind : {GemmKind::fp8_block, GemmKind::fp8_channel})
      for (GemmTile tile : {GemmTile::m192_n128_wgmma_k128, GemmTile::m192_n128_wgmma, GemmTile::m128_n128_wgmma,
                            GemmTile::m64_n128_wgmma, GemmTile::m128_n128_f16, GemmTile::m64_n128_f16,
                            GemmTile::m128_n128_persistent, GemmTile::m128_n192_persistent,
                            GemmTile::tokens192_n128_persistent, GemmTile::m128_n128_persistent_k32,
                            GemmTile::m128_n128_persistent_x2, GemmTile::m128_n192_persistent_x2,
                            GemmTile::tokens192_n128_persistent_x2})
        if (cuda::can_implement({kind, 1, 16, 16, 16, 16}, {tile}))
          for (const Shape& s : shapes())
            if (takes(padding, s)) cases.push_back({kind, tile, s, padding});
    // The warp-MMA and decode kernels take whole 128-K blocks (can_implement says so).
    for (GemmTile tile : {GemmTile::rows8_warp_mma, GemmTile::tokens8_n128_wgmma, GemmTile::tokens16_n128_wgmma,
                          GemmTile::tokens32_n128_wgmma})
      for (const Shape& s : shapes())
        if (takes(padding, s) && cuda::can_implement({GemmKind::fp8_block, 1, s.n, s.k, 16, 16}, {tile}))
          cases.push_back({GemmKind::fp8_block, tile, s, padding});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGroupedGemm, ::testing::ValuesIn(all_cases()), case_name);

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

// The persistent tiles: a rerun and a CUDA graph's replays give the same bits (no atomics, a fixed
// tile walk), on skewed groups in the layer's padded layout.
class CudaGroupedGemmPersistent : public ::testing::TestWithParam<GemmTile> {};

TEST_P(CudaGroupedGemmPersistent, RerunsAndGraphReplaysAreBitIdentical) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Shape s{"skewed", {0, 700, 0, 0, 5, 0, 129, 0, 0, 64, 0, 0}, 576, 1152};
  BlockGemmOnDevice g(s, 16, rng);
  const cuda::GroupedGemmDesc& desc = g.desc;
  const cuda::GroupedGemmArgs& args = g.args;
  DeviceArray<bf16>& d = g.d;
  const cuda::GroupedGemmConfig config{GetParam()};
  ASSERT_TRUE(cuda::can_implement(desc, config));
  DeviceArray<std::uint8_t> workspace(cuda::workspace_size(desc, config));
  auto run = [&](cudaStream_t stream) {
    d.poison();
    cuda::run_grouped_gemm(desc, config, args, workspace.data(), stream);
  };
  run(nullptr);
  sync_and_check();
  const std::vector<bf16> first = d.download();
  run(nullptr);
  sync_and_check();
  const std::vector<bf16> second = d.download();
  for (std::size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i].bits, second[i].bits) << "rerun, element " << i;

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cuda::run_grouped_gemm(desc, config, args, workspace.data(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    d.poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the poison (legacy stream) before the replay
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<bf16> replayed = d.download();
    for (std::size_t i = 0; i < first.size(); ++i)
      ASSERT_EQ(first[i].bits, replayed[i].bits) << "graph replay " << replay << ", element " << i;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Tiles, CudaGroupedGemmPersistent,
                         ::testing::Values(GemmTile::m128_n128_persistent, GemmTile::m128_n192_persistent,
                                           GemmTile::tokens192_n128_persistent, GemmTile::m128_n128_persistent_k32,
                                           GemmTile::m128_n128_persistent_x2, GemmTile::m128_n192_persistent_x2,
                                           GemmTile::tokens192_n128_persistent_x2),
                         [](const ::testing::TestParamInfo<GemmTile>& info) {
                           return info.param == GemmTile::m128_n128_persistent       ? std::string("n128")
                                  : info.param == GemmTile::m128_n192_persistent     ? std::string("n192")
                                  : info.param == GemmTile::m128_n128_persistent_k32 ? std::string("n128_k32")
                                  : info.param == GemmTile::m128_n128_persistent_x2  ? std::string("n128_x2")
                                  : info.param == GemmTile::m128_n192_persistent_x2  ? std::string("n192_x2")
                                  : info.param == GemmTile::tokens192_n128_persistent_x2 ? std::string("swapped_x2")
                                                                                     : std::string("swapped");
                         });

// The clusters of two blocks (A multicast) compute each tile as the one-block tiles do: the same
// bits, on skewed groups (one hot, most empty, a partial last K block), column tiles of an odd count
// (a cluster's second tile past N), unpadded and in the layer's padded layout, bf16 and activated out.
TEST(CudaGroupedGemmCluster, MulticastTilesGiveTheOneBlockTilesBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Shape shapes[] = {
      {"hot", {0, 900, 0, 0, 5, 0, 129, 0, 0, 64, 0, 0, 1, 0, 0, 0}, 576, 1040},  // 5 column (or W) tiles of 128, 3 of 192
      {"one_column_tile", {300, 1, 0, 63}, 128, 256},
      {"activated", {0, 37, 130, 0, 5, 300, 1, 64}, 2 * 384, 640},  // 3 activated column tiles
  };
  const struct {
    GemmTile one, two;
  } pairs[] = {{GemmTile::m128_n128_persistent, GemmTile::m128_n128_persistent_x2},
               {GemmTile::m128_n192_persistent, GemmTile::m128_n192_persistent_x2},
               {GemmTile::tokens192_n128_persistent, GemmTile::tokens192_n128_persistent_x2},
               {GemmTile::m128_n256_persistent_act, GemmTile::m128_n256_persistent_act_x2}};
  for (const Shape& s : shapes)
    for (const std::int64_t align : {1, 16}) {
      BlockGemmOnDevice g(s, align, rng);
      const std::int64_t device_rows = g.layout.offsets.back(), inter = s.n / 2;
      DeviceArray<std::uint8_t> q(std::size_t(device_rows * inter));
      DeviceArray<float> q_scales(std::size_t(device_rows * ceil_div(inter, kBlock)));
      for (const auto& pair : pairs) {
        cuda::GroupedGemmDesc desc = g.desc;
        cuda::GroupedGemmArgs args = g.args;
        const bool activated = cuda::output_of(pair.two) == cuda::GemmOutput::activated_fp8;
        if (activated) {
          desc.output = cuda::GemmOutput::activated_fp8;
          args.activated = {q.data(), q_scales.data(), Activation::silu_and_mul, 1.702f, 7.0f, false};
        }
        if (!cuda::can_implement(desc, {pair.two})) continue;
        ASSERT_TRUE(cuda::can_implement(desc, {pair.one}));
        std::vector<bf16> d[2];
        std::vector<std::uint8_t> codes[2];
        std::vector<float> scales[2];
        for (int i = 0; i < 2; ++i) {
          g.d.poison();
          q.poison();
          q_scales.poison();
          cuda::run_grouped_gemm(desc, {i == 0 ? pair.one : pair.two}, args, nullptr, nullptr);
          sync_and_check();
          d[i] = g.d.download();
          codes[i] = q.download();
          scales[i] = q_scales.download();
        }
        SCOPED_TRACE(std::string(s.name) + ", align " + std::to_string(align) + ", " + std::string(cuda::to_string(pair.two)));
        std::int64_t written = 0;
        for (std::size_t i = 0; i < d[0].size(); ++i) {
          ASSERT_EQ(d[0][i].bits, d[1][i].bits) << "bf16 element " << i;
          written += d[0][i].bits != 0xffff;
        }
        for (std::size_t i = 0; i < codes[0].size(); ++i) {
          ASSERT_EQ(codes[0][i], codes[1][i]) << "FP8 code " << i;
          written += codes[0][i] != 0xff;
        }
        for (std::size_t i = 0; i < scales[0].size(); ++i)
          ASSERT_EQ(std::memcmp(&scales[0][i], &scales[1][i], sizeof(float)), 0) << "scale " << i;
        EXPECT_GT(written, 0);
      }
    }
}

// The persistent kernel's 32-K promotion (m128_n128_persistent_k32) sums as moekit's FP8 WGMMA kernel
// does (m64_n128_wgmma: each 32 of K from zero, then acc += part x a_scale x w_scale in K order; its
// 128-row tiles, which the persistent ones replace, were checked the same way on the H200): the same
// bits, on skewed groups, a partial last K block, unpadded and in the layer's padded layout.
TEST(CudaGroupedGemmK32, PersistentTilesGiveTheWgmmaKernelsBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const std::int64_t align : {1, 16}) {
    const Shape s{"k32", {0, 300, 1, 0, 64, 65, 0, 129, 7, 0}, 384, 1040};
    BlockGemmOnDevice g(s, align, rng);
    std::vector<std::vector<bf16>> outs;
    for (const GemmTile tile : {GemmTile::m64_n128_wgmma, GemmTile::m128_n128_persistent_k32}) {
      ASSERT_TRUE(cuda::can_implement(g.desc, {tile}));
      g.d.poison();
      cuda::run_grouped_gemm(g.desc, {tile}, g.args, nullptr, nullptr);
      sync_and_check();
      outs.push_back(g.d.download());
    }
    std::int64_t written = 0;
    for (std::size_t i = 0; i < outs[0].size(); ++i) {
      ASSERT_EQ(outs[0][i].bits, outs[1][i].bits) << "align " << align << ", element " << i;
      written += outs[0][i].bits != 0xffff;
    }
    EXPECT_GT(written, 0);
  }
}

// GEMM1 + activation + requantization in one kernel (m128_n256_persistent_act; the decode kernel's
// tokens{8,16,32}_n256_act) against the same kernel's bf16 GEMM1 (m128_n128_persistent;
// tokens*_n128_wgmma: the same WGMMAs and promotions per column) followed by the CPU's activation
// and 1x128 quantization: the same FP8 codes and scales, bit for bit; padding rows not written.
struct ActCase {
  Activation act;
  Padding padding;
  GemmTile bf16_tile = GemmTile::m128_n128_persistent;
  GemmTile act_tile = GemmTile::m128_n256_persistent_act;
};

class CudaGroupedGemmActivated : public ::testing::TestWithParam<ActCase> {};

TEST_P(CudaGroupedGemmActivated, MatchesTheBf16GemmThenTheCpuActivation) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const ActCase& c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::int64_t inter = 384;
  const Shape s{"activated", {0, 37, 130, 0, 5, 300, 1, 64}, 2 * inter, 640};
  BlockGemmOnDevice g(s, c.padding == Padding::aligned ? 16 : 1, rng);
  const DeviceLayout& layout = g.layout;
  const std::int64_t groups = std::int64_t(s.rows.size()), device_rows = layout.offsets.back();
  const std::int64_t kb2 = inter / kBlock;
  DeviceArray<bf16>& d = g.d;
  DeviceArray<std::uint8_t> q(std::size_t(device_rows * inter));
  DeviceArray<float> q_scales(std::size_t(device_rows * kb2));
  cuda::GroupedGemmArgs args = g.args;
  cuda::GroupedGemmDesc desc = g.desc;
  ASSERT_TRUE(cuda::can_implement(desc, {c.bf16_tile}));
  ASSERT_FALSE(cuda::can_implement(desc, {c.act_tile}));
  d.poison();
  cuda::run_grouped_gemm(desc, {c.bf16_tile}, args, nullptr, nullptr);
  sync_and_check();
  const std::vector<bf16> gemm1 = d.download();

  desc.output = cuda::GemmOutput::activated_fp8;
  ASSERT_FALSE(cuda::can_implement(desc, {c.bf16_tile}));
  ASSERT_TRUE(cuda::can_implement(desc, {c.act_tile}));
  args.activated = {q.data(), q_scales.data(), c.act, 1.702f, 7.0f, false};
  q.poison();
  q_scales.poison();
  cuda::run_grouped_gemm(desc, {c.act_tile}, args, nullptr, nullptr);
  sync_and_check();
  const std::vector<std::uint8_t> got_q = q.download();
  const std::vector<float> got_s = q_scales.download();

  cpu::ActivationParams params;
  params.activation = c.act;
  params.intermediate_size = inter;
  std::vector<float> activated(static_cast<std::size_t>(inter));
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(kBlock));
  std::int64_t wrong_codes = 0, wrong_scales = 0, checked = 0;
  for (std::int64_t e = 0; e < groups; ++e) {
    const std::int64_t row0 = layout.offsets[std::size_t(e)], padded = layout.offsets[std::size_t(e) + 1] - row0;
    for (std::int64_t r = 0; r < padded; ++r) {
      const std::int64_t row = row0 + r;
      if (r >= layout.counts[std::size_t(e)]) {  // padding: nothing written
        for (std::int64_t j = 0; j < inter; ++j) ASSERT_EQ(got_q[std::size_t(row * inter + j)], 0xff) << "padding row " << row;
        continue;
      }
      cpu::activate_row(params, gemm1.data() + row * s.n, activated.data());
      for (std::int64_t b = 0; b < kb2; ++b) {
        const float scale = fp8_scale(cpu::amax(activated.data() + b * kBlock, kBlock), ScaleFormat::f32);
        cpu::quantize_with_scale(activated.data() + b * kBlock, kBlock, scale, codes.data());
        const float got_scale = got_s[std::size_t(row0 * kb2 + b * padded + r)];
        wrong_scales += std::memcmp(&got_scale, &scale, sizeof scale) != 0;
        for (std::int64_t j = 0; j < kBlock; ++j) wrong_codes += got_q[std::size_t(row * inter + b * kBlock + j)] != codes[std::size_t(j)];
        checked += kBlock;
      }
    }
  }
  EXPECT_EQ(wrong_scales, 0) << "scales that differ";
  EXPECT_EQ(wrong_codes, 0) << "FP8 codes that differ, of " << checked;
}

INSTANTIATE_TEST_SUITE_P(Activations, CudaGroupedGemmActivated,
                         ::testing::Values(ActCase{Activation::silu_and_mul, Padding::aligned},
                                           ActCase{Activation::silu_and_mul, Padding::none},
                                           ActCase{Activation::gelu_and_mul, Padding::aligned},
                                           ActCase{Activation::swiglu_oai, Padding::aligned},
                                           ActCase{Activation::silu_and_mul, Padding::aligned, GemmTile::m128_n128_persistent,
                                                   GemmTile::m128_n256_persistent_act_x2},
                                           ActCase{Activation::gelu_and_mul, Padding::none, GemmTile::m128_n128_persistent,
                                                   GemmTile::m128_n256_persistent_act_x2},
                                           ActCase{Activation::silu_and_mul, Padding::aligned, GemmTile::tokens8_n128_wgmma,
                                                   GemmTile::tokens8_n256_act},
                                           ActCase{Activation::silu_and_mul, Padding::none, GemmTile::tokens8_n128_wgmma,
                                                   GemmTile::tokens8_n256_act},
                                           ActCase{Activation::gelu_and_mul, Padding::aligned, GemmTile::tokens16_n128_wgmma,
                                                   GemmTile::tokens16_n256_act},
                                           ActCase{Activation::swiglu_oai, Padding::aligned, GemmTile::tokens32_n128_wgmma,
                                                   GemmTile::tokens32_n256_act},
                                           ActCase{Activation::silu_and_mul, Padding::none, GemmTile::tokens32_n128_wgmma,
                                                   GemmTile::tokens32_n256_act}),
                         [](const ::testing::TestParamInfo<ActCase>& info) {
                           return std::string(to_string(info.param.act)) + (info.param.padding == Padding::none ? "_unpadded" : "_padded") +
                                  (info.param.act_tile == GemmTile::tokens8_n256_act    ? "_tokens8"
                                   : info.param.act_tile == GemmTile::tokens16_n256_act ? "_tokens16"
                                   : info.param.act_tile == GemmTile::tokens32_n256_act ? "_tokens32"
                                   : info.param.act_tile == GemmTile::m128_n256_persistent_act_x2 ? "_persistent_x2"
                                                                                        : "_persistent");
                         });

// GEMM2 + the weighted combine (tokens{8,16}_n128_combine) against the same decode kernel's bf16
// tile followed by the CPU's finalize: D the same bits, and each token's sum the same bits; weights
// or none, -1 slots, tokens with no row, a column block short of 128 (N 392), the caller's output
// only 2-byte aligned, no row at all (every token 0); reruns (the counts left at 0) and a CUDA
// graph's replays the same bits.
class CudaGroupedGemmCombined : public ::testing::TestWithParam<GemmTile> {};

TEST_P(CudaGroupedGemmCombined, MatchesTheBf16TileThenTheCpuFinalize) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const GemmTile tile = GetParam();
  const GemmTile plain = tile == GemmTile::tokens8_n128_combine ? GemmTile::tokens8_n128_wgmma : GemmTile::tokens16_n128_wgmma;
  const Shape shapes[] = {
      {"decode", {1, 0, 8, 3, 0, 0, 2, 1, 0, 7, 0, 0, 0, 5, 0, 1}, 392, 256},
      {"one_hot_expert", {0, 0, 40, 0, 1, 0, 0, 0}, 1024, 512},
      {"no_rows", {0, 0, 0, 0}, 256, 128},
  };
  for (const Shape& s : shapes)
    for (const bool weighted : {true, false})
      for (const std::size_t misalign : {std::size_t(0), std::size_t(1)}) {
        SCOPED_TRACE(std::string(s.name) + (weighted ? ", weighted" : ", unweighted") + (misalign ? ", out 2-byte aligned" : ""));
        BlockGemmOnDevice g(s, 16, rng);
        const std::int64_t data = g.h.offsets.back(), device_rows = g.layout.offsets.back();
        // Slots: every data row once, in a shuffled order, among top_k slots per token with ~1/5 of
        // them -1 and two tokens with none.
        const int top_k = 4;
        std::vector<std::int32_t> rows;
        for (std::int64_t r = 0; r < device_rows; ++r)
          if (g.layout.source_row[std::size_t(r)] >= 0) rows.push_back(std::int32_t(r));
        std::shuffle(rows.begin(), rows.end(), rng);
        std::vector<std::int32_t> slot_rows;
        std::bernoulli_distribution gap(0.2);
        for (std::size_t next = 0; next < rows.size();) slot_rows.push_back(gap(rng) ? -1 : rows[next++]);
        slot_rows.resize(std::size_t(ceil_div(std::int64_t(slot_rows.size()), top_k) + 2) * top_k, -1);
        const std::int64_t tokens = std::int64_t(slot_rows.size()) / top_k;
        std::vector<float> weights = random_f32(slot_rows.size(), 0.0f, 1.0f, rng);
        ASSERT_EQ(std::int64_t(rows.size()), data);

        cuda::GroupedGemmDesc desc = g.desc;
        ASSERT_TRUE(cuda::can_implement(desc, {plain}));
        g.d.poison();
        cuda::run_grouped_gemm(desc, {plain}, g.args, nullptr, nullptr);
        sync_and_check();
        const std::vector<bf16> want_d = g.d.download();
        std::vector<bf16> want(std::size_t(tokens * s.n));
        cpu::finalize({want_d.data(), slot_rows.data(), weighted ? weights.data() : nullptr, tokens, top_k, s.n, want.data()});

        desc.output = cuda::GemmOutput::combined;
        ASSERT_FALSE(cuda::can_implement(desc, {plain}));
        ASSERT_TRUE(cuda::can_implement(desc, {tile}));
        DeviceArray<std::int32_t> d_slot_rows(slot_rows);
        DeviceArray<float> d_weights(weights);
        DeviceArray<bf16> out(std::size_t(tokens * s.n) + 1);
        const std::size_t counts = cuda::workspace_size(desc, {tile}) / sizeof(std::int32_t);
        ASSERT_EQ(counts, std::size_t(ceil_div(s.n, std::int64_t(128))));
        DeviceArray<std::int32_t> done(std::vector<std::int32_t>(counts, 0));
        cuda::GroupedGemmArgs args = g.args;
        args.combined = {d_slot_rows.data(), weighted ? d_weights.data() : nullptr, out.data() + misalign, tokens, top_k};
        auto check = [&](const char* what) {
          const std::vector<bf16> got_d = g.d.download(), got = out.download();
          for (std::size_t i = 0; i < want_d.size(); ++i) ASSERT_EQ(got_d[i].bits, want_d[i].bits) << what << ": D element " << i;
          for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i + misalign].bits, want[i].bits) << what << ": token " << i / std::size_t(s.n) << " column " << i % std::size_t(s.n);
          for (const std::int32_t c : done.download()) ASSERT_EQ(c, 0) << what << ": a count left set";
        };
        for (int run = 0; run < 2; ++run) {
          g.d.poison();
          out.poison();
          cuda::run_grouped_gemm(desc, {tile}, args, done.data(), nullptr);
          sync_and_check();
          check(run == 0 ? "first run" : "rerun");
        }
        cudaStream_t stream = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        cuda::run_grouped_gemm(desc, {tile}, args, done.data(), stream);
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
        for (int replay = 0; replay < 2; ++replay) {
          g.d.poison();
          out.poison();
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          check("graph replay");
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(stream);
      }
}

INSTANTIATE_TEST_SUITE_P(Tiles, CudaGroupedGemmCombined,
                         ::testing::Values(GemmTile::tokens8_n128_combine, GemmTile::tokens16_n128_combine),
                         [](const ::testing::TestParamInfo<GemmTile>& info) {
                           return info.param == GemmTile::tokens8_n128_combine ? std::string("tokens8") : std::string("tokens16");
                         });

// The decode tiles reading A's rows by index (a_by_index: GEMM1 without a gather pass) against the
// same tiles on the gathered rows: the same bits, bf16 or activated out. The indexed rows come
// from a shuffled token matrix with rows nobody reads (NaN codes); padding rows read -1.
class CudaGroupedGemmByIndex : public ::testing::TestWithParam<GemmTile> {};

TEST_P(CudaGroupedGemmByIndex, MatchesTheGatheredRowsBitForBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const GemmTile tile = GetParam();
  const bool activated = cuda::output_of(tile) == cuda::GemmOutput::activated_fp8;
  const std::int64_t inter = 384;
  const Shape s{"by index", {0, 37, 130, 0, 5, 300, 1, 64}, 2 * inter, 640};
  BlockGemmOnDevice g(s, 16, rng);
  const DeviceLayout& layout = g.layout;
  const std::int64_t rows = g.h.offsets.back(), kb = ceil_div(s.k, kBlock), tokens = rows + 3;
  const std::int64_t device_rows = layout.offsets.back();
  // Host row r is token perm[r]; tokens past the rows hold NaN codes and scales.
  std::vector<std::int64_t> perm(static_cast<std::size_t>(tokens));
  for (std::int64_t i = 0; i < tokens; ++i) perm[std::size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::uint8_t> x(std::size_t(tokens * s.k), 0x7f);
  std::vector<float> x_scales(std::size_t(tokens * kb), NAN);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = perm[std::size_t(r)];
    std::memcpy(x.data() + t * s.k, g.h.a.ptr<std::uint8_t>() + r * s.k, std::size_t(s.k));
    for (std::int64_t b = 0; b < kb; ++b) x_scales[std::size_t(t * kb + b)] = g.h.a_scales.ptr<float>()[r * kb + b];
  }
  std::vector<std::int32_t> a_rows(static_cast<std::size_t>(device_rows));
  for (std::int64_t r = 0; r < device_rows; ++r) {
    const std::int64_t source = layout.source_row[std::size_t(r)];
    a_rows[std::size_t(r)] = source >= 0 ? std::int32_t(perm[std::size_t(source)]) : -1;
  }
  DeviceArray<std::uint8_t> d_x(x);
  DeviceArray<float> d_x_scales(x_scales);
  DeviceArray<std::int32_t> d_a_rows(a_rows);
  DeviceArray<std::uint8_t> q(std::size_t(device_rows * inter));
  DeviceArray<float> q_scales(std::size_t(device_rows * (inter / kBlock)));

  cuda::GroupedGemmDesc desc = g.desc;
  cuda::GroupedGemmArgs args = g.args;
  if (activated) {
    desc.output = cuda::GemmOutput::activated_fp8;
    args.activated = {q.data(), q_scales.data(), Activation::silu_and_mul, 1.702f, 7.0f, false};
  }
  struct Out {
    std::vector<bf16> d;
    std::vector<std::uint8_t> q;
    std::vector<float> scales;
  };
  auto run = [&](const cuda::GroupedGemmDesc& dd, const cuda::GroupedGemmArgs& aa) {
    EXPECT_TRUE(cuda::can_implement(dd, {tile})) << dd.to_string();
    g.d.poison();
    q.poison();
    q_scales.poison();
    cuda::run_grouped_gemm(dd, {tile}, aa, nullptr, nullptr);
    sync_and_check();
    return Out{g.d.download(), q.download(), q_scales.download()};
  };
  const Out gathered = run(desc, args);
  cuda::GroupedGemmDesc by_index = desc;
  by_index.a_by_index = true;
  EXPECT_FALSE(cuda::can_implement(by_index, {GemmTile::m128_n128_persistent})) << "a tile that reads A as laid out";
  cuda::GroupedGemmArgs indexed = args;
  indexed.a = d_x.data();
  indexed.a_scales = d_x_scales.data();
  indexed.a_rows = d_a_rows.data();
  const Out got = run(by_index, indexed);
  std::int64_t written = 0;
  for (std::size_t i = 0; i < got.d.size(); ++i) {
    ASSERT_EQ(got.d[i].bits, gathered.d[i].bits) << "D element " << i;
    written += got.d[i].bits != 0xffff;  // poison()'s bytes
  }
  for (std::size_t i = 0; i < got.q.size(); ++i) ASSERT_EQ(got.q[i], gathered.q[i]) << "q element " << i;
  for (std::size_t i = 0; i < got.scales.size(); ++i)
    ASSERT_EQ(std::memcmp(&got.scales[i], &gathered.scales[i], sizeof(float)), 0) << "scale " << i;
  if (activated) {  // every data row's codes written (not left poisoned)
    std::int64_t poisoned = 0;
    for (std::int64_t r = 0; r < device_rows; ++r)
      if (layout.source_row[std::size_t(r)] >= 0)
        for (std::int64_t j = 0; j < inter; ++j) poisoned += got.q[std::size_t(r * inter + j)] == 0xff;
    EXPECT_EQ(poisoned, 0);
  } else {
    EXPECT_GT(written, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiles, CudaGroupedGemmByIndex,
                         ::testing::Values(GemmTile::tokens8_n128_wgmma, GemmTile::tokens32_n128_wgmma,
                                           GemmTile::tokens8_n256_act, GemmTile::tokens16_n256_act,
                                           GemmTile::tokens32_n256_act),
                         [](const ::testing::TestParamInfo<GemmTile>& info) {
                           switch (info.param) {
                             case GemmTile::tokens8_n128_wgmma: return std::string("tokens8");
                             case GemmTile::tokens32_n128_wgmma: return std::string("tokens32");
                             case GemmTile::tokens8_n256_act: return std::string("tokens8_act");
                             case GemmTile::tokens16_n256_act: return std::string("tokens16_act");
                             default: return std::string("tokens32_act");
                           }
                         });

}  // namespace
}  // namespace moekit::test
