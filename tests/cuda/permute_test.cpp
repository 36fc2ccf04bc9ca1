// CUDA permutation (plan + gather) against cpu::plan_permutation / cpu::gather_rows: both
// formats, paddings 1..128, expert parallelism, empty experts, all tokens on one expert,
// -1 ids, T = 0 and 1; both paths of the plan (one block for decode sizes, multi-kernel) and
// the edges between them; every scheme and scale layout for the gather. Outputs are poisoned
// first: rows past those in use must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/permute.h"
#include "cuda/permute/gather.h"
#include "cuda/permute/plan.h"
#include "cuda_test_util.h"
#include "moekit/quant.h"

namespace moekit {
namespace {

using cuda::ExpertRows;
using cuda::RowFormat;
using cuda::ScaleLayout;
using cuda::permute::PlanPath;
using test::DeviceArray;

enum class Spread : std::uint8_t { uniform, one_expert, skewed };

struct Case {
  std::int64_t tokens;
  int top_k;
  std::int64_t local;     // E_local
  bool second_rank;       // ep = 2, this rank owns [E_local, 2 E_local)
  std::int64_t alignment;
  RowFormat format;
  std::int64_t capacity;  // masked
  Spread spread;
};

cuda::permute::PlanProblem plan_problem(const Case& c) {
  return {{c.format, c.local, c.alignment, c.capacity}, c.tokens, c.top_k, c.second_rank ? c.local : 0};
}

std::string name(const Case& c) {
  static const char* spreads[] = {"uniform", "one_expert", "skewed"};
  std::string s = std::string(cuda::to_string(c.format)) + " T=" + std::to_string(c.tokens) + " k=" +
                  std::to_string(c.top_k) + " E_local=" + std::to_string(c.local) + (c.second_rank ? " rank 1 of 2" : "") +
                  " align=" + std::to_string(c.alignment) + " " + spreads[int(c.spread)];
  if (c.format == RowFormat::masked) s += " capacity=" + std::to_string(c.capacity);
  return s + " " + std::string(to_string(cuda::permute::choose_path(plan_problem(c))));
}

// T ≤ 33, and k = 1, take the one-block path; T = 700 and 3000 with k = 8 the multi-kernel
// one; the edge entries sit on both sides of each of choose_path's bounds (plan.cu).
std::vector<Case> cases() {
  std::vector<Case> all;
  // Contiguous, and at alignments 1 and 16 masked too: a fair capacity (drops some) and a roomy one.
  auto add = [&all](Case c) {
    all.push_back(c);
    if (c.alignment != 1 && c.alignment != 16) return;
    const std::int64_t fair = std::max<std::int64_t>(1, c.tokens * c.top_k / c.local);
    c.format = RowFormat::masked;
    for (const std::int64_t capacity : {fair, 4 * fair + 8}) {
      c.capacity = capacity;
      all.push_back(c);
    }
  };
  const std::vector<std::int64_t> token_counts = test::small_cases() ? std::vector<std::int64_t>{0, 1, 8, 33, 700}
                                                                      : std::vector<std::int64_t>{0, 1, 2, 8, 33, 700, 3000};
  for (const std::int64_t t : token_counts)
    for (const auto& [k, local] : {std::pair<int, std::int64_t>{1, 8}, {8, 60}, {8, 256}})
      for (const std::int64_t alignment : {1, 4, 16, 128})
        for (const Spread spread : {Spread::uniform, Spread::one_expert, Spread::skewed}) {
          const bool second = (alignment == 4 || alignment == 128) && local != 8;
          add({t, k, local, second, alignment, RowFormat::contiguous, 0, spread});
        }

  struct Edge {
    std::int64_t tokens;
    int top_k;
    std::int64_t local;
    bool second_rank;
    std::int64_t alignment;
  };
  for (const Edge& e : {Edge{512, 8, 256, true, 16},    // T·k = 4096: one block
                        Edge{513, 8, 256, true, 16},    // T·k = 4104: multi-kernel
                        Edge{512, 8, 1024, false, 16},  // E_local = 1024: one block, 10 subtiles of 13 pieces
                        Edge{8, 8, 1025, true, 16},     // E_local = 1025: multi-kernel at a decode size
                        Edge{64, 8, 1024, false, 128},  // rows = 512 + 512 * 127 = 65536: one block
                        Edge{65, 8, 1024, true, 128}})  // rows = 66560: multi-kernel
    for (const Spread spread : {Spread::uniform, Spread::one_expert})
      add({e.tokens, e.top_k, e.local, e.second_rank, e.alignment, RowFormat::contiguous, 0, spread});
  // Masked rows are E_local * capacity whatever T is: 65536 rows take one block, 65792 do not.
  for (const std::int64_t capacity : {256, 257})
    all.push_back({33, 8, 256, false, 16, RowFormat::masked, capacity, Spread::skewed});
  return all;
}

// topk_ids [T, k]: distinct global experts per token, about 4% of slots -1, and (so that small T
// has some too) the last slot of tokens 1, 8, 15, ... (not with one_expert: it takes every token).
std::vector<std::int32_t> make_ids(const Case& c, std::mt19937_64& rng) {
  const std::int64_t global = c.second_rank ? 2 * c.local : c.local;
  std::vector<std::int32_t> ids(std::size_t(c.tokens * c.top_k));
  std::vector<std::int32_t> experts(static_cast<std::size_t>(global));
  std::iota(experts.begin(), experts.end(), 0);
  const std::int32_t favourite = std::int32_t(c.second_rank ? c.local + 3 : 3) % std::int32_t(global);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    std::shuffle(experts.begin(), experts.end(), rng);
    if (c.spread == Spread::skewed) std::sort(experts.begin(), experts.begin() + std::min<std::int64_t>(global, 3 * c.top_k));
    if (c.spread == Spread::one_expert) std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), favourite));
    for (int j = 0; j < c.top_k; ++j) {
      std::int32_t id = experts[std::size_t(j)];
      if (c.spread != Spread::one_expert && (u(rng) < 0.04f || (t % 7 == 1 && j == c.top_k - 1))) id = -1;
      ids[std::size_t(t * c.top_k + j)] = id;
    }
  }
  return ids;
}

struct Expected {
  std::vector<std::int32_t> counts, offsets, slot_rows, row_token, row_expert;
  std::int32_t dropped = 0;
  std::int64_t max_rows = 0;
};

// The plan of the contract, from the CPU's unpadded plan.
Expected expected_plan(const Case& c, const std::vector<std::int32_t>& ids) {
  const std::int64_t slots = c.tokens * c.top_k;
  std::vector<std::int64_t> off(std::size_t(c.local + 1));
  std::vector<std::int32_t> rows(std::size_t(std::max<std::int64_t>(slots, 1))), tokens(std::size_t(std::max<std::int64_t>(slots, 1)));
  const std::int64_t first = c.second_rank ? c.local : 0;
  cpu::plan_permutation(ids.data(), c.tokens, c.top_k, {first, c.local}, {off.data(), rows.data(), tokens.data()});
  Expected x;
  const ExpertRows layout{c.format, c.local, c.alignment, c.capacity};
  x.max_rows = layout.max_rows(slots);
  x.row_token.assign(std::size_t(x.max_rows), -1);
  x.row_expert.assign(std::size_t(x.max_rows), -1);
  x.slot_rows.assign(std::size_t(slots), -1);
  std::vector<std::int32_t> padded(std::size_t(c.local + 1), 0);
  for (std::int64_t e = 0; e < c.local; ++e) {
    const auto n = std::int32_t(off[std::size_t(e + 1)] - off[std::size_t(e)]);
    const auto a = std::int32_t(c.alignment);
    x.counts.push_back(c.format == RowFormat::masked ? std::min<std::int32_t>(n, std::int32_t(c.capacity)) : n);
    padded[std::size_t(e + 1)] = padded[std::size_t(e)] + (n + a - 1) / a * a;
    if (c.format == RowFormat::masked) x.dropped += std::max<std::int32_t>(0, n - std::int32_t(c.capacity));
  }
  for (std::int64_t e = 0; e <= c.local; ++e)
    x.offsets.push_back(c.format == RowFormat::masked ? std::int32_t(e * c.capacity) : padded[std::size_t(e)]);
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::int32_t r = rows[std::size_t(s)];
    if (r < 0) continue;
    const auto e = std::int64_t(std::upper_bound(off.begin(), off.end(), std::int64_t(r)) - off.begin() - 1);
    const std::int32_t rank = r - std::int32_t(off[std::size_t(e)]);
    std::int32_t row = -1;
    if (c.format == RowFormat::contiguous) row = padded[std::size_t(e)] + rank;
    else if (rank < c.capacity) row = std::int32_t(e * c.capacity) + rank;
    x.slot_rows[std::size_t(s)] = row;
    if (row >= 0) x.row_token[std::size_t(row)] = std::int32_t(s / c.top_k);
  }
  if (c.format == RowFormat::contiguous)
    for (std::int64_t e = 0; e < c.local; ++e)
      for (std::int32_t r = padded[std::size_t(e)]; r < padded[std::size_t(e + 1)]; ++r) x.row_expert[std::size_t(r)] = std::int32_t(e);
  return x;
}

struct DevicePlan {
  DeviceArray<std::int32_t> counts, offsets, slot_rows, row_token, row_expert, dropped;
};

void run_plan(const Case& c, const DeviceArray<std::int32_t>& ids, const Expected& x, DevicePlan& d) {
  d.counts = DeviceArray<std::int32_t>(std::size_t(c.local));
  d.offsets = DeviceArray<std::int32_t>(std::size_t(c.local + 1));
  d.slot_rows = DeviceArray<std::int32_t>(std::size_t(c.tokens * c.top_k));
  d.row_token = DeviceArray<std::int32_t>(std::size_t(x.max_rows));
  d.row_expert = DeviceArray<std::int32_t>(std::size_t(x.max_rows));
  d.dropped = DeviceArray<std::int32_t>(1);
  for (auto* a : {&d.counts, &d.offsets, &d.slot_rows, &d.row_token, &d.row_expert, &d.dropped}) a->poison();
  const cuda::permute::PlanProblem problem = plan_problem(c);
  ASSERT_TRUE(cuda::permute::can_implement(problem)) << cuda::permute::can_implement(problem).reason();
  ASSERT_EQ(problem.max_rows(), x.max_rows);
  test::DeviceWorkspace ws(cuda::permute::workspace_size(problem));
  cuda::permute::run(problem, {ids.data(), d.counts.data(), d.offsets.data(), d.slot_rows.data(), d.row_token.data(),
                               d.row_expert.data(), d.dropped.data()},
                     ws.get(), nullptr);
  test::sync_and_check();
}

TEST(CudaPermute, PlanMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const std::vector<std::int32_t> ids = make_ids(c, rng);
    const Expected x = expected_plan(c, ids);
    DeviceArray<std::int32_t> d_ids(ids);
    DevicePlan d;
    run_plan(c, d_ids, x, d);
    if (HasFatalFailure()) return;
    ASSERT_EQ(d.counts.download(), x.counts);
    ASSERT_EQ(d.offsets.download(), x.offsets);
    ASSERT_EQ(d.slot_rows.download(), x.slot_rows);
    ASSERT_EQ(d.row_token.download(), x.row_token);
    if (c.format == RowFormat::contiguous) ASSERT_EQ(d.row_expert.download(), x.row_expert);
    else ASSERT_EQ(d.dropped.download()[0], x.dropped);
  }
}

struct GatherCase {
  QuantScheme scheme;
  ScaleLayout layout;
  std::int64_t hidden;
};

TEST(CudaPermute, GatherMatchesThePlan) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<GatherCase> gathers{
      {QuantScheme::bf16, ScaleLayout::k_major, 72},        {QuantScheme::bf16, ScaleLayout::k_major, 13},
      {QuantScheme::fp8_tensor, ScaleLayout::k_major, 72},  {QuantScheme::fp8_rowwise, ScaleLayout::k_major, 200},
      {QuantScheme::fp8_block, ScaleLayout::k_major, 400},  {QuantScheme::fp8_block, ScaleLayout::mn_major_per_expert, 400},
      {QuantScheme::fp8_block, ScaleLayout::mn_major_per_expert, 9216}};
  std::size_t index = 0;
  for (const Case& c : cases()) {
    if (c.spread == Spread::skewed && c.tokens > 1) continue;  // the plan test covers it; keep this one short
    if (c.local > 256) continue;                                // the plan's edges: the plan test covers them
    const GatherCase& g = gathers[index++ % gathers.size()];
    SCOPED_TRACE(name(c) + " " + std::string(to_string(g.scheme)) + " " + std::string(cuda::to_string(g.layout)) +
                 " H=" + std::to_string(g.hidden));
    const std::vector<std::int32_t> ids = make_ids(c, rng);
    const Expected x = expected_plan(c, ids);
    DeviceArray<std::int32_t> d_ids(ids);
    DevicePlan d;
    run_plan(c, d_ids, x, d);
    if (HasFatalFailure()) return;

    const std::size_t elem = g.scheme == QuantScheme::bf16 ? 2 : 1;
    const std::size_t row_bytes = std::size_t(g.hidden) * elem;
    const std::int64_t groups = g.scheme == QuantScheme::fp8_block ? ceil_div(g.hidden, kBlock) : 1;
    std::vector<std::uint8_t> q(std::size_t(c.tokens) * row_bytes);
    for (auto& b : q) b = std::uint8_t(rng());
    const std::int64_t src_scales = g.scheme == QuantScheme::fp8_tensor ? 1 : c.tokens * groups;
    const std::vector<float> scales = test::random_f32(std::size_t(src_scales), 0.001f, 1.0f, rng);
    DeviceArray<std::uint8_t> d_q(q), d_out(std::size_t(x.max_rows) * row_bytes);
    DeviceArray<float> d_scales(scales);
    const std::int64_t out_scales = g.scheme == QuantScheme::fp8_tensor ? 1 : x.max_rows * groups;
    DeviceArray<float> d_out_scales{std::size_t(std::max<std::int64_t>(out_scales, 1))};
    d_out.poison();
    d_out_scales.poison();
    const cuda::permute::GatherProblem problem{{c.format, c.local, c.alignment, c.capacity}, c.tokens, c.top_k, g.hidden,
                                               g.scheme, g.layout};
    ASSERT_TRUE(cuda::permute::can_implement(problem)) << cuda::permute::can_implement(problem).reason();
    // Rows found by the plan's row_expert (contiguous, every other case) or by searching the offsets.
    const bool by_row_expert = c.format == RowFormat::contiguous && index % 2 == 1;
    const cuda::RowPlan row_plan{d.offsets.data(), d.counts.data(), by_row_expert ? d.row_expert.data() : nullptr};
    cuda::permute::run(problem, {d_q.data(), d_scales.data(), row_plan, d.row_token.data(), d_out.data(), d_out_scales.data()},
                       {}, nullptr);
    test::sync_and_check();

    // Expected: token rows copied, padding zero, unused rows still poisoned.
    std::vector<std::uint8_t> want(std::size_t(x.max_rows) * row_bytes, 0xff);
    std::vector<float> want_scales(std::size_t(std::max<std::int64_t>(out_scales, 1)));
    std::memset(want_scales.data(), 0xff, want_scales.size() * sizeof(float));
    if (g.scheme == QuantScheme::fp8_tensor && c.tokens > 0) want_scales[0] = scales[0];
    for (std::int64_t r = 0; r < x.max_rows; ++r) {
      std::int64_t e = 0, index_in = 0, base = 0, span = 0;
      bool used = false;
      if (c.format == RowFormat::contiguous) {
        used = r < x.offsets.back();
        if (used) {
          e = std::int64_t(std::upper_bound(x.offsets.begin(), x.offsets.end(), std::int32_t(r)) - x.offsets.begin() - 1);
          base = x.offsets[std::size_t(e)], span = x.offsets[std::size_t(e + 1)] - base, index_in = r - base;
        }
      } else {
        e = r / c.capacity, index_in = r % c.capacity, base = e * c.capacity, span = c.capacity;
        const std::int64_t n = x.counts[std::size_t(e)];
        used = index_in < std::min<std::int64_t>((n + c.alignment - 1) / c.alignment * c.alignment, c.capacity);
      }
      if (!used) continue;
      const std::int32_t t = x.row_token[std::size_t(r)];
      std::uint8_t* dst = want.data() + std::size_t(r) * row_bytes;
      if (t >= 0) std::memcpy(dst, q.data() + std::size_t(t) * row_bytes, row_bytes);
      else std::memset(dst, 0, row_bytes);
      if (g.scheme == QuantScheme::fp8_rowwise || g.scheme == QuantScheme::fp8_block) {
        for (std::int64_t k = 0; k < groups; ++k) {
          const std::int64_t at = g.layout == ScaleLayout::k_major || g.scheme == QuantScheme::fp8_rowwise
                                      ? r * groups + k
                                      : base * groups + k * span + index_in;
          want_scales[std::size_t(at)] = t >= 0 ? scales[std::size_t(t * groups + k)] : 0.0f;
        }
      }
    }
    const auto got = d_out.download();
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(int(got[i]), int(want[i])) << "row " << i / row_bytes << " byte " << i % row_bytes;
    if (g.scheme != QuantScheme::bf16) {
      const auto got_scales = d_out_scales.download();
      for (std::size_t i = 0; i < want_scales.size(); ++i)
        ASSERT_EQ(std::memcmp(&got_scales[i], &want_scales[i], 4), 0) << "scale " << i << ": " << got_scales[i] << " vs " << want_scales[i];
    }
  }
}

// Runs without a GPU: the table reaches both paths, and the bounds sit where plan.cu says.
TEST(CudaPermute, PlanCasesCoverBothPaths) {
  using cuda::permute::choose_path;
  using Problem = cuda::permute::PlanProblem;
  std::size_t per_path[2] = {};
  for (const Case& c : cases()) ++per_path[int(choose_path(plan_problem(c)))];
  EXPECT_GT(per_path[int(PlanPath::one_block)], 0u);
  EXPECT_GT(per_path[int(PlanPath::multi_kernel)], 0u);

  const ExpertRows e256{RowFormat::contiguous, 256, 16, 0}, e1024{RowFormat::contiguous, 1024, 128, 0};
  EXPECT_EQ(choose_path(Problem{e256, 0, 8, 0}), PlanPath::one_block);
  EXPECT_EQ(choose_path(Problem{e256, 512, 8, 0}), PlanPath::one_block);
  EXPECT_EQ(choose_path(Problem{e256, 513, 8, 0}), PlanPath::multi_kernel);
  EXPECT_EQ(choose_path(Problem{{RowFormat::contiguous, 1024, 16, 0}, 512, 8, 0}), PlanPath::one_block);
  EXPECT_EQ(choose_path(Problem{{RowFormat::contiguous, 1025, 16, 0}, 1, 8, 0}), PlanPath::multi_kernel);
  EXPECT_EQ(choose_path(Problem{e1024, 64, 8, 0}), PlanPath::one_block);
  EXPECT_EQ(choose_path(Problem{e1024, 65, 8, 0}), PlanPath::multi_kernel);
  EXPECT_EQ(choose_path(Problem{{RowFormat::masked, 256, 16, 256}, 33, 8, 0}), PlanPath::one_block);
  EXPECT_EQ(choose_path(Problem{{RowFormat::masked, 256, 16, 257}, 33, 8, 0}), PlanPath::multi_kernel);
}

TEST(CudaPermute, RejectsBadLayouts) {
  EXPECT_FALSE(cuda::permute::can_implement(cuda::permute::PlanProblem{{RowFormat::masked, 8, 1, 0}, 4, 2, 0}));
  EXPECT_FALSE(cuda::permute::can_implement(cuda::permute::PlanProblem{{RowFormat::contiguous, 0, 1, 0}, 4, 2, 0}));
  EXPECT_FALSE(cuda::permute::can_implement(
      cuda::permute::GatherProblem{{RowFormat::contiguous, 8, 1, 0}, 4, 2, 72, QuantScheme::fp8_block, ScaleLayout::k_major}));
}

}  // namespace
}  // namespace moekit
