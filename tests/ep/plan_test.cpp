// The host dispatch plan on a hand-checked case: E = 4 on 2 ranks (rank 0 owns experts 0-1,
// rank 1 owns 2-3), k = 2, routing [[0, 3], [1, 1], [2, -1], [-1, -1]].
#include <gtest/gtest.h>

#include "core/ep_plan.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "moekit/error.h"

namespace moekit::core {
namespace {

MoEConfig two_ranks() {
  MoEConfig c;
  c.num_experts = 4;
  c.hidden_size = 256;
  c.intermediate_size = 128;
  c.routing.top_k = 2;
  c.ep_size = 2;
  return c;
}

const std::int32_t kIds[] = {0, 3, 1, 1, 2, -1, -1, -1};
const float kWeights[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};

using V32 = std::vector<std::int32_t>;
using V64 = std::vector<std::int64_t>;

TEST(EpPlan, EachTokenGoesOnceToEachOwningRankWithItsShare) {
  EpSendPlan p;
  plan_dispatch(kIds, kWeights, 4, two_ranks(), 0, EpCombine::exact, p);
  EXPECT_EQ(p.counts, (V64{2, 2}));
  EXPECT_EQ(p.offsets, (V64{0, 2}));
  EXPECT_EQ(p.token, (V32{0, 1, 0, 2}));
  EXPECT_EQ(p.ids, (V32{0, -1, 1, 1, -1, 3, 2, -1}));
  EXPECT_EQ(p.weights, (std::vector<float>{0.1f, 0.0f, 0.3f, 0.4f, 0.0f, 0.2f, 0.5f, 0.0f}));
}

// Issue #19: ids out of range indexed the plan's host arrays (out-of-bounds writes on GPU ranks,
// whose ids arrive unchecked from device memory).
TEST(EpPlan, IdsOutOfRangeAreAnErrorNamingThem) {
  for (const std::int32_t bad : {4, 5, -2, 1 << 30, -(1 << 30)}) {
    for (const EpCombine combine : {EpCombine::exact, EpCombine::partial}) {
      std::int32_t ids[8];
      std::copy(std::begin(kIds), std::end(kIds), ids);
      ids[5] = bad;
      EpSendPlan p;
      try {
        plan_dispatch(ids, kWeights, 4, two_ranks(), combine == EpCombine::exact ? 0 : 4, combine, p);
        ADD_FAILURE() << "no error for id " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("topk_ids: expected ids in [-1, 4), given " + std::to_string(bad) +
                                             " at flat index 5"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

TEST(EpPlan, ExactCombineRowsComeBackPerSlot) {
  EpSendPlan p;
  plan_dispatch(kIds, kWeights, 4, two_ranks(), 0, EpCombine::exact, p);
  // From rank 0: (t0, slot 0), (t1, 0), (t1, 1); from rank 1: (t0, 1), (t2, 0).
  EXPECT_EQ(p.rows_back, (V64{3, 2}));
  EXPECT_EQ(p.slot_rows, (V32{0, 3, 1, 2, 4, -1, -1, -1}));
}

TEST(EpPlan, PartialCombineRowsComeBackPerRank) {
  EpSendPlan p;
  plan_dispatch(kIds, kWeights, 4, two_ranks(), 0, EpCombine::partial, p);
  EXPECT_EQ(p.rows_back, (V64{2, 2}));
  // [T, ep]: t0's rows from both ranks, t1's from rank 0, t2's from rank 1, none for t3.
  EXPECT_EQ(p.token_rows, (V32{0, 2, 1, -1, -1, 3, -1, -1}));
}

TEST(EpPlan, FixedCapacityPadsEveryBlockAndKeepsEverySlot) {
  EpSendPlan p;
  plan_dispatch(kIds, kWeights, 4, two_ranks(), 4, EpCombine::exact, p);
  EXPECT_EQ(p.counts, (V64{4, 4}));
  EXPECT_EQ(p.token, (V32{0, 1, -1, -1, 0, 2, -1, -1}));
  EXPECT_EQ(p.ids[4], -1);  // padding record: no ids
  EXPECT_EQ(p.ids[7], -1);
  EXPECT_EQ(p.rows_back, (V64{8, 8}));
  // Slot (t, j) of record position q in rank d's block comes back at (d * 4 + q) * k + j.
  EXPECT_EQ(p.slot_rows, (V32{0, 9, 2, 3, 10, -1, -1, -1}));
  EXPECT_THROW(plan_dispatch(kIds, kWeights, 4, two_ranks(), 3, EpCombine::exact, p), Error);
}

TEST(EpPlan, ReturnPlanMatchesTheSourcesExpectation) {
  // Rank 1 received t0 (ids [-1, 3]) and t2 (ids [2, -1]) from rank 0 and nothing from itself;
  // its experts put slot (0, 1) in row 1 and slot (1, 0) in row 0.
  const std::int32_t slot_rows[] = {-1, 1, 0, -1};
  const V64 counts{2, 0}, offsets{0, 2};
  EpReturnPlan r;
  plan_return(counts, offsets, slot_rows, 2, false, r);
  EXPECT_EQ(r.counts, (V64{2, 0}));
  EXPECT_EQ(r.rows, (V32{1, 0}));
  plan_return(counts, offsets, slot_rows, 2, true, r);
  EXPECT_EQ(r.counts, (V64{4, 0}));
  EXPECT_EQ(r.rows, (V32{-1, 1, 0, -1}));
}

TEST(EpPlan, RecordLayoutSendsHalfTheBytesInFp8) {
  MoEConfig c = two_ranks();
  c.hidden_size = 2048;
  c.routing.top_k = 8;
  c.quant.scheme = QuantScheme::bf16;
  const EpRecordLayout bf16 = EpRecordLayout::of(c);
  c.quant.scheme = QuantScheme::fp8_block;
  const EpRecordLayout block = EpRecordLayout::of(c);
  c.quant.scheme = QuantScheme::fp8_tensor;
  const EpRecordLayout tensor = EpRecordLayout::of(c);
  EXPECT_EQ(bf16.bytes, 4096u + 64u);
  EXPECT_EQ(block.bytes, 2048u + 64u + 64u);  // 16 block scales
  EXPECT_EQ(tensor.bytes, 2048u + 64u);
  EXPECT_EQ(block.values % 16, 0u);
  EXPECT_LT(double(block.bytes) / double(bf16.bytes), 0.53);
}

}  // namespace
}  // namespace moekit::core
