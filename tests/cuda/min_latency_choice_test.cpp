// The min-latency path's rule (min_latency::choose, can_implement): which problems take it and
// why not. Host code only: it runs without a GPU, so CI checks the rule the device measured.
#include <gtest/gtest.h>

#include <string>

#include "cuda/layer/min_latency.h"

namespace moekit::test {
namespace {

MoEConfig fp8_block(std::int64_t experts, int top_k, std::int64_t hidden, std::int64_t inter) {
  MoEConfig c;
  c.num_experts = experts;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.quant.scheme = QuantScheme::fp8_block;
  c.routing.top_k = top_k;
  return c;
}

const MoEConfig kQwen3 = fp8_block(128, 8, 2048, 768);
const MoEConfig kDeepseek = fp8_block(256, 8, 7168, 2048);

cuda::min_latency::Choice choice(const MoEConfig& c, std::int64_t tokens) {
  cuda::min_latency::Problem p;
  p.config = c;
  p.tokens = tokens;
  return cuda::min_latency::choose(p);
}

// The switch-over measured on the H200: up to 1/8 row per expert on small experts (qwen3 T <= 2);
// deepseek-v3's 44 MB experts stay on the staged path's decode GEMMs from T=1.
TEST(MinLatencyChoice, DecodeBatchesTakeIt) {
  for (const std::int64_t t : {1, 2}) EXPECT_TRUE(choice(kQwen3, t).taken) << "qwen3 T=" << t << ": " << choice(kQwen3, t).reason;
  for (const std::int64_t t : {1, 2, 4}) {
    const auto c = choice(kDeepseek, t);
    EXPECT_FALSE(c.taken) << "deepseek T=" << t;
    EXPECT_NE(c.reason.find("MB of weights per expert"), std::string::npos) << c.reason;
  }
  MoEConfig bf16 = kDeepseek;  // bf16's warp MMAs are native: the size rule is fp8-block's
  bf16.quant.scheme = QuantScheme::bf16;
  EXPECT_TRUE(choice(bf16, 1).taken) << choice(bf16, 1).reason;
}

TEST(MinLatencyChoice, Bf16TakesItWithBlocksOf64) {
  MoEConfig bf16 = kQwen3;
  bf16.quant.scheme = QuantScheme::bf16;
  EXPECT_TRUE(choice(bf16, 1).taken) << choice(bf16, 1).reason;
  EXPECT_TRUE(choice(bf16, 8).taken) << choice(bf16, 8).reason;  // 1/2 row per expert
  EXPECT_FALSE(choice(bf16, 9).taken);
  MoEConfig gpt_oss = fp8_block(128, 4, 2880, 2880);  // H, I = 45 blocks of 64
  gpt_oss.quant.scheme = QuantScheme::bf16;
  EXPECT_TRUE(choice(gpt_oss, 1).taken) << choice(gpt_oss, 1).reason;
}

TEST(MinLatencyChoice, LargerBatchesStayStaged) {
  EXPECT_FALSE(choice(kDeepseek, 8).taken);
  for (const std::int64_t t : {3, 8, 64, 65, 512, 4096}) {
    const auto c = choice(kQwen3, t);
    EXPECT_FALSE(c.taken) << "qwen3 T=" << t;
    EXPECT_NE(c.reason.find("staged path"), std::string::npos) << c.reason;
  }
  EXPECT_FALSE(choice(kDeepseek, 4096).taken);
}

TEST(MinLatencyChoice, LayersItCannotRunStayStagedAndSayWhy) {
  struct Case {
    const char* name;
    MoEConfig config;
    const char* why;
  };
  MoEConfig rowwise = kQwen3;
  rowwise.quant.scheme = QuantScheme::fp8_rowwise;
  MoEConfig invariant = kQwen3;
  invariant.batch_invariant = true;
  MoEConfig strict = kQwen3;
  strict.quant.accumulation = Fp8Accumulation::strict;
  const MoEConfig odd_inter = fp8_block(32, 4, 2880, 2880);
  const MoEConfig many = fp8_block(2048, 8, 2048, 768);
  for (const Case& c : {Case{"fp8-rowwise", rowwise, "fp8-block and bf16"}, Case{"batch_invariant", invariant, "batch-invariant"},
                        Case{"strict", strict, "strict"}, Case{"H, I % 128", odd_inter, "multiples of 128"},
                        Case{"E_local 2048", many, "one-block"}}) {
    const auto got = choice(c.config, 1);
    EXPECT_FALSE(got.taken) << c.name;
    EXPECT_NE(got.reason.find(c.why), std::string::npos) << c.name << ": " << got.reason;
  }
}

TEST(MinLatencyChoice, AForcedPathIsTakenOrRefused) {
  MoEConfig staged = kQwen3;
  staged.experts_path = ExpertsPath::staged;
  EXPECT_FALSE(choice(staged, 1).taken);
  MoEConfig forced = kQwen3;
  forced.experts_path = ExpertsPath::min_latency;
  EXPECT_TRUE(choice(forced, 64).taken);
  cuda::min_latency::Problem p;
  p.config = forced;
  p.tokens = 65;  // T·k = 520 > 512
  EXPECT_TRUE(choice(forced, 65).taken);
  const Status s = cuda::min_latency::can_implement(p);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.reason().find("T·k <= 512"), std::string::npos) << s.reason();
}

}  // namespace
}  // namespace moekit::test
