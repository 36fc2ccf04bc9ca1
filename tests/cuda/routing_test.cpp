// CUDA routing against the CPU reference (cpu/routing.cpp): every method x logits dtype x bias
// dtype, on fresh random logits, with NaN logits, E up to 512 (registers) and beyond (shared).
// Ids must be identical; weights within 4 ulp: the GPU's exp is correctly rounded, the host's
// expf (glibc) is off by an ulp for about 1 argument in 13,000, and such an ulp in one score
// can move a renormalizing sum by an ulp, hence each weight by up to 3, then the scaling factor
// rounds once more. Most weights are bit-identical; the test prints how many.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/routing/route.h"
#include "cuda_test_util.h"
#include "moekit/routing.h"

namespace moekit {
namespace {

using test::DeviceArray;

struct Shape {
  std::int64_t tokens;
  std::int64_t experts;
  int top_k;
  int n_group;
  int topk_group;
};

std::string name(const Shape& s) {
  return "T=" + std::to_string(s.tokens) + " E=" + std::to_string(s.experts) + " k=" + std::to_string(s.top_k) +
         " groups=" + std::to_string(s.n_group) + "/" + std::to_string(s.topk_group);
}

std::vector<Shape> shapes() {
  if (test::small_cases()) return {{0, 64, 4, 4, 2}, {1, 8, 2, 2, 1}, {37, 60, 6, 6, 3}, {20, 256, 8, 8, 4}, {9, 1000, 12, 8, 2}};
  return {
      {0, 64, 4, 4, 2},       // no tokens
      {1, 8, 2, 2, 1},        // one token, Mixtral-sized
      {257, 60, 6, 6, 3},     // E not a power of two
      {100, 90, 6, 6, 3},     // E % 4 != 0: scalar loads
      {300, 72, 8, 8, 4},     // E % 8 == 0, not of 32
      {513, 128, 8, 8, 4},    // Qwen3
      {700, 256, 8, 8, 4},    // DeepSeek-V3
      {300, 384, 16, 8, 4},
      {257, 512, 32, 8, 4},   // the largest register case
      {64, 1000, 12, 8, 2},   // shared-memory path
      {33, 2048, 40, 16, 4},  // shared-memory path, k > 32
  };
}

const RoutingMethod kMethods[] = {RoutingMethod::softmax_topk,        RoutingMethod::topk_softmax,
                                  RoutingMethod::softmax_topk_renorm, RoutingMethod::sigmoid_topk,
                                  RoutingMethod::sigmoid_topk_renorm, RoutingMethod::sigmoid_bias_grouped,
                                  RoutingMethod::sigmoid_bias_renorm, RoutingMethod::top1_sigmoid};

// Logits in [-spread, spread); with `nans`, about 3% NaN and token 0 (when there is one) all NaN.
Tensor make_logits(const Shape& s, DType dtype, bool nans, float spread, std::mt19937_64& rng) {
  Tensor t(dtype, {s.tokens, s.experts});
  test::fill_uniform(t, -spread, spread, rng);
  if (!nans) return t;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (i >= s.experts && u(rng) > 0.03f) continue;
    if (dtype == DType::f32) t.ptr<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    else t.ptr<bf16>()[i] = bf16{0x7fc0};
  }
  return t;
}

struct Counts {
  std::int64_t weights = 0, exact = 0, max_ulp = 0;
};

// How a case departs from the common one: NaN logits, logits over a wider range (sigmoids
// outside the kernels' fast range), the bias one element past an aligned address.
struct Variant {
  bool nans = false;
  float spread = 4.0f;
  int bias_offset = 0;
};

void check_case(RoutingMethod method, const Shape& s, DType logits_dtype, DType bias_dtype, const Variant& v,
                std::mt19937_64& rng, Counts& counts) {
  RoutingConfig config;
  config.method = method;
  config.top_k = method == RoutingMethod::top1_sigmoid ? 1 : s.top_k;
  config.n_group = method == RoutingMethod::sigmoid_bias_grouped ? s.n_group : 1;
  config.topk_group = method == RoutingMethod::sigmoid_bias_grouped ? s.topk_group : 1;
  config.routed_scaling_factor = method == RoutingMethod::sigmoid_bias_grouped ? 2.5f : 1.5f;
  SCOPED_TRACE(std::string(to_string(method)) + " " + name(s) + " logits=" + std::string(to_string(logits_dtype)) +
               " bias=" + std::string(to_string(bias_dtype)) + (v.nans ? " with NaN" : "") +
               " spread=" + std::to_string(v.spread) + " bias offset=" + std::to_string(v.bias_offset));
  const int k = config.top_k;
  const Tensor logits = make_logits(s, logits_dtype, v.nans, v.spread, rng);
  Tensor bias(bias_dtype, {s.experts});
  test::fill_uniform(bias, -0.5f, 0.5f, rng);

  // CPU reference.
  Tensor ids(DType::i32, {s.tokens, k}), weights(DType::f32, {s.tokens, k});
  route(config, {logits.view(), config.uses_bias() ? bias.view() : TensorView{}}, {ids.view(), weights.view()});

  // GPU.
  cuda::routing::Problem problem{config, s.tokens, s.experts, logits_dtype, bias_dtype};
  ASSERT_TRUE(cuda::routing::can_implement(problem)) << cuda::routing::can_implement(problem).reason();
  const std::size_t bias_at = std::size_t(v.bias_offset) * dtype_size(bias_dtype);
  DeviceArray<std::uint8_t> d_logits(logits.nbytes()), d_bias(bias_at + bias.nbytes());
  ASSERT_EQ(cudaMemcpy(d_logits.data(), logits.view().data, logits.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_bias.data() + bias_at, bias.view().data, bias.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  DeviceArray<std::int32_t> d_ids{std::size_t(s.tokens * k)};
  DeviceArray<float> d_weights{std::size_t(s.tokens * k)};
  d_ids.poison();
  d_weights.poison();
  cuda::routing::run(problem, {d_logits.data(), d_bias.data() + bias_at, d_ids.data(), d_weights.data()}, {}, nullptr);
  test::sync_and_check();
  const std::vector<std::int32_t> gpu_ids = d_ids.download();
  const std::vector<float> gpu_weights = d_weights.download();

  for (std::int64_t t = 0; t < s.tokens; ++t) {
    bool token_nan = false;
    for (std::int64_t e = 0; e < s.experts; ++e) {
      const std::int64_t i = t * s.experts + e;
      token_nan |= std::isnan(logits_dtype == DType::f32 ? logits.ptr<float>()[i] : bf16_to_float(logits.ptr<bf16>()[i]));
    }
    for (int j = 0; j < k; ++j) {
      const std::size_t i = std::size_t(t * k + j);
      ASSERT_EQ(gpu_ids[i], ids.ptr<std::int32_t>()[i]) << "token " << t << " slot " << j;
      const float want = weights.ptr<float>()[i], got = gpu_weights[i];
      if (token_nan && (std::isnan(want) || std::isnan(got))) continue;  // unspecified (DESIGN §3)
      const std::int64_t ulp = test::ulp_distance(got, want);
      ++counts.weights;
      counts.exact += ulp == 0;
      counts.max_ulp = std::max(counts.max_ulp, ulp);
      ASSERT_LE(ulp, 4) << "token " << t << " slot " << j << ": gpu " << got << " cpu " << want;
    }
  }
}

struct Case {
  RoutingMethod method;
  Shape shape;
  DType logits, bias;
  Variant variant;
};

// The cases in turn on one fresh seed, each against the CPU; stops at the first fatal failure.
Counts check_cases(const std::vector<Case>& cases) {
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Counts counts;
  for (const Case& c : cases) {
    check_case(c.method, c.shape, c.logits, c.bias, c.variant, rng, counts);
    if (::testing::Test::HasFatalFailure()) break;
  }
  return counts;
}

TEST(CudaRouting, EveryMethodMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Case> cases;
  for (const RoutingMethod method : kMethods)
    for (const Shape& s : shapes())
      for (const DType logits_dtype : {DType::f32, DType::bf16}) {
        const bool biased = method == RoutingMethod::sigmoid_bias_grouped || method == RoutingMethod::sigmoid_bias_renorm;
        cases.push_back({method, s, logits_dtype, DType::f32, {}});
        if (biased) cases.push_back({method, s, logits_dtype, DType::bf16, {}});
      }
  const Counts counts = check_cases(cases);
  std::printf("routing: %lld weights, %lld bit-identical, max %lld ulp\n", static_cast<long long>(counts.weights),
              static_cast<long long>(counts.exact), static_cast<long long>(counts.max_ulp));
}

TEST(CudaRouting, NanLogitsRankBelowNumbers) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Case> cases;
  for (const RoutingMethod method : kMethods)
    for (const Shape& s : {Shape{65, 256, 8, 8, 4}, Shape{40, 60, 6, 6, 3}, Shape{20, 1000, 12, 8, 2}})
      for (const DType dtype : {DType::f32, DType::bf16}) cases.push_back({method, s, dtype, DType::f32, {true}});
  check_cases(cases);
}

// Logits up to +-120: sigmoids of x <= -64 or x >= 100 leave the kernels' fast path (and
// e^-x over- or underflows), next to ordinary ones in the same lane.
TEST(CudaRouting, LargeLogitsMatchTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Case> cases;
  for (const RoutingMethod method : kMethods)
    for (const Shape& s : {Shape{300, 256, 8, 8, 4}, Shape{200, 128, 8, 8, 4}, Shape{40, 60, 6, 6, 3}})
      cases.push_back({method, s, DType::f32, DType::f32, {false, 120.0f}});
  check_cases(cases);
}

// A bias that is not 16-byte aligned (each block stages it in shared memory, where the lanes
// read it a vector at a time).
TEST(CudaRouting, MisalignedBiasMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<Case> cases;
  for (const RoutingMethod method : {RoutingMethod::sigmoid_bias_grouped, RoutingMethod::sigmoid_bias_renorm})
    for (const Shape& s : {Shape{300, 256, 8, 8, 4}, Shape{200, 128, 8, 8, 4}})
      for (const DType bias_dtype : {DType::f32, DType::bf16})
        cases.push_back({method, s, DType::f32, bias_dtype, {false, 4.0f, 1}});
  check_cases(cases);
}

// Ties: bf16 logits on a coarse grid tie often; the lower expert must win, as on the CPU.
TEST(CudaRouting, TiesGoToTheLowerExpert) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Shape s{200, 256, 8, 8, 4};
  for (const RoutingMethod method : kMethods) {
    SCOPED_TRACE(std::string(to_string(method)));
    RoutingConfig config;
    config.method = method;
    config.top_k = method == RoutingMethod::top1_sigmoid ? 1 : s.top_k;
    if (method == RoutingMethod::sigmoid_bias_grouped) config.n_group = 8, config.topk_group = 4;
    Tensor logits(DType::f32, {s.tokens, s.experts});
    std::uniform_int_distribution<int> level(0, 3);
    for (std::int64_t i = 0; i < logits.numel(); ++i) logits.ptr<float>()[i] = float(level(rng));
    Tensor bias(DType::f32, {s.experts});
    for (std::int64_t e = 0; e < s.experts; ++e) bias.ptr<float>()[e] = 0.0f;
    const int k = config.top_k;
    Tensor ids(DType::i32, {s.tokens, k}), weights(DType::f32, {s.tokens, k});
    route(config, {logits.view(), config.uses_bias() ? bias.view() : TensorView{}}, {ids.view(), weights.view()});
    DeviceArray<float> d_logits(std::vector<float>(logits.ptr<float>(), logits.ptr<float>() + logits.numel()));
    DeviceArray<float> d_bias(std::vector<float>(std::size_t(s.experts), 0.0f));
    DeviceArray<std::int32_t> d_ids{std::size_t(s.tokens * k)};
    DeviceArray<float> d_weights{std::size_t(s.tokens * k)};
    d_ids.poison();
    d_weights.poison();
    cuda::routing::run({config, s.tokens, s.experts, DType::f32, DType::f32},
                       {d_logits.data(), d_bias.data(), d_ids.data(), d_weights.data()}, {}, nullptr);
    test::sync_and_check();
    const auto gpu_ids = d_ids.download();
    for (std::size_t i = 0; i < gpu_ids.size(); ++i) ASSERT_EQ(gpu_ids[i], ids.ptr<std::int32_t>()[i]) << "slot " << i;
  }
}

TEST(CudaRouting, RejectsWhatItCannotRun) {
  RoutingConfig config;
  config.method = RoutingMethod::external;
  EXPECT_FALSE(cuda::routing::can_implement({config, 4, 64, DType::f32, DType::f32}));
  config.method = RoutingMethod::softmax_topk;
  config.top_k = 4;
  EXPECT_FALSE(cuda::routing::can_implement({config, 4, cuda::routing::kMaxExperts + 1, DType::f32, DType::f32}));
  EXPECT_FALSE(cuda::routing::can_implement({config, 4, 64, DType::i32, DType::f32}));
  EXPECT_TRUE(cuda::routing::can_implement({config, 4, 64, DType::bf16, DType::f32}));
  // T·k slots below 2^31 (the kernel's token count is an int): k = 1 at 2^31 tokens was taken and
  // wrapped to a negative count, which routed nothing.
  config.top_k = 1;
  EXPECT_TRUE(cuda::routing::can_implement({config, (std::int64_t(1) << 31) - 1, 64, DType::f32, DType::f32}));
  EXPECT_FALSE(cuda::routing::can_implement({config, std::int64_t(1) << 31, 64, DType::f32, DType::f32}));
  config.top_k = 4;
  EXPECT_FALSE(cuda::routing::can_implement({config, std::int64_t(1) << 29, 64, DType::f32, DType::f32}));
}

}  // namespace
}  // namespace moekit
