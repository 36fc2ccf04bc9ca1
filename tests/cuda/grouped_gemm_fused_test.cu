// The fused and variant grouped GEMM tiles against the plain ones, bit for bit: the persistent tiles
// on clusters of two blocks (*_x2) against one block, GEMM1 + activation + requantization against
// the bf16 GEMM and the CPU's activation, GEMM2 + the weighted combine against the bf16 tile and the
// CPU's finalize, and the decode tiles reading their rows by index against the gathered rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/activation.h"
#include "cpu/finalize.h"
#include "cpu/quant.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda_test_util.h"
#include "grouped_gemm_operands.h"
#include "moekit/quant.h"
#include "test_util.h"

namespace moekit::test {
namespace {

// The clusters of two blocks (W multicast) compute each tile as the one-block tiles do, and the TMA
// bulk stores write what the lanes' stores write: the same bits, on skewed groups (one hot, most
// empty, a partial last K block, groups' last rows short of a warp's 16: the lanes store those),
// groups of an odd count of row tiles (a cluster's second tile past the group's rows), unpadded and
// in the layer's padded layout, bf16 and activated out.
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
               {GemmTile::m128_n128_persistent, GemmTile::m128_n128_persistent_tma},
               {GemmTile::m128_n192_persistent, GemmTile::m128_n192_persistent_tma},
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
// or none, -1 slots, tokens with no row, groups of several row tiles, a column block short of 128
// (N 400), the caller's output only 2-byte aligned, no row at all (every token 0); reruns (the counts
// left at 0) and a CUDA graph's replays the same bits.
class CudaGroupedGemmCombined : public ::testing::TestWithParam<GemmTile> {};

TEST_P(CudaGroupedGemmCombined, MatchesTheBf16TileThenTheCpuFinalize) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const GemmTile tile = GetParam();
  const GemmTile plain = tile == GemmTile::tokens8_n128_combine ? GemmTile::tokens8_n128_wgmma : GemmTile::tokens16_n128_wgmma;
  const Shape shapes[] = {
      {"decode", {1, 0, 8, 3, 0, 0, 2, 1, 0, 7, 0, 0, 0, 5, 0, 1}, 400, 256},
      {"one_hot_expert", {0, 0, 40, 0, 1, 0, 0, 0}, 1024, 512},
      {"prefill", {130, 0, 300, 17, 0, 64, 1, 200}, 400, 384},
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
        replay_in_graph([&](cudaStream_t stream) { cuda::run_grouped_gemm(desc, {tile}, args, done.data(), stream); },
                        [&] {
                          g.d.poison();
                          out.poison();
                        },
                        [&](int) { check("graph replay"); });
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
