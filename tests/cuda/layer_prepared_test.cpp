// The engine's API on the GPU: weights already in device memory are borrowed (only the FP8
// scales are rewritten), a caller workspace on a stream allocates nothing and captures in a
// CUDA graph without reserve(), and the output is the bits of a Layer made from host weights.
#include <cuda_runtime_api.h>

#include "cpu/layer_util.h"
#include "cuda_test_util.h"
#include "moekit/device.h"

namespace moekit::test {
namespace {

DeviceTensor to_device(const TensorView& host) {
  DeviceTensor d(host.dtype, host.shape_vector(), Device::cuda);
  d.copy_from(host);
  return d;
}

Tensor to_host(const TensorView& d) {
  Tensor t(d.dtype, d.shape_vector());
  EXPECT_EQ(cudaMemcpy(t.view().data, d.data, d.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return t;
}

// A layer's weights copied into device memory, and the views of them.
struct DeviceLayer {
  std::vector<DeviceTensor> tensors;
  Weights weights;

  explicit DeviceLayer(const Weights& host) {
    weights = host;
    for (TensorView* v : {&weights.w13, &weights.w2, &weights.w13_scale, &weights.w2_scale,
                          &weights.e_score_correction_bias, &weights.w13_input_scale, &weights.w2_input_scale})
      if (v->defined()) *v = tensors.emplace_back(to_device(*v)).view();
  }
};

LayerOptions cuda_options(std::int64_t max_tokens) {
  LayerOptions o;
  o.backend = "cuda";
  o.max_tokens = max_tokens;
  return o;
}

std::size_t expected_owned_bytes(const MoEConfig& c) {
  const std::int64_t el = c.local_experts(), kb1 = ceil_div(c.hidden_size, kBlock), kb2 = ceil_div(c.intermediate_size, kBlock);
  switch (c.quant.scheme) {
    case QuantScheme::bf16: return 0;
    case QuantScheme::fp8_block:
      return std::size_t(el * kb1 * ceil_div(c.gemm1_width(), kBlock) + el * kb2 * ceil_div(c.hidden_size, kBlock)) * 4;
    case QuantScheme::fp8_rowwise:
    case QuantScheme::fp8_tensor: return std::size_t(el * kb1 * c.gemm1_width() + el * kb2 * c.hidden_size) * 4;
  }
  return 0;
}

class CudaLayerPrepared : public ::testing::TestWithParam<QuantScheme> {};

TEST_P(CudaLayerPrepared, BorrowedWeightsAndCallerWorkspaceGiveTheHostLayersBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  LayerCase c;
  c.scheme = GetParam();
  c.experts = 16, c.hidden = 256, c.inter = 256, c.tokens = 37, c.top_k = 4;
  c.method = RoutingMethod::sigmoid_bias_renorm;  // a routing bias, borrowed too
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer lw = make_test_layer(c, seed);
  const Inputs in = make_inputs(c, lw, seed);
  const MoEConfig config = config_of(c);

  Layer from_host(config, lw.weights(), cuda_options(0));
  const DeviceTensor h = to_device(in.hidden.view()), logits = to_device(in.logits.view());
  DeviceTensor expected(DType::bf16, in.hidden.shape(), Device::cuda);
  from_host.forward(FusedArgs{h.view(), logits.view(), expected.view(), {}, {}});

  const DeviceLayer device(lw.weights());
  const PreparedWeights prepared(config, device.weights, cuda_options(c.tokens));
  EXPECT_EQ(prepared.owned_bytes(), expected_owned_bytes(config)) << "only the FP8 scales are copied";
  const Layer layer(prepared, cuda_options(c.tokens));
  const std::size_t bytes = layer.workspace_size(c.tokens);
  DeviceTensor workspace(DType::u8, {std::int64_t(bytes)}, Device::cuda);
  DeviceTensor out(DType::bf16, in.hidden.shape(), Device::cuda);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const FusedArgs args{h.view(), logits.view(), out.view(), {}, {}};
  const Workspace ws{workspace.view().data, bytes};

  // Captured as it is: no reserve, nothing allocated.
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  layer.forward(args, ws, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(layer.workspace_bytes(), 0u);
  for (int replay = 0; replay < 2; ++replay) {
    cudaMemsetAsync(out.view().data, 0xff, out.view().nbytes(), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(bit_differences(to_host(out.view()), to_host(expected.view())), 0) << "replay " << replay;
  }
  cudaMemsetAsync(out.view().data, 0xff, out.view().nbytes(), stream);
  layer.forward(args, ws, stream);  // eager, on the same stream
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(bit_differences(to_host(out.view()), to_host(expected.view())), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Schemes, CudaLayerPrepared,
                         ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                           QuantScheme::fp8_block),
                         [](const auto& info) { return underscored(to_string(info.param)); });

TEST(CudaLayerPreparedErrors, HostMemoryPassedAsDeviceMemoryIsRefusedByName) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  LayerCase c;
  c.hidden = 256, c.inter = 128;
  const TestLayer lw = make_test_layer(c, 11);
  DeviceLayer device(lw.weights());
  device.weights.w2 = lw.weights().w2;
  device.weights.w2.device = Device::cuda;  // a host pointer, said to be device memory
  try {
    PreparedWeights p(config_of(c), device.weights, cuda_options(0));
    FAIL() << "expected moekit::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w2: expected CUDA device memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit::test
