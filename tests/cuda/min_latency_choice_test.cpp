// The min-latency path's rule (min_latency::choose, can_implement): which problems take it and
// why not. Host code only: it runs without a GPU, so CI checks the rule the device measured.
#include <gtest/gtest.h>

#include <string>

#include "cuda/layer/min_latency.h"

namespace moekit::test {
namespace {

MoEConfig layer(QuantScheme scheme, std::int64_t experts, int top_k, std::int64_t hidden, std::int64_t inter) {
  MoEConfig c;
  c.num_experts = experts;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.quant.scheme = scheme;
  c.routing.top_k = top_k;
  return c;
}

const MoEConfig kQwen3 = layer(QuantScheme::bf16, 128, 8, 2048, 768);
const MoEConfig kGptOss = layer(QuantScheme::bf16, 128, 4, 2880, 2880);  // H, I = 45 blocks of 64

cuda::min_latency::Choice choice(const MoEConfig& c, std::int64_t tokens) {
  cuda::min_latency::Problem p;
  p.config = c;
  p.tokens = tokens;
  return cuda::min_latency::choose(p);
}

// bf16 takes it up to 1/2 row per expert (qwen3-30b-a3b's shape: T <= 8).
TEST(MinLatencyChoice, Bf16DecodeBatchesTakeIt) {
  for (const std::int64_t t : {1, 2, 8}) EXPECT_TRUE(choice(kQwen3, t).taken) << "T=" << t << ": " << choice(kQwen3, t).reason;
  EXPECT_TRUE(choice(kGptOss, 1).taken) << choice(kGptOss, 1).reason;
  EXPECT_TRUE(choice(kGptOss, 16).taken) << choice(kGptOss, 16).reason;  // 4 x 16 / 128
}

TEST(MinLatencyChoice, LargerBatchesStayStaged) {
  for (const std::int64_t t : {9, 64, 65, 512, 4096}) {
    const auto c = choice(kQwen3, t);
    EXPECT_FALSE(c.taken) << "qwen3 T=" << t;
    EXPECT_NE(c.reason.find("staged path"), std::string::npos) << c.reason;
  }
  EXPECT_FALSE(choice(kGptOss, 17).taken);
}

// fp8-block layers, deepseek-v3's and qwen3-30b-a3b's shapes at T = 1 among them, stay on the staged
// path's decode WGMMA GEMMs: the tuner measured them faster at every decode T on the H200 and the H100.
TEST(MinLatencyChoice, LayersItCannotRunStayStagedAndSayWhy) {
  struct Case {
    const char* name;
    MoEConfig config;
    const char* why;
  };
  MoEConfig invariant = kQwen3;
  invariant.batch_invariant = true;
  for (const Case& c : {Case{"fp8-block qwen3", layer(QuantScheme::fp8_block, 128, 8, 2048, 768), "decode WGMMA GEMMs measured faster"},
                        Case{"fp8-block deepseek", layer(QuantScheme::fp8_block, 256, 8, 7168, 2048), "given fp8-block"},
                        Case{"fp8-rowwise", layer(QuantScheme::fp8_rowwise, 128, 8, 2048, 768), "takes bf16 layers"},
                        Case{"batch_invariant", invariant, "batch-invariant"},
                        Case{"H, I % 64", layer(QuantScheme::bf16, 32, 4, 2880, 2848), "multiples of 64"},
                        Case{"E_local 2048", layer(QuantScheme::bf16, 2048, 8, 2048, 768), "one-block"}}) {
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
  p.config.quant.scheme = QuantScheme::fp8_block;  // forced, but fp8-block: refused by name
  p.tokens = 1;
  const Status fp8 = cuda::min_latency::can_implement(p);
  EXPECT_FALSE(fp8.is_ok());
  EXPECT_NE(fp8.reason().find("min-latency path: takes bf16 layers, given fp8-block"), std::string::npos) << fp8.reason();
}

}  // namespace
}  // namespace moekit::test
