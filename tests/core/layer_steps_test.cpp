// LayerOptions::observer: every step of a forward is announced once, in order, before its work;
// an observer changes nothing in the output.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/layer_util.h"

namespace moekit::test {
namespace {

class RecordSteps final : public StepObserver {
 public:
  void step(std::string_view name, Stream) override { names.emplace_back(name); }
  std::vector<std::string> names;
};

TEST(CoreLayerSteps, EveryStepIsAnnouncedInOrderAndChangesNothing) {
  LayerCase c;
  c.scheme = QuantScheme::fp8_block;
  c.hidden = 256, c.inter = 128, c.tokens = 7;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  RecordSteps steps;
  LayerOptions options;
  options.observer = &steps;
  Layer observed(config_of(c), lw.weights(), options);
  Layer plain(config_of(c), lw.weights());

  const Tensor out = run_external(observed, in.hidden, in.routing);
  const std::vector<std::string> external = {"quantize", "permute", "gemm1", "activation", "gemm2", "finalize", "end"};
  EXPECT_EQ(steps.names, external);
  EXPECT_EQ(bit_differences(out, run_external(plain, in.hidden, in.routing)), 0);

  steps.names.clear();
  Tensor fused_out(DType::bf16, {c.tokens, c.hidden});
  observed.forward(FusedArgs{in.hidden.view(), in.logits.view(), fused_out.view(), {}, {}});
  std::vector<std::string> fused = {"routing"};
  fused.insert(fused.end(), external.begin(), external.end());
  EXPECT_EQ(steps.names, fused);
}

}  // namespace
}  // namespace moekit::test
