// moekit::route refuses bad input with an Error naming the argument, before writing anything.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "routing_test_util.h"

namespace moekit {
namespace {

constexpr std::int64_t kT = 4;
constexpr std::int64_t kE = 8;
constexpr int kK = 2;

// A valid call (sigmoid_bias_grouped, so every rule applies) that one case then breaks.
struct Call {
  RoutingConfig config = test::routing_config(RoutingMethod::sigmoid_bias_grouped, kK, 4, 2, 2.5f);
  RoutingInputs in;
  RoutingOutputs out;
};

struct ValidationCase {
  std::string name;
  std::string argument;  // what the message must name
  std::function<void(Call&)> breaks;
};

void PrintTo(const ValidationCase& c, std::ostream* os) { *os << c.name; }

void reshape(TensorView& v, const std::vector<std::int64_t>& shape) {
  v = TensorView::contiguous(v.data, v.dtype, shape, v.device);
}

void retype(TensorView& v, DType dtype) { v.dtype = dtype; }

void move_to_cuda(TensorView& v) { v.device = Device::cuda; }

// Rows twice as far apart: the same shape over a larger buffer, not contiguous.
void spread_rows(TensorView& v) { v.strides[0] *= 2; }

const std::vector<ValidationCase>& validation_cases() {
  using C = Call&;
  static const std::vector<ValidationCase> cases = {
      {"method_external", "method", [](C c) { c.config.method = RoutingMethod::external; }},
      {"top_k_zero", "top_k", [](C c) { c.config.top_k = 0; }},
      {"top_k_above_E", "top_k", [](C c) { c.config.top_k = kE + 1; }},
      {"n_group_not_divisor", "n_group", [](C c) { c.config.n_group = 3; }},
      {"topk_group_above_n_group", "topk_group", [](C c) { c.config.topk_group = 5; }},
      {"top_k_beyond_kept_groups", "top_k", [](C c) { c.config.topk_group = 1; c.config.top_k = 3; }},
      {"scaling_factor_zero", "routed_scaling_factor", [](C c) { c.config.routed_scaling_factor = 0.0f; }},
      {"top1_sigmoid_k2", "top_k",
       [](C c) { c.config = test::routing_config(RoutingMethod::top1_sigmoid, 2); }},
      {"logits_absent", "router_logits", [](C c) { c.in.router_logits = TensorView{}; }},
      {"logits_rank1", "router_logits", [](C c) { reshape(c.in.router_logits, {kT * kE}); }},
      {"logits_i32", "router_logits", [](C c) { retype(c.in.router_logits, DType::i32); }},
      {"logits_f16", "router_logits", [](C c) { retype(c.in.router_logits, DType::f16); }},
#ifdef MOEKIT_HAVE_CUDA
      // The routing runs where router_logits are: the host bias is then the wrong memory.
      {"logits_cuda", "bias", [](C c) { move_to_cuda(c.in.router_logits); }},
#else
      {"logits_cuda", "router_logits", [](C c) { move_to_cuda(c.in.router_logits); }},
#endif
      {"logits_strided", "router_logits", [](C c) { spread_rows(c.in.router_logits); }},
      {"logits_null", "router_logits", [](C c) { c.in.router_logits.data = nullptr; }},
      {"bias_absent", "bias", [](C c) { c.in.bias = TensorView{}; }},
      {"bias_absent_renorm", "bias",
       [](C c) {
         c.config = test::routing_config(RoutingMethod::sigmoid_bias_renorm, kK);
         c.in.bias = TensorView{};
       }},
      {"bias_wrong_length", "bias", [](C c) { reshape(c.in.bias, {kE - 1}); }},
      {"bias_rank2", "bias", [](C c) { reshape(c.in.bias, {1, kE}); }},
      {"bias_i32", "bias", [](C c) { retype(c.in.bias, DType::i32); }},
      {"bias_cuda", "bias", [](C c) { move_to_cuda(c.in.bias); }},
      {"ids_absent", "topk_ids", [](C c) { c.out.topk_ids = TensorView{}; }},
      {"ids_wrong_k", "topk_ids", [](C c) { reshape(c.out.topk_ids, {kT, kK - 1}); }},
      {"ids_wrong_T", "topk_ids", [](C c) { reshape(c.out.topk_ids, {kT - 1, kK}); }},
      {"ids_i64", "topk_ids", [](C c) { retype(c.out.topk_ids, DType::i64); }},
      {"ids_cuda", "topk_ids", [](C c) { move_to_cuda(c.out.topk_ids); }},
      {"ids_strided", "topk_ids", [](C c) { spread_rows(c.out.topk_ids); }},
      {"weights_absent", "topk_weights", [](C c) { c.out.topk_weights = TensorView{}; }},
      {"weights_rank3", "topk_weights", [](C c) { reshape(c.out.topk_weights, {kT, kK, 1}); }},
      {"weights_bf16", "topk_weights", [](C c) { retype(c.out.topk_weights, DType::bf16); }},
      {"weights_cuda", "topk_weights", [](C c) { move_to_cuda(c.out.topk_weights); }},
      {"weights_null", "topk_weights", [](C c) { c.out.topk_weights.data = nullptr; }},
  };
  return cases;
}

class RoutingValidation : public ::testing::TestWithParam<ValidationCase> {};

TEST_P(RoutingValidation, NamesArgumentAndWritesNothing) {
  const ValidationCase& c = GetParam();
  // Buffers twice the valid size, so views a case reshapes or strides still lie inside them.
  Tensor logits(DType::f32, {2 * kT, kE});
  Tensor bias(DType::f32, {2 * kE});
  Tensor ids(DType::i32, {2 * kT, kK});
  Tensor weights(DType::f32, {2 * kT, kK});
  for (std::int64_t i = 0; i < logits.numel(); ++i) logits.ptr<float>()[i] = float(i % 7);
  for (std::int64_t i = 0; i < bias.numel(); ++i) bias.ptr<float>()[i] = 0.0f;
  test::poison(ids.view());
  test::poison(weights.view());
  Call call;
  call.in.router_logits = TensorView::contiguous(logits.ptr<float>(), DType::f32, {kT, kE});
  call.in.bias = TensorView::contiguous(bias.ptr<float>(), DType::f32, {kE});
  call.out.topk_ids = TensorView::contiguous(ids.ptr<std::int32_t>(), DType::i32, {kT, kK});
  call.out.topk_weights = TensorView::contiguous(weights.ptr<float>(), DType::f32, {kT, kK});
  c.breaks(call);

  try {
    route(call.config, call.in, call.out);
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(c.argument + ":", 0), 0u)
        << "message should start with '" << c.argument << ":', is: " << e.what();
  }
  const std::vector<unsigned char> poisoned(ids.nbytes(), 0xff);
  EXPECT_EQ(0, std::memcmp(ids.ptr<void>(), poisoned.data(), ids.nbytes())) << "topk_ids written";
  EXPECT_EQ(0, std::memcmp(weights.ptr<void>(), poisoned.data(), weights.nbytes())) << "topk_weights written";
}

INSTANTIATE_TEST_SUITE_P(Rules, RoutingValidation, ::testing::ValuesIn(validation_cases()),
                         [](const auto& info) { return info.param.name; });

// The message also says what was expected and what was given (DESIGN §8).
TEST(RoutingValidationMessage, SaysExpectedAndGiven) {
  float logits[3] = {};
  std::int32_t ids[1];
  float weights[1];
  RoutingInputs in{TensorView::contiguous(logits, DType::f32, {3}), {}};
  RoutingOutputs out{TensorView::contiguous(ids, DType::i32, {1, 1}),
                     TensorView::contiguous(weights, DType::f32, {1, 1})};
  try {
    route(test::routing_config(RoutingMethod::softmax_topk, 1), in, out);
    ADD_FAILURE() << "no Error thrown";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "router_logits: expected rank 2 [T, E], given [3] f32 cpu");
  }
}

// A bias given to a method without one is not part of its formula, so it is simply unused.
TEST(RoutingValidationMessage, BiasIgnoredWhereUnused) {
  const Tensor logits = test::make_tensor(DType::f32, {1, 4}, {0, 3, 1, 2});
  const Tensor odd_bias = test::make_tensor(DType::f32, {2}, {100, 100});
  const RoutingConfig config = test::routing_config(RoutingMethod::sigmoid_topk, 2);
  const test::Routed r = test::route_logits(config, logits, &odd_bias);
  EXPECT_EQ(r.ids, (std::vector<std::int32_t>{1, 3}));
}

}  // namespace
}  // namespace moekit
