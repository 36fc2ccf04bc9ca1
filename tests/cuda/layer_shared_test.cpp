// Shared experts (MoEConfig::shared_experts) on the GPU: the layer appends them to every token's
// routing on the device (cuda/shared/append.h) and the grouped GEMMs run them as local experts.
// Each output meets DESIGN §8's check against the reference written from their definition, the
// routed layer and the shared experts run alone and summed (cpu/shared_util.h), and the ideal one;
// staged and min-latency paths, fused and external routing, decode to prefill sizes. Then: fused
// equals external, a CUDA graph replays it, and a caller's id outside [0, E) stays "no expert"
// (in the stages' id space E is the first shared expert).
#include <cuda_runtime_api.h>

#include <set>

#include "cpu/shared_util.h"
#include "cuda_layer_util.h"

namespace moekit::test {
namespace {

LayerOptions on_cuda() {
  LayerOptions o;
  o.backend = "cuda";
  return o;
}

Tensor gpu_external(Layer& layer, const Tensor& hidden, const Routing& r) {
  const DeviceTensor h = on_gpu(hidden), ids = on_gpu(r.ids), w = on_gpu(r.weights);
  DeviceTensor out = poisoned(DType::bf16, hidden.shape());
  layer.forward(ExternalArgs{h.view(), ids.view(), w.view(), out.view()});
  synchronize(Device::cuda);
  return to_host(out);
}

// The references of a shared-expert case: the routed and shared layers apart, and the ideal. Dynamic
// fp8-tensor quantizes the activations of every row, the shared experts' too, with one amax: the
// parts alone would take two; the library's reference of the fused layer then.
References shared_references(const LayerCase& c, const TestLayer& lw, std::uint64_t seed, const Inputs& in) {
  const MoEConfig config = config_of(c);
  const bool one_amax = c.scheme == QuantScheme::fp8_tensor && !c.static_scales;
  References refs{one_amax ? run_pipeline_reference(config, lw.weights(), in.hidden, in.routing)
                           : apart_reference(config, lw.weights(), in.hidden, in.routing),
                  {}};
  const cpu::ReferenceInputs ri{config, lw.weights(), in.hidden.view(), in.routing.ids.view(), in.routing.weights.view()};
  refs.ideal = cpu::ideal_reference(ri, core::SyntheticMaster(config, seed));
  return refs;
}

LayerCase base_case() {
  LayerCase c;
  c.scheme = QuantScheme::fp8_block;
  c.method = RoutingMethod::sigmoid_bias_grouped;  // DeepSeek-V3's
  c.experts = 32, c.hidden = 256, c.inter = 256, c.top_k = 4, c.n_group = 8, c.topk_group = 4;
  c.shared = 1;
  return c;
}

std::vector<LayerCase> cases() {
  std::vector<LayerCase> list;
  for (const QuantScheme s : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block})
    for (const std::int64_t t : {1, 64, 800}) {
      LayerCase c = base_case();
      c.scheme = s;
      c.tokens = t;
      list.push_back(c);
      c.method = RoutingMethod::external, c.n_group = c.topk_group = 1;
      c.ids = Ids::some_none;
      c.shared = 2;
      c.shared_weight = 0.75f;
      list.push_back(c);
    }
  auto with = [&](auto edit) {
    LayerCase c = base_case();
    edit(c);
    list.push_back(c);
  };
  // The min-latency path (bf16 layers): the shared expert's T rows in entries of <= 32.
  for (const std::int64_t t : {1, 8, 64})
    with([&](LayerCase& c) { c.path = ExpertsPath::min_latency, c.tokens = t, c.scheme = QuantScheme::bf16; });
  with([](LayerCase& c) { c.path = ExpertsPath::staged, c.tokens = 8; });
  with([](LayerCase& c) { c.tokens = 3000; });                                  // 128-row tiles
  with([](LayerCase& c) { c.tokens = 300, c.accumulation = Fp8Accumulation::exact; });
  with([](LayerCase& c) { c.tokens = 300, c.accumulation = Fp8Accumulation::strict; });
  with([](LayerCase& c) { c.tokens = 300, c.activation = Activation::relu2, c.shared = 2; });
  with([](LayerCase& c) { c.tokens = 0; });
  if (!small_cases()) return list;
  std::vector<LayerCase> small;  // sanitizer runs: the same kernels, fewer rows (a case that becomes another once
  std::set<std::string> names;   // shrunk runs once)
  for (LayerCase c : list) {
    c.tokens = std::min<std::int64_t>(c.tokens, 300);
    if (names.insert(case_name(c)).second) small.push_back(c);
  }
  return small;
}

class CudaLayerShared : public ::testing::TestWithParam<LayerCase> {};

TEST_P(CudaLayerShared, MeetsTheCheckAgainstTheRoutedLayerPlusTheSharedExperts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const LayerCase c = GetParam();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const MoEConfig config = config_of(c);
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  Layer layer(config, lw.weights(), on_cuda());
  ASSERT_EQ(layer.backend_name(), "cuda");
  Tensor out;
  if (c.method == RoutingMethod::external) {
    out = gpu_external(layer, in.hidden, in.routing);
  } else {
    // Fused: the routing handed back is the routed slots alone; external with it gives the same bits.
    const DeviceTensor h = on_gpu(in.hidden), logits = on_gpu(in.logits);
    DeviceTensor d_out = poisoned(DType::bf16, in.hidden.shape());
    DeviceTensor ids = poisoned(DType::i32, {c.tokens, c.top_k}), weights = poisoned(DType::f32, {c.tokens, c.top_k});
    layer.forward(FusedArgs{h.view(), logits.view(), d_out.view(), ids.view(), weights.view()});
    synchronize(Device::cuda);
    out = to_host(d_out);
    const Routing got{to_host(ids), to_host(weights)};
    EXPECT_EQ(bit_differences(got.ids, in.routing.ids), 0) << "ids must equal the CPU router's";
    EXPECT_EQ(bit_differences(gpu_external(layer, in.hidden, got), out), 0) << "fused and external routing must agree";
  }
  expect_meets_the_check(design_check(out, shared_references(c, lw, seed, in), config.quant), c);
  if (c.method == RoutingMethod::external) {
    EXPECT_EQ(bit_differences(gpu_external(layer, in.hidden, in.routing), out), 0) << "run to run";
  }
}

INSTANTIATE_TEST_SUITE_P(, CudaLayerShared, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return case_name(info.param); });

// The appended routing is on the device and allocates nothing: a CUDA graph of the workspace form
// replays it on new tokens with the eager call's bits (staged and min-latency paths).
TEST(CudaLayerSharedGraph, ReplaysWithTheEagerBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const ExpertsPath path : {ExpertsPath::staged, ExpertsPath::min_latency}) {
    LayerCase c = base_case();
    c.path = path;
    if (path == ExpertsPath::min_latency) c.scheme = QuantScheme::bf16;  // the path's layers
    c.tokens = 16;
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(case_name(c) + " seed " + std::to_string(seed));
    const TestLayer lw = make_test_layer(c, seed);
    Layer layer(config_of(c), lw.weights(), on_cuda());
    DeviceTensor h = poisoned(DType::bf16, {c.tokens, c.hidden}), logits = poisoned(DType::f32, {c.tokens, c.experts});
    DeviceTensor out = poisoned(DType::bf16, {c.tokens, c.hidden});
    DeviceTensor ws(DType::u8, {std::int64_t(layer.workspace_size(c.tokens))}, Device::cuda);  // 256-byte aligned
    const Workspace workspace{ws.view().data, layer.workspace_size(c.tokens)};
    const FusedArgs args{h.view(), logits.view(), out.view(), {}, {}};
    cudaStream_t stream;
    MOEKIT_EXPECT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    layer.forward(args, workspace, stream);  // first-call host setup (kernel attributes) outside the capture
    MOEKIT_EXPECT_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    MOEKIT_EXPECT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    layer.forward(args, workspace, stream);
    MOEKIT_EXPECT_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    MOEKIT_EXPECT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (std::uint64_t round = 0; round < 2; ++round) {
      const Inputs in = make_inputs(c, lw, seed + round);
      h.copy_from(in.hidden.view());
      logits.copy_from(in.logits.view());
      MOEKIT_EXPECT_CUDA(cudaGraphLaunch(exec, stream));
      MOEKIT_EXPECT_CUDA(cudaStreamSynchronize(stream));
      const Tensor replayed = to_host(out);
      cudaMemset(out.view().data, 0xff, out.view().nbytes());
      layer.forward(args, workspace, stream);
      MOEKIT_EXPECT_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(bit_differences(replayed, to_host(out)), 0) << "round " << round;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

// The stages see E + s as shared expert s (one GPU): a caller's id E, or any outside [0, E), is
// still no expert, as -1 is, and never runs a shared expert twice.
TEST(CudaLayerSharedIds, AnIdOutsideTheRoutedExpertsIsNoExpert) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  LayerCase c = base_case();
  c.method = RoutingMethod::external, c.n_group = c.topk_group = 1;
  c.tokens = 40;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  Layer layer(config_of(c), lw.weights(), on_cuda());
  Routing odd{clone(in.routing.ids), clone(in.routing.weights)}, none{clone(in.routing.ids), clone(in.routing.weights)};
  const std::int32_t outside[] = {std::int32_t(c.experts), std::int32_t(c.experts + 1), -7, 1 << 30};
  for (std::int64_t t = 0; t < c.tokens; t += 3) {
    odd.ids.ptr<std::int32_t>()[t * c.top_k + 1] = outside[(t / 3) % 4];
    none.ids.ptr<std::int32_t>()[t * c.top_k + 1] = -1;
  }
  EXPECT_EQ(bit_differences(gpu_external(layer, in.hidden, odd), gpu_external(layer, in.hidden, none)), 0);
}

}  // namespace
}  // namespace moekit::test
