// Programmatic dependent launch (src/cuda/common/dependent_launch.cuh): the layer's kernels that begin
// while the kernel before them finishes, and the decode GEMM that streams its first weights before
// it waits, give the bits of the same kernels run one after the other (MOEKIT_PDL=off). A kernel
// that read or wrote too early would differ, now and then: each case runs several times, fused
// routing (the routing kernel first), the staged path (quantize, plan, gather, GEMMs, activation,
// finalize) at decode and prefill sizes, the masked format, and a captured graph's replays.
#include <cuda_runtime_api.h>

#include "cuda/common/launch.h"
#include "cuda_layer_util.h"

namespace moekit::test {
namespace {

LayerOptions on_cuda() {
  LayerOptions o;
  o.backend = "cuda";
  return o;
}

// Sets the switch for a scope, then puts back what it was.
struct DependentLaunch {
  explicit DependentLaunch(bool on) : before(cuda::dependent_launch_switch().exchange(on)) {}
  ~DependentLaunch() { cuda::dependent_launch_switch().store(before); }
  bool before;
};

struct Case {
  const char* name;
  QuantScheme scheme;
  std::int64_t experts, hidden, inter, tokens;
  int top_k;
  ExpertsPath path;
};

class CudaLayerDependentLaunch : public ::testing::TestWithParam<Case> {};

TEST_P(CudaLayerDependentLaunch, GivesTheBitsOfKernelsRunOneAfterTheOther) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Case& k = GetParam();
  LayerCase c;
  c.scheme = k.scheme;
  c.method = RoutingMethod::sigmoid_bias_grouped, c.n_group = 4, c.topk_group = 2;
  c.experts = k.experts, c.hidden = k.hidden, c.inter = k.inter, c.tokens = k.tokens, c.top_k = k.top_k;
  c.path = k.path;
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE(std::string(k.name) + " seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  Layer layer(config_of(c), lw.weights(), on_cuda());
  layer.reserve(c.tokens);
  const DeviceTensor h = on_gpu(in.hidden), logits = on_gpu(in.logits);
  DeviceTensor out = poisoned(DType::bf16, in.hidden.shape());
  DeviceTensor ids = poisoned(DType::i32, {c.tokens, c.top_k}), weights = poisoned(DType::f32, {c.tokens, c.top_k});
  auto forward = [&](cudaStream_t stream) {
    cudaMemsetAsync(out.view().data, 0xff, out.view().nbytes(), stream);
    layer.forward(FusedArgs{h.view(), logits.view(), out.view(), ids.view(), weights.view()}, stream);
  };
  Tensor serial;
  {
    const DependentLaunch off(false);
    forward(nullptr);
    synchronize(Device::cuda);
    serial = to_host(out);
  }
  EXPECT_EQ(bit_differences(to_host(ids), in.routing.ids), 0) << "ids must equal the CPU router's";
  const DependentLaunch on(true);
  for (int run = 0; run < 4; ++run) {
    forward(nullptr);
    synchronize(Device::cuda);
    ASSERT_EQ(bit_differences(to_host(out), serial), 0) << "run " << run;
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  forward(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 4; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(bit_differences(to_host(out), serial), 0) << "graph replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// fp8-block at 1, 3 and 64 tokens takes the decode GEMMs (the weights streamed before the wait),
// at 700 the prefill tiles; bf16 CUTLASS's GEMMs between the dependent kernels; the min-latency
// path's own three launches.
const Case kCases[] = {
    {"fp8_block_t1", QuantScheme::fp8_block, 64, 512, 256, 1, 8, ExpertsPath::staged},
    {"fp8_block_t3", QuantScheme::fp8_block, 64, 512, 256, 3, 8, ExpertsPath::staged},
    {"fp8_block_t64", QuantScheme::fp8_block, 64, 512, 256, 64, 8, ExpertsPath::staged},
    {"fp8_block_t700", QuantScheme::fp8_block, 16, 512, 256, 700, 4, ExpertsPath::staged},
    {"bf16_t8", QuantScheme::bf16, 32, 256, 128, 8, 4, ExpertsPath::staged},
    {"fp8_block_min_latency_t4", QuantScheme::fp8_block, 64, 512, 256, 4, 8, ExpertsPath::min_latency},
};

INSTANTIATE_TEST_SUITE_P(, CudaLayerDependentLaunch, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moekit::test
