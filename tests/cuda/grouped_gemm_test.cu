// The grouped GEMMs against the CPU grouped GEMM (src/cpu/gemm.cpp): every kind x tile x edge
// shape, fresh random data, poisoned output, every element checked; the persistent tiles' reruns and
// graph replays, and their 32-K promotion against the FP8 WGMMA kernel. The fused and variant
// tiles against the plain ones: grouped_gemm_fused_test.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda_test_util.h"
#include "grouped_gemm_operands.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::test {
namespace {


const Shape kShapes[] = {
    {"uniform_4x100_n256_k512", {100, 100, 100, 100}, 256, 512},
    {"empty_groups_n384_k256", {0, 37, 0, 0, 129, 1, 0, 64}, 384, 256},
    {"one_group_all_rows_n128_k128", {0, 0, 300, 0, 0, 0}, 128, 128},
    {"single_row_n512_k1024", {0, 1, 0}, 512, 1024},
    {"partial_k_block_k144", {17, 200}, 256, 144},
    {"smallest_n16_k16", {3, 0, 5}, 16, 16},
    {"decode_rows_le8_n1536_k2048", {1, 0, 8, 3, 0, 0, 2, 1, 0, 7}, 1536, 2048},
    {"decode_one_row_n7168_k2048", {0, 0, 1, 0, 1}, 7168, 2048},
    // N past whole W tiles of 128 rows (400 = 3 x 128 + 16)
    {"decode_partial_w_tile_n400_k256", {2, 0, 5, 1, 9}, 400, 256},
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
                     : info.param.tile == GemmTile::m128_n160_persistent ? "_persistent160_"
                     : info.param.tile == GemmTile::m128_n128_persistent_tma ? "_persistent128_tma_"
                     : info.param.tile == GemmTile::m128_n192_persistent_tma ? "_persistent192_tma_"
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
                            GemmTile::m128_n128_persistent, GemmTile::m128_n160_persistent,
                            GemmTile::m128_n192_persistent, GemmTile::tokens192_n128_persistent,
                            GemmTile::m128_n128_persistent_k32, GemmTile::m128_n128_persistent_tma,
                            GemmTile::m128_n192_persistent_tma,
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

  replay_in_graph([&](cudaStream_t stream) { cuda::run_grouped_gemm(desc, config, args, workspace.data(), stream); },
                  [&] { d.poison(); },
                  [&](int replay) {
                    const std::vector<bf16> replayed = d.download();
                    for (std::size_t i = 0; i < first.size(); ++i)
                      ASSERT_EQ(first[i].bits, replayed[i].bits) << "graph replay " << replay << ", element " << i;
                  });
}

INSTANTIATE_TEST_SUITE_P(Tiles, CudaGroupedGemmPersistent,
                         ::testing::Values(GemmTile::m128_n128_persistent, GemmTile::m128_n160_persistent,
                                           GemmTile::m128_n192_persistent, GemmTile::m128_n128_persistent_tma,
                                           GemmTile::m128_n192_persistent_tma,
                                           GemmTile::tokens192_n128_persistent, GemmTile::m128_n128_persistent_k32,
                                           GemmTile::m128_n128_persistent_x2, GemmTile::m128_n192_persistent_x2,
                                           GemmTile::tokens192_n128_persistent_x2),
                         [](const ::testing::TestParamInfo<GemmTile>& info) {
                           return info.param == GemmTile::m128_n128_persistent       ? std::string("n128")
                                  : info.param == GemmTile::m128_n160_persistent     ? std::string("n160")
                                  : info.param == GemmTile::m128_n128_persistent_tma ? std::string("n128_tma")
                                  : info.param == GemmTile::m128_n192_persistent_tma ? std::string("n192_tma")
                                  : info.param == GemmTile::m128_n192_persistent     ? std::string("n192")
                                  : info.param == GemmTile::m128_n128_persistent_k32 ? std::string("n128_k32")
                                  : info.param == GemmTile::m128_n128_persistent_x2  ? std::string("n128_x2")
                                  : info.param == GemmTile::m128_n192_persistent_x2  ? std::string("n192_x2")
                                  : info.param == GemmTile::tokens192_n128_persistent_x2 ? std::string("swapped_x2")
                                                                                     : std::string("swapped");
                         });

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

}  // namespace
}  // namespace moekit::test
