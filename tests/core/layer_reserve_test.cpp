// Layer::reserve: buffers for up to max_tokens up front; a negative count is an Error.
#include <gtest/gtest.h>

#include "cpu/layer_util.h"

namespace moekit::test {
namespace {

TEST(CoreLayerReserve, ReservedLayerGivesTheSameOutput) {
  LayerCase c;
  c.scheme = QuantScheme::fp8_block;
  c.hidden = 256, c.inter = 128, c.tokens = 9;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  Layer fresh(config_of(c), lw.weights());
  Layer reserved(config_of(c), lw.weights());
  EXPECT_EQ(reserved.workspace_bytes(), 0u) << "nothing before the first call or reserve";
  reserved.reserve(100);
  const std::size_t bytes = reserved.workspace_bytes();
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(bit_differences(run_external(fresh, in.hidden, in.routing), run_external(reserved, in.hidden, in.routing)), 0);
  EXPECT_EQ(reserved.workspace_bytes(), bytes) << "a call within the reservation allocates nothing";
  EXPECT_GT(fresh.workspace_bytes(), 0u);
  EXPECT_LT(fresh.workspace_bytes(), bytes) << "a call of 9 tokens takes less than a reservation of 100";
}

TEST(CoreLayerReserve, NegativeCountIsAnError) {
  LayerCase c;
  const TestLayer lw = make_test_layer(c, 1);
  Layer layer(config_of(c), lw.weights());
  try {
    layer.reserve(-1);
    FAIL() << "expected moekit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit::test
