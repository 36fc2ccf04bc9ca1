// CUDA activation quantization (Prepare) against the CPU: every scheme x scale format x weight
// placement, bit-identical codes and scales.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cpu/quant.h"
#include "cuda/quant/quantize.h"
#include "cuda_test_util.h"

namespace moekit {
namespace {

using test::DeviceArray;

struct Case {
  QuantScheme scheme;
  ScaleFormat format;
  WeightPlacement placement;
  cuda::quant::TensorScale tensor_scale;
  std::int64_t tokens;
  std::int64_t hidden;
};

std::string name(const Case& c) {
  std::string s = std::string(to_string(c.scheme)) + " " + std::string(to_string(c.format)) + " weights_on=" +
                  std::string(to_string(c.placement)) + " T=" + std::to_string(c.tokens) + " H=" + std::to_string(c.hidden);
  if (c.scheme == QuantScheme::fp8_tensor) s += c.tensor_scale == cuda::quant::TensorScale::given ? " given" : " dynamic";
  return s;
}

std::vector<Case> cases() {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes{{0, 128}, {1, 128}, {37, 400}, {129, 7168}, {65, 72}, {20, 13}};
  if (test::small_cases()) shapes = {{0, 128}, {1, 128}, {5, 400}, {3, 72}, {2, 13}};
  std::vector<Case> all;
  for (const QuantScheme scheme : {QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise, QuantScheme::fp8_block})
    for (const ScaleFormat format : {ScaleFormat::f32, ScaleFormat::ue8m0})
      for (const WeightPlacement placement : {WeightPlacement::output, WeightPlacement::input})
        for (const auto tensor_scale : {cuda::quant::TensorScale::dynamic, cuda::quant::TensorScale::given})
          for (const auto& [tokens, hidden] : shapes) {
            if (scheme == QuantScheme::fp8_block && hidden % 16 != 0) continue;  // the contract
            if (scheme != QuantScheme::fp8_tensor && tensor_scale == cuda::quant::TensorScale::given) continue;
            if (scheme == QuantScheme::bf16 && format == ScaleFormat::ue8m0) continue;
            all.push_back({scheme, format, placement, tensor_scale, tokens, hidden});
          }
  return all;
}

TEST(CudaQuantize, EverySchemeMatchesTheCpuBitForBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const std::int64_t n = c.tokens * c.hidden;
    // Mostly small values, a few large ones, so groups differ in scale.
    std::vector<std::uint16_t> hidden = test::random_bf16(std::size_t(n), -2.0f, 2.0f, rng);
    std::uniform_int_distribution<std::int64_t> pick(0, std::max<std::int64_t>(n - 1, 0));
    for (std::int64_t i = 0; i < n / 50; ++i) hidden[std::size_t(pick(rng))] = float_to_bf16(300.0f * float(i % 7 + 1)).bits;
    const std::vector<float> weights = test::random_f32(std::size_t(c.tokens), 0.05f, 1.0f, rng);
    // A given scale small enough that some values saturate at 448.
    const float given = 0.37f;

    // CPU: the Prepare stage's input rounding, then cpu::quantize_rows.
    const bool on_input = c.placement == WeightPlacement::input;
    std::vector<float> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = bf16_to_float(bf16{hidden[std::size_t(i)]});
      x[std::size_t(i)] = on_input ? round_to_bf16(v * weights[std::size_t(i / c.hidden)]) : v;
    }
    const QuantConfig quant{c.scheme, c.format};
    const bool fp8 = c.scheme != QuantScheme::bf16;
    const std::size_t q_bytes = std::size_t(n) * (fp8 ? 1 : 2);
    const std::vector<std::int64_t> shape_of_scales = moekit::scale_shape(c.scheme, c.tokens, c.hidden);
    std::int64_t scale_count = 1;
    for (const auto d : shape_of_scales) scale_count *= d;
    std::vector<std::uint8_t> cpu_q(q_bytes);
    std::vector<float> cpu_scales(static_cast<std::size_t>(scale_count));
    QuantizedRows cpu_out;
    cpu_out.q = TensorView::contiguous(cpu_q.data(), activation_dtype(c.scheme), {c.tokens, c.hidden});
    if (fp8) cpu_out.scales = TensorView::contiguous(cpu_scales.data(), DType::f32, shape_of_scales);
    const bool given_scale = c.scheme == QuantScheme::fp8_tensor && c.tensor_scale == cuda::quant::TensorScale::given;
    cpu::quantize_rows({quant, given_scale ? given : 0.0f}, x.data(), c.tokens, c.hidden, cpu_out);

    // GPU.
    const cuda::quant::Problem problem{quant, c.tokens, c.hidden, c.placement, c.tensor_scale};
    ASSERT_TRUE(cuda::quant::can_implement(problem)) << cuda::quant::can_implement(problem).reason();
    DeviceArray<std::uint16_t> d_hidden(hidden);
    DeviceArray<float> d_weights(weights), d_given(std::vector<float>{given});
    DeviceArray<std::uint8_t> d_q(q_bytes);
    DeviceArray<float> d_scales{std::size_t(scale_count)};
    d_q.poison();
    d_scales.poison();
    test::DeviceWorkspace ws(cuda::quant::workspace_size(problem));
    cuda::quant::run(problem, {d_hidden.data(), d_weights.data(), d_given.data(), d_q.data(), d_scales.data(), {}}, ws.get(),
                     nullptr);
    test::sync_and_check();
    const auto gpu_q = d_q.download();
    for (std::size_t i = 0; i < q_bytes; ++i) ASSERT_EQ(int(gpu_q[i]), int(cpu_q[i])) << "byte " << i;
    if (fp8 && c.tokens > 0) {
      const auto gpu_scales = d_scales.download();
      for (std::size_t i = 0; i < cpu_scales.size(); ++i) ASSERT_EQ(gpu_scales[i], cpu_scales[i]) << "scale " << i;
    }
  }
}

TEST(CudaQuantize, RejectsBlockWithoutWholeVectors) {
  EXPECT_FALSE(cuda::quant::can_implement({{QuantScheme::fp8_block, ScaleFormat::f32}, 4, 72}));
  EXPECT_TRUE(cuda::quant::can_implement({{QuantScheme::fp8_rowwise, ScaleFormat::f32}, 4, 72}));
  EXPECT_TRUE(cuda::quant::can_implement({{QuantScheme::fp8_block, ScaleFormat::ue8m0}, 0, 7168}));
}

}  // namespace
}  // namespace moekit
