// The API an engine holds (layer.h): PreparedWeights shared by Layers, caller-owned workspace
// (nothing allocated, concurrent calls), max_tokens checked at construction, and the weights'
// memory taking part in the backend choice. CPU backend; tests/cuda/layer_prepared_test.cpp
// has the device side.
#include <gtest/gtest.h>

#include <thread>

#include "cpu/layer_util.h"
#include "moekit/backend.h"

namespace moekit::test {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

LayerOptions on_cpu(std::int64_t max_tokens = 0) {
  LayerOptions o;
  o.backend = "cpu";
  o.max_tokens = max_tokens;
  return o;
}

// A byte vector as a workspace, 256-aligned inside it.
struct HostWorkspace {
  explicit HostWorkspace(std::size_t bytes) : storage(bytes + 256) {}
  Workspace get(std::size_t bytes) {
    auto p = reinterpret_cast<std::uintptr_t>(storage.data());
    return {reinterpret_cast<void*>((p + 255) / 256 * 256), bytes};
  }
  std::vector<std::byte> storage;
};

Tensor external_in(const Layer& layer, const Inputs& in, const Workspace& ws) {
  Tensor out = poisoned_out(in.hidden.size(0), in.hidden.size(1));
  layer.forward(ExternalArgs{in.hidden.view(), in.routing.ids.view(), in.routing.weights.view(), out.view()}, ws,
                nullptr);
  return out;
}

class CoreLayerPrepared : public ::testing::TestWithParam<QuantScheme> {};

TEST_P(CoreLayerPrepared, SharedWeightsAndCallerWorkspaceGiveTheOwningLayersBits) {
  LayerCase c;
  c.scheme = GetParam();
  c.hidden = 256, c.inter = 128, c.tokens = 11;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  Layer owning(config_of(c), lw.weights(), on_cpu());
  const Tensor expected = run_external(owning, in.hidden, in.routing);

  const PreparedWeights prepared(config_of(c), lw.weights(), on_cpu(64));
  EXPECT_EQ(prepared.backend_name(), "cpu");
  EXPECT_EQ(prepared.owned_bytes(), 0u) << "the cpu backend borrows host weights";
  const Layer a(prepared, on_cpu(64)), b(prepared);
  const std::size_t bytes = a.workspace_size(c.tokens);
  EXPECT_GT(bytes, 0u);
  EXPECT_GE(a.workspace_size(64), bytes);
  HostWorkspace ws(bytes);
  EXPECT_EQ(bit_differences(external_in(a, in, ws.get(bytes)), expected), 0);
  EXPECT_EQ(bit_differences(external_in(b, in, ws.get(bytes)), expected), 0);
  EXPECT_EQ(a.workspace_bytes(), 0u) << "a forward with the caller's workspace allocates nothing";

  // Fused routing in the caller's workspace, with the routing written out.
  Tensor out = poisoned_out(c.tokens, c.hidden), fused_ref = poisoned_out(c.tokens, c.hidden);
  Tensor ids(DType::i32, {c.tokens, c.top_k}), weights(DType::f32, {c.tokens, c.top_k});
  owning.forward(FusedArgs{in.hidden.view(), in.logits.view(), fused_ref.view(), {}, {}});
  a.forward(FusedArgs{in.hidden.view(), in.logits.view(), out.view(), ids.view(), weights.view()}, ws.get(bytes),
            nullptr);
  EXPECT_EQ(bit_differences(out, fused_ref), 0);
  EXPECT_EQ(bit_differences(ids, in.routing.ids), 0);
}

INSTANTIATE_TEST_SUITE_P(Schemes, CoreLayerPrepared,
                         ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                           QuantScheme::fp8_block),
                         [](const auto& info) { return underscored(to_string(info.param)); });

TEST(CoreLayerWorkspace, ConcurrentCallsOnOneLayerEachWithItsOwnWorkspace) {
  LayerCase c;
  c.scheme = QuantScheme::fp8_block;
  c.hidden = 256, c.inter = 128, c.tokens = 7;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  const Layer layer(config_of(c), lw.weights(), on_cpu(c.tokens));
  const std::size_t bytes = layer.workspace_size(c.tokens);
  const Tensor expected = external_in(layer, in, HostWorkspace(bytes).get(bytes));
  std::vector<Tensor> outs(4);
  std::vector<std::thread> threads;
  for (auto& out : outs)
    threads.emplace_back([&] {
      HostWorkspace ws(bytes);
      for (int i = 0; i < 3; ++i) out = external_in(layer, in, ws.get(bytes));
    });
  for (auto& t : threads) t.join();
  for (const Tensor& out : outs) EXPECT_EQ(bit_differences(out, expected), 0);
}

TEST(CoreLayerWorkspace, BadWorkspacesAndTooManyTokensAreErrorsBeforeAnyOutput) {
  LayerCase c;
  c.tokens = 5;
  const TestLayer lw = make_test_layer(c, 3);
  const Inputs in = make_inputs(c, lw, 3);
  const Layer layer(config_of(c), lw.weights(), on_cpu(4));
  const std::size_t bytes = layer.workspace_size(4);
  HostWorkspace ws(bytes + 1);
  const Inputs four{row_slice(in.hidden, 0, 4), row_slice(in.logits, 0, 4), row_slice(in.routing, 0, 4)};
  Tensor out = poisoned_out(4, c.hidden), out5 = poisoned_out(5, c.hidden);
  auto call = [&](const Inputs& x, const Workspace& w) {
    const TensorView o = x.hidden.size(0) == 4 ? out.view() : out5.view();
    layer.forward(ExternalArgs{x.hidden.view(), x.routing.ids.view(), x.routing.weights.view(), o}, w, nullptr);
  };
  EXPECT_NE(error_of([&] { call(four, ws.get(bytes - 1)); }).find("workspace: expected at least"), std::string::npos);
  Workspace misaligned = ws.get(bytes + 1);
  misaligned.data = static_cast<std::byte*>(misaligned.data) + 1;
  EXPECT_NE(error_of([&] { call(four, misaligned); }).find("256-byte aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { call(four, {nullptr, bytes}); }).find("null pointer"), std::string::npos);
  const std::string too_many = error_of([&] { call(in, ws.get(bytes)); });
  EXPECT_NE(too_many.find("max_tokens=4"), std::string::npos) << too_many;
  for (const Tensor* t : {&out, &out5})
    for (std::int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->ptr<bf16>()[i].bits, 0xffff) << "out was written";
  EXPECT_NE(error_of([&] { layer.workspace_size(-1); }).find("max_tokens"), std::string::npos);
}

TEST(CoreLayerPrepared, TheWeightsMemoryTakesPartInTheBackendChoice) {
  LayerCase c;
  const TestLayer lw = make_test_layer(c, 5);
  Weights on_gpu = lw.weights();  // views tagged as device memory: only their layout is read
  for (TensorView* v : {&on_gpu.w13, &on_gpu.w2}) v->device = Device::cuda;
  const BackendSelection s = explain_backends(config_of(c), on_gpu, 64);
  bool cpu_refused = false;
  for (const BackendDecision& d : s.decisions)
    if (d.backend == "cpu") cpu_refused = !d.status && d.status.reason().find("cuda memory") != std::string::npos;
  EXPECT_TRUE(cpu_refused) << s.to_string();
  EXPECT_NE(error_of([&] { PreparedWeights p(config_of(c), on_gpu, on_cpu()); }).find("cuda memory"),
            std::string::npos);
  // Mixed memories are refused by name before any backend is asked.
  Weights mixed = lw.weights();
  mixed.w2.device = Device::cuda;
  EXPECT_NE(error_of([&] { PreparedWeights p(config_of(c), mixed); }).find("w2"), std::string::npos);
}

TEST(CoreLayerPrepared, ALayerKeepsThePreparedBackend) {
  LayerCase c;
  const TestLayer lw = make_test_layer(c, 7);
  const PreparedWeights prepared(config_of(c), lw.weights(), on_cpu());
  LayerOptions other;
  other.backend = "bogus";
  EXPECT_NE(error_of([&] { Layer l(prepared, other); }).find("prepared for 'cpu'"), std::string::npos);
  other.backend = "auto";
  other.max_tokens = -1;
  EXPECT_NE(error_of([&] { Layer l(prepared, other); }).find("max_tokens"), std::string::npos);
  const Layer layer(prepared);
  EXPECT_EQ(layer.selection().chosen, "cpu");
}

}  // namespace
}  // namespace moekit::test
