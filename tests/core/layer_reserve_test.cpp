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
  reserved.reserve(100);
  EXPECT_EQ(bit_differences(run_external(fresh, in.hidden, in.routing), run_external(reserved, in.hidden, in.routing)), 0);
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
