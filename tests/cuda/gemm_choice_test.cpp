// The grouped GEMM heuristic (choose_gemm_config, gemm_sums): which tile each problem gets, as a
// table of cases. Host code only: it runs without a GPU, so CI checks the rules the device
// measurements chose (docs/PERF.md, grouped GEMM).
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "cuda/gemm/grouped_gemm.h"

namespace moekit::test {
namespace {

using cuda::GemmKind;
using cuda::GemmSums;
using cuda::GemmTile;

struct Case {
  const char* name;
  GemmKind kind;
  std::int64_t n, k;
  double rows_per_group;
  GemmSums sums;
  bool batch_invariant;
  GemmTile expected;
};

constexpr std::int64_t kGroups = 256;

// deepseek-v3's GEMM1 (N=4096, K=7168) and GEMM2 (N=7168, K=2048), qwen3-30b-a3b's GEMM1 (N=1536,
// K=2048) and GEMM2 (N=2048, K=768) shapes.
const Case kCases[] = {
    {"decode_block_tensor_core", GemmKind::fp8_block, 4096, 7168, 0.25, GemmSums::tensor_core, false, GemmTile::tokens8_n128_wgmma},
    {"decode_block_short_k", GemmKind::fp8_block, 2048, 768, 0.25, GemmSums::tensor_core, false, GemmTile::rows8_warp_mma},
    {"decode_block_8_rows", GemmKind::fp8_block, 4096, 7168, 8, GemmSums::tensor_core, false, GemmTile::tokens8_n128_wgmma},
    {"decode_block_short_k_2_rows", GemmKind::fp8_block, 2048, 768, 2, GemmSums::tensor_core, false, GemmTile::tokens8_n128_wgmma},
    {"decode_block_k32", GemmKind::fp8_block, 4096, 7168, 0.5, GemmSums::k32, false, GemmTile::rows8_warp_mma},
    {"decode_block_invariant", GemmKind::fp8_block, 4096, 7168, 0.25, GemmSums::tensor_core, true, GemmTile::m128_n128_cooperative},
    {"few_block_tensor_core", GemmKind::fp8_block, 4096, 7168, 32, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"many_block_tensor_core", GemmKind::fp8_block, 4096, 7168, 128, GemmSums::tensor_core, false, GemmTile::m128_n128_cooperative},
    {"ragged_block_tensor_core", GemmKind::fp8_block, 4096, 7168, 155, GemmSums::tensor_core, false, GemmTile::m128_n128_cooperative},
    {"short_k_block_tensor_core", GemmKind::fp8_block, 2048, 768, 512, GemmSums::tensor_core, false, GemmTile::m128_n192_persistent},
    {"small_expert_block_tensor_core", GemmKind::fp8_block, 1536, 2048, 256, GemmSums::tensor_core, false, GemmTile::m128_n192_persistent},
    {"small_expert_few_rows", GemmKind::fp8_block, 1536, 2048, 32, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"wide_n_short_k_block_tensor_core", GemmKind::fp8_block, 7168, 2048, 128, GemmSums::tensor_core, false, GemmTile::m128_n160_persistent},
    {"wide_n_short_k_block_few_rows", GemmKind::fp8_block, 7168, 2048, 32, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"few_channel_tensor_core", GemmKind::fp8_channel, 4096, 7168, 32, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"many_channel_tensor_core", GemmKind::fp8_channel, 4096, 7168, 128, GemmSums::tensor_core, false, GemmTile::m192_n128_wgmma_k128},
    {"many_channel_invariant", GemmKind::fp8_channel, 4096, 7168, 128, GemmSums::tensor_core, true, GemmTile::m128_n128_cooperative},
    {"few_block_k32", GemmKind::fp8_block, 4096, 7168, 8, GemmSums::k32, false, GemmTile::m64_n128_wgmma},
    {"thirty_two_rows_block_k32", GemmKind::fp8_block, 4096, 7168, 32, GemmSums::k32, false, GemmTile::m128_n128_persistent_k32},
    {"sixteen_rows_block_k32", GemmKind::fp8_block, 4096, 7168, 16, GemmSums::k32, false, GemmTile::m128_n128_persistent_k32},
    {"ragged_block_k32", GemmKind::fp8_block, 4096, 7168, 155, GemmSums::k32, false, GemmTile::m128_n128_persistent_k32},
    {"large_block_k32", GemmKind::fp8_block, 4096, 7168, 512, GemmSums::k32, false, GemmTile::m128_n128_persistent_k32},
    {"block_k32_invariant", GemmKind::fp8_block, 4096, 7168, 32, GemmSums::k32, true, GemmTile::m128_n128_persistent_k32},
    {"ragged_channel_k32", GemmKind::fp8_channel, 4096, 7168, 155, GemmSums::k32, false, GemmTile::m192_n128_wgmma},
    {"large_channel_k32", GemmKind::fp8_channel, 4096, 7168, 512, GemmSums::k32, false, GemmTile::m128_n128_wgmma},
    {"channel_k32_invariant", GemmKind::fp8_channel, 4096, 7168, 32, GemmSums::k32, true, GemmTile::m128_n128_wgmma},
    {"few_block_f32", GemmKind::fp8_block, 4096, 7168, 32, GemmSums::f32, false, GemmTile::m64_n128_f16},
    {"many_block_f32", GemmKind::fp8_block, 4096, 7168, 128, GemmSums::f32, false, GemmTile::m128_n128_f16},
    {"block_f32_invariant", GemmKind::fp8_block, 4096, 7168, 0.25, GemmSums::f32, true, GemmTile::m128_n128_f16},
    {"few_bf16", GemmKind::bf16, 4096, 7168, 32, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"many_bf16", GemmKind::bf16, 4096, 7168, 128, GemmSums::tensor_core, false, GemmTile::m128_n128_cooperative},
};

class CudaGemmChoice : public ::testing::TestWithParam<Case> {};

TEST_P(CudaGemmChoice, PicksTheMeasuredTile) {
  const Case& c = GetParam();
  const cuda::GroupedGemmDesc desc{c.kind, kGroups, c.n, c.k, 1 << 16, 1 << 16};
  const cuda::GemmChoice choice = cuda::choose_gemm_config(desc, c.rows_per_group, c.sums, c.batch_invariant);
  EXPECT_EQ(choice.config.tile, c.expected) << "got " << choice.config.to_string() << " (" << choice.reason << ")";
  EXPECT_FALSE(choice.reason.empty());
  // Every choice is a compiled kernel that takes the problem.
  const Status status = cuda::can_implement(desc, choice.config);
  EXPECT_TRUE(status) << status.reason();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGemmChoice, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The rows a tile computes for a group (explain's padding line, the bench's pad column): whole row
// tiles, except the persistent 128-row tiles' short last tile in halves of 64 and the swapped tiles' N
// in steps of 32; no rows, no tiles.
TEST(CudaGemmChoice, ComputedRowsAreTheTilesRowTiles) {
  for (GemmTile tile : cuda::kAllGemmTiles) EXPECT_EQ(cuda::computed_rows(tile, 0), 0) << cuda::to_string(tile);
  const struct {
    GemmTile tile;
    std::int64_t rows, computed;
  } cases[] = {
      {GemmTile::m128_n128_cooperative, 1, 128},      {GemmTile::m128_n128_cooperative, 129, 256},
      {GemmTile::m64_n128_pingpong, 65, 128},         {GemmTile::m128_n128_persistent, 129, 192},
      {GemmTile::m128_n192_persistent, 64, 64},       {GemmTile::m128_n256_persistent_act, 200, 256},
      {GemmTile::tokens192_n128_persistent, 161, 192}, {GemmTile::tokens192_n128_persistent, 193, 224},
      {GemmTile::tokens192_n128_persistent, 96, 96},  {GemmTile::m192_n128_wgmma, 200, 256},
      {GemmTile::tokens8_n128_wgmma, 3, 8},           {GemmTile::tokens32_n128_wgmma, 33, 64},
      {GemmTile::rows8_warp_mma, 9, 16},              {GemmTile::m128_n128_f16, 127, 128},
      {GemmTile::m128_n128_persistent_k32, 130, 192}, {GemmTile::m128_n128_persistent_k32, 20, 64},
      {GemmTile::m128_n160_persistent, 257, 320},
  };
  for (const auto& c : cases)
    EXPECT_EQ(cuda::computed_rows(c.tile, c.rows), c.computed) << cuda::to_string(c.tile) << ", " << c.rows << " rows";
}

// The masked format: only tiles that honour counts (a block's empty tail neither computed nor
// written), by the rows the caller expects.
struct MaskedCase {
  const char* name;
  GemmKind kind;
  double expected_rows;
  GemmSums sums;
  bool batch_invariant;
  GemmTile expected;
};

const MaskedCase kMaskedCases[] = {
    {"block_8", GemmKind::fp8_block, 8, GemmSums::tensor_core, false, GemmTile::tokens8_n128_wgmma},
    {"block_16", GemmKind::fp8_block, 16, GemmSums::tensor_core, false, GemmTile::tokens16_n128_wgmma},
    {"block_32", GemmKind::fp8_block, 32, GemmSums::tensor_core, false, GemmTile::tokens32_n128_wgmma},
    {"block_64", GemmKind::fp8_block, 64, GemmSums::tensor_core, false, GemmTile::m64_n128_wgmma},
    {"block_200", GemmKind::fp8_block, 200, GemmSums::tensor_core, false, GemmTile::m128_n128_persistent_k32},
    {"block_k32_200", GemmKind::fp8_block, 200, GemmSums::k32, false, GemmTile::m128_n128_persistent_k32},
    {"block_k32_invariant", GemmKind::fp8_block, 8, GemmSums::k32, true, GemmTile::m128_n128_persistent_k32},
    {"block_invariant", GemmKind::fp8_block, 3, GemmSums::tensor_core, true, GemmTile::tokens32_n128_wgmma},
    {"block_k32", GemmKind::fp8_block, 8, GemmSums::k32, false, GemmTile::m64_n128_wgmma},
    {"block_f32", GemmKind::fp8_block, 8, GemmSums::f32, false, GemmTile::m64_n128_f16},
    {"block_f32_invariant", GemmKind::fp8_block, 8, GemmSums::f32, true, GemmTile::m128_n128_f16},
    {"bf16_8", GemmKind::bf16, 8, GemmSums::tensor_core, false, GemmTile::m64_n128_pingpong},
    {"bf16_100", GemmKind::bf16, 100, GemmSums::tensor_core, false, GemmTile::m128_n128_cooperative},
};

class CudaMaskedGemmChoice : public ::testing::TestWithParam<MaskedCase> {};

TEST_P(CudaMaskedGemmChoice, PicksATileThatHonoursCounts) {
  const MaskedCase& c = GetParam();
  const cuda::GroupedGemmDesc desc{c.kind, kGroups, 4096, 7168, kGroups * 256, kGroups * 256};
  const cuda::GemmChoice choice = cuda::choose_masked_gemm_config(desc, c.expected_rows, c.sums, c.batch_invariant);
  EXPECT_EQ(choice.config.tile, c.expected) << "got " << choice.config.to_string() << " (" << choice.reason << ")";
  EXPECT_TRUE(cuda::honours_counts(c.kind, choice.config.tile));
  const Status status = cuda::can_implement(desc, choice.config);
  EXPECT_TRUE(status) << status.reason();
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaMaskedGemmChoice, ::testing::ValuesIn(kMaskedCases),
                         [](const ::testing::TestParamInfo<MaskedCase>& info) { return std::string(info.param.name); });

TEST(CudaMaskedGemmChoice, CutlassFp8TilesComputeEveryRow) {
  EXPECT_FALSE(cuda::honours_counts(GemmKind::fp8_block, GemmTile::m64_n128_pingpong));
  EXPECT_FALSE(cuda::honours_counts(GemmKind::fp8_channel, GemmTile::m128_n128_cooperative));
  EXPECT_TRUE(cuda::honours_counts(GemmKind::bf16, GemmTile::m64_n128_pingpong));
  for (GemmTile t : cuda::kAllGemmTiles) {
    if (t == GemmTile::m64_n128_pingpong || t == GemmTile::m128_n128_cooperative) continue;
    EXPECT_TRUE(cuda::honours_counts(GemmKind::fp8_block, t)) << cuda::to_string(t);
  }
}

// The decode kernel (as the persistent tiles) finds its tiles in a table of at most 1024 groups in
// shared memory: past that it says so, and both heuristics take another tile that can run (masked and
// batch-invariant: the FP8 WGMMA kernel's 64-row tiles).
TEST(CudaGemmChoice, DecodeTilesTakeAtMost1024Groups) {
  const cuda::GroupedGemmDesc wide{GemmKind::fp8_block, 2048, 4096, 7168, 2048 * 16, 512};
  const Status status = cuda::can_implement(wide, {GemmTile::tokens8_n128_wgmma});
  ASSERT_FALSE(status);
  EXPECT_NE(status.reason().find("tile table takes at most 1024"), std::string::npos) << status.reason();
  EXPECT_TRUE(cuda::can_implement({GemmKind::fp8_block, 1024, 4096, 7168, 1024 * 16, 512}, {GemmTile::tokens8_n128_wgmma}));
  const cuda::GemmChoice contiguous = cuda::choose_gemm_config(wide, 0.25, GemmSums::tensor_core, false);
  EXPECT_TRUE(cuda::can_implement(wide, contiguous.config)) << contiguous.config.to_string();
  const cuda::GroupedGemmDesc masked{GemmKind::fp8_block, 2048, 4096, 7168, 2048 * 64, 2048 * 64};
  for (const bool invariant : {false, true}) {
    const cuda::GemmChoice choice = cuda::choose_masked_gemm_config(masked, 8, GemmSums::tensor_core, invariant);
    EXPECT_TRUE(cuda::can_implement(masked, choice.config)) << choice.config.to_string();
    EXPECT_TRUE(cuda::honours_counts(GemmKind::fp8_block, choice.config.tile)) << choice.config.to_string();
  }
}

// Which sums each GEMM of a layer needs: GEMM1's output is requantized (FP8), GEMM2's is the result.
TEST(CudaGemmChoice, SumsFollowTheAccumulationMode) {
  EXPECT_EQ(cuda::gemm_sums(GemmKind::fp8_block, Fp8Accumulation::fast, true), GemmSums::tensor_core);
  EXPECT_EQ(cuda::gemm_sums(GemmKind::fp8_block, Fp8Accumulation::fast, false), GemmSums::tensor_core);
  EXPECT_EQ(cuda::gemm_sums(GemmKind::fp8_block, Fp8Accumulation::exact, true), GemmSums::k32);
  EXPECT_EQ(cuda::gemm_sums(GemmKind::fp8_block, Fp8Accumulation::exact, false), GemmSums::tensor_core);
  EXPECT_EQ(cuda::gemm_sums(GemmKind::fp8_channel, Fp8Accumulation::strict, false), GemmSums::f32);
  EXPECT_EQ(cuda::gemm_sums(GemmKind::bf16, Fp8Accumulation::strict, true), GemmSums::tensor_core);
}

// Past 2^31 elements (issue #19): the GEMMs of the past-2-GiB layer test (600,000 rows of
// K = 7168, 4.3e9 elements; once refused as too many for 32-bit indexing) are taken by every
// kernel family; only 2^31 rows themselves are refused (the plan's offsets are int32).
TEST(CudaGemmChoice, RowsPast2GiBOfElementsAreTaken) {
  struct Kernel {
    GemmKind kind;
    GemmTile tile;
  };
  constexpr std::int64_t kRows = 600000 + 8 * 15;  // T·k rows and each group's padding to 16
  for (const Kernel k : {Kernel{GemmKind::bf16, GemmTile::m128_n128_cooperative}, Kernel{GemmKind::fp8_block, GemmTile::m128_n128_cooperative},
                         Kernel{GemmKind::fp8_block, GemmTile::m128_n128_persistent_k32}, Kernel{GemmKind::fp8_block, GemmTile::m128_n128_f16},
                         Kernel{GemmKind::fp8_channel, GemmTile::m192_n128_wgmma_k128}}) {
    for (const auto& [n, depth] : {std::pair<std::int64_t, std::int64_t>{256, 7168}, {7168, 128}}) {
      const cuda::GroupedGemmDesc desc{k.kind, 8, n, depth, kRows, 600000};
      const Status status = cuda::can_implement(desc, {k.tile});
      EXPECT_TRUE(status) << desc.to_string() << " " << cuda::to_string(k.tile) << ": " << status.reason();
    }
    const cuda::GroupedGemmDesc too_many{k.kind, 8, 256, 128, std::int64_t(1) << 31, 600000};
    const Status status = cuda::can_implement(too_many, {k.tile});
    EXPECT_FALSE(status) << too_many.to_string();
    EXPECT_NE(status.reason().find("rows:"), std::string::npos) << status.reason();
  }
}

}  // namespace
}  // namespace moekit::test
