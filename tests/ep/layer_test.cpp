// An EP layer over the ranks of the run against an ep = 1 layer on the whole batch: the CPU
// backend's exact combine must give the same bits, for every routing method and quant
// scheme, whatever the tokens per rank. Every rank generates the full layer too (small
// shapes: E = 12 divides 1, 2, 3, 4 ranks) and compares its own rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

#include "core/synthetic.h"
#include "ep/ep_test_util.h"
#include "moekit/moekit.h"

namespace moekit::test {
namespace {

constexpr std::int64_t kExperts = 12, kHidden = 256, kInter = 256;

MoEConfig make_config(RoutingMethod method, QuantScheme quant) {
  MoEConfig c;
  c.num_experts = kExperts;
  c.hidden_size = kHidden;
  c.intermediate_size = kInter;
  c.quant.scheme = quant;
  c.routing.method = method;
  c.routing.top_k = method == RoutingMethod::top1_sigmoid ? 1 : 4;
  if (method == RoutingMethod::sigmoid_bias_grouped) {
    c.routing.n_group = 4;
    c.routing.topk_group = 2;
  }
  if (c.routing.uses_bias()) c.routing.routed_scaling_factor = 2.5f;
  return c;
}

MoEConfig on_this_rank(MoEConfig c) {
  c.ep_size = world().size();
  c.ep_rank = world().rank();
  return c;
}

// Routing for external runs: [T, k] ids and weights from a shared seed.
using RoutingMaker = std::function<void(std::int64_t tokens, int top_k, std::mt19937_64& rng, Tensor& ids, Tensor& w)>;

// Any expert or none (-1), repeats allowed: what a caller may pass.
void any_experts(std::int64_t tokens, int k, std::mt19937_64& rng, Tensor& ids, Tensor& w) {
  std::uniform_int_distribution<int> expert(-1, int(kExperts) - 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (std::int64_t i = 0; i < tokens * k; ++i) {
    ids.ptr<std::int32_t>()[i] = expert(rng);
    w.ptr<float>()[i] = weight(rng);
  }
}

// Only the experts of the last rank.
void last_ranks_experts(std::int64_t tokens, int k, std::mt19937_64& rng, Tensor& ids, Tensor& w) {
  const int per_rank = int(kExperts) / world().size();
  std::uniform_int_distribution<int> expert(int(kExperts) - per_rank, int(kExperts) - 1);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (std::int64_t i = 0; i < tokens * k; ++i) {
    ids.ptr<std::int32_t>()[i] = expert(rng);
    w.ptr<float>()[i] = weight(rng);
  }
}

struct EpCase {
  MoEConfig config;                   // ep = 1
  std::vector<std::int64_t> tokens;   // per rank
  DType logits = DType::f32;
  RoutingMaker routing;               // set: external routing
  bool static_scales = false;         // fp8-tensor static activation scales
  EpOptions ep;
};

struct EpResult {
  Tensor reference;  // [T_global, H], ep = 1
  Tensor mine;       // [T_rank, H]
  std::int64_t first = 0;
  EpStats stats;
  std::uint64_t seed = 0;
};

std::vector<std::int64_t> tokens_by_rank(std::initializer_list<std::int64_t> pattern) {
  std::vector<std::int64_t> t;
  for (int r = 0; r < world().size(); ++r) t.push_back(pattern.begin()[std::size_t(r) % pattern.size()]);
  return t;
}

class EpRunner {
 public:
  explicit EpRunner(const EpCase& c) : EpRunner(c, shared_seed()) {}
  EpRunner(const EpCase& c, std::uint64_t seed) : c_(c), seed_(seed) {
    full_ = core::make_synthetic_layer(c.config, seed_);
    local_ = core::make_synthetic_layer(on_this_rank(c.config), seed_);
    if (c.static_scales) {
      scales_ = Tensor(DType::f32, {2});
      scales_.ptr<float>()[0] = 4.0f / 448.0f;
      scales_.ptr<float>()[1] = 0.5f / 448.0f;
    }
    const std::vector<std::int64_t> first = first_tokens(c.tokens);
    global_tokens_ = first.back();
    first_ = first[std::size_t(world().rank())];
    hidden_ = core::make_hidden(global_tokens_, kHidden, seed_);
    logits_ = core::make_router_logits(global_tokens_, kExperts, c.logits, seed_);
    const int k = c.config.top_k();
    ids_ = Tensor(DType::i32, {global_tokens_, k});
    weights_ = Tensor(DType::f32, {global_tokens_, k});
    if (c.routing) {
      std::mt19937_64 rng(seed_);
      c.routing(global_tokens_, k, rng, ids_, weights_);
    }
    reference_ = Tensor(DType::bf16, {global_tokens_, kHidden});
    poison(reference_.view());
    Layer one(c.config, weights(full_));
    forward(one, hidden_.view(), logits_.view(), ids_.view(), weights_.view(), reference_.view());
  }

  // One EP forward of this rank's tokens; options may differ from the case's.
  EpResult run(const EpOptions& options) {
    LayerOptions lo;
    lo.comm = &world();
    lo.ep = options;
    Layer layer(on_this_rank(c_.config), weights(local_), lo);
    return run(layer);
  }
  EpResult run() { return run(c_.ep); }

  // On a layer made by the caller (of this case's config and seed).
  EpResult run(Layer& layer) {
    const std::int64_t t = c_.tokens[std::size_t(world().rank())];
    EpResult r;
    r.seed = seed_;
    r.first = first_;
    r.mine = Tensor(DType::bf16, {t, kHidden});
    poison(r.mine.view());
    // Fused routing writes its routing into a copy, so the caller's view stays as given.
    Tensor ids = Tensor(DType::i32, {t, c_.config.top_k()}), w = Tensor(DType::f32, {t, c_.config.top_k()});
    if (c_.routing) {
      std::memcpy(ids.view().data, rows_of(ids_.view(), first_, t).data, ids.nbytes());
      std::memcpy(w.view().data, rows_of(weights_.view(), first_, t).data, w.nbytes());
    }
    forward(layer, rows_of(hidden_.view(), first_, t), rows_of(logits_.view(), first_, t), ids.view(), w.view(),
            r.mine.view());
    r.reference = Tensor(DType::bf16, {global_tokens_, kHidden});
    std::memcpy(r.reference.view().data, reference_.view().data, reference_.nbytes());
    r.stats = layer.ep_stats();
    return r;
  }

 private:
  Weights weights(const core::SyntheticLayer& l) const {
    Weights w = l.weights();
    if (c_.static_scales) {
      w.w13_input_scale = TensorView::contiguous(scales_.ptr<float>(), DType::f32, {1});
      w.w2_input_scale = TensorView::contiguous(scales_.ptr<float>() + 1, DType::f32, {1});
    }
    return w;
  }

  void forward(Layer& layer, const TensorView& hidden, const TensorView& logits, const TensorView& ids,
               const TensorView& w, const TensorView& out) const {
    if (c_.routing) layer.forward(ExternalArgs{hidden, ids, w, out});
    else layer.forward(FusedArgs{hidden, logits, out, ids, w});
  }

  EpCase c_;
  std::uint64_t seed_;
  core::SyntheticLayer full_, local_;
  Tensor scales_, hidden_, logits_, ids_, weights_, reference_;
  std::int64_t global_tokens_ = 0, first_ = 0;
};

// This rank's rows against the same rows of the ep = 1 output, bit for bit.
::testing::AssertionResult same_bits(const EpResult& r) {
  const std::int64_t t = r.mine.size(0);
  const TensorView ref = rows_of(r.reference.view(), r.first, t);
  const auto* a = r.mine.ptr<std::uint16_t>();
  const auto* b = ref.ptr<std::uint16_t>();
  for (std::int64_t i = 0; i < t * kHidden; ++i)
    if (a[i] != b[i])
      return ::testing::AssertionFailure()
             << "rank " << world().rank() << " token " << r.first + i / kHidden << " element " << i % kHidden
             << ": ep " << world().size() << " gives " << bf16_to_float(bf16{a[i]}) << " (0x" << std::hex << a[i]
             << "), ep 1 gives " << bf16_to_float(bf16{b[i]}) << " (0x" << b[i] << std::dec << "), seed " << r.seed;
  return ::testing::AssertionSuccess();
}

// ‖mine − ref‖ / ‖ref‖ over this rank's rows.
double rel_err(const EpResult& r) {
  const std::int64_t t = r.mine.size(0);
  const TensorView ref = rows_of(r.reference.view(), r.first, t);
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < t * kHidden; ++i) {
    const double a = bf16_to_float(r.mine.ptr<bf16>()[i]), b = bf16_to_float(ref.ptr<bf16>()[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// --- every routing method x quant scheme ------------------------------------------------

using MethodQuant = std::tuple<RoutingMethod, QuantScheme>;

class EpLayerGrid : public ::testing::TestWithParam<MethodQuant> {};

TEST_P(EpLayerGrid, BitIdenticalToEp1) {
  const auto [method, quant] = GetParam();
  EpCase c;
  c.config = make_config(method, quant);
  c.tokens = tokens_by_rank({5, 2, 9, 4});
  c.logits = int(method) % 2 ? DType::bf16 : DType::f32;
  if (method == RoutingMethod::external) c.routing = any_experts;
  EpRunner runner(c);
  EXPECT_TRUE(same_bits(runner.run()));
}

std::string underscored(std::string_view s) {
  std::string out(s);
  for (char& ch : out)
    if (ch == '-') ch = '_';
  return out;
}

INSTANTIATE_TEST_SUITE_P(
    EveryMethodAndScheme, EpLayerGrid,
    ::testing::Combine(::testing::Values(RoutingMethod::softmax_topk, RoutingMethod::topk_softmax,
                                         RoutingMethod::softmax_topk_renorm, RoutingMethod::sigmoid_topk,
                                         RoutingMethod::sigmoid_topk_renorm, RoutingMethod::sigmoid_bias_grouped,
                                         RoutingMethod::sigmoid_bias_renorm, RoutingMethod::top1_sigmoid,
                                         RoutingMethod::external),
                       ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                         QuantScheme::fp8_block)),
    [](const ::testing::TestParamInfo<MethodQuant>& info) {
      return underscored(to_string(std::get<0>(info.param))) + "_" + underscored(to_string(std::get<1>(info.param)));
    });

// --- token distributions ------------------------------------------------------------------

class EpLayerScheme : public ::testing::TestWithParam<QuantScheme> {};

TEST_P(EpLayerScheme, RanksWithZeroTokens) {
  EpCase c;
  c.config = make_config(RoutingMethod::softmax_topk_renorm, GetParam());
  c.tokens = tokens_by_rank({0, 6, 0, 3});  // one rank alone: no tokens anywhere
  EpRunner runner(c);
  EXPECT_TRUE(same_bits(runner.run()));
}

TEST_P(EpLayerScheme, AllTokensRoutedToOneRanksExperts) {
  EpCase c;
  c.config = make_config(RoutingMethod::external, GetParam());
  c.tokens = tokens_by_rank({7, 3, 5, 1});
  c.routing = last_ranks_experts;
  EpRunner runner(c);
  const EpResult r = runner.run();
  EXPECT_TRUE(same_bits(r));
  const bool last = world().rank() == world().size() - 1;
  EXPECT_EQ(r.stats.records_received, last ? first_tokens(c.tokens).back() : 0);
  EXPECT_EQ(r.stats.records_sent, r.stats.tokens);
}

TEST_P(EpLayerScheme, UnevenTokensPerRank) {
  EpCase c;
  c.config = make_config(RoutingMethod::sigmoid_bias_grouped, GetParam());
  c.tokens = tokens_by_rank({33, 1, 12, 0});
  EpRunner runner(c);
  EXPECT_TRUE(same_bits(runner.run()));
}

// The plan of fixed capacity runs where the routing is (EpStages::plan_fixed): also with every
// token on one rank's experts and a rank without tokens.
TEST_P(EpLayerScheme, FixedCapacityIsBitIdenticalToo) {
  for (const RoutingMaker& routing : {RoutingMaker(any_experts), RoutingMaker(last_ranks_experts)}) {
    EpCase c;
    c.config = make_config(RoutingMethod::external, GetParam());
    c.tokens = tokens_by_rank({8, 0, 3, 5});
    c.routing = routing;
    c.ep.capacity = 8;
    EpRunner runner(c);
    const EpResult r = runner.run();
    EXPECT_TRUE(same_bits(r));
    EXPECT_EQ(r.stats.records_sent, 8 * world().size()) << "fixed blocks, padding included";
  }
}

TEST_P(EpLayerScheme, PartialCombineIsDeterministicAndClose) {
  EpCase c;
  c.config = make_config(RoutingMethod::softmax_topk_renorm, GetParam());
  c.tokens = tokens_by_rank({6, 4, 9, 2});
  EpRunner runner(c);
  EpOptions partial;
  partial.combine = EpCombine::partial;
  const EpResult a = runner.run(partial), b = runner.run(partial);
  EXPECT_EQ(std::memcmp(a.mine.view().data, b.mine.view().data, a.mine.nbytes()), 0) << "run to run";
  EXPECT_LE(rel_err(a), 5e-3) << "seed " << a.seed;
  if (world().size() == 1) {
    EXPECT_TRUE(same_bits(a)) << "one rank: one partial sum, the ep = 1 result";
  }
  // Fixed capacity moves the same rows to other places: the same bits.
  partial.capacity = 9;
  const EpResult fixed = runner.run(partial);
  EXPECT_EQ(std::memcmp(a.mine.view().data, fixed.mine.view().data, a.mine.nbytes()), 0);
}

TEST_P(EpLayerScheme, RepeatedCallsGrowAndShrinkTheBuffers) {
  const MoEConfig config = make_config(RoutingMethod::topk_softmax, GetParam());
  const std::uint64_t seed = shared_seed();
  const core::SyntheticLayer local = core::make_synthetic_layer(on_this_rank(config), seed);
  LayerOptions lo;
  lo.comm = &world();
  Layer layer(on_this_rank(config), local.weights(), lo);
  for (std::int64_t base : {3, 40, 1, 0, 17}) {
    EpCase c;
    c.config = config;
    c.tokens = tokens_by_rank({base, base / 2 + 1, 0, base + 2});
    EpRunner runner(c, seed);
    EXPECT_TRUE(same_bits(runner.run(layer))) << "tokens per rank from base " << base;
  }
}

// Layer::reserve with EP: the dispatch and combine buffers too, for the worst routing (every
// token of every rank to one rank's experts), exact and partial combine, with and without fixed
// capacity; calls within the reservation allocate nothing.
TEST_P(EpLayerScheme, ReserveSizesTheExchangeBuffersToo) {
  const MoEConfig config = make_config(RoutingMethod::external, GetParam());
  const std::uint64_t seed = shared_seed();
  const core::SyntheticLayer local = core::make_synthetic_layer(on_this_rank(config), seed);
  for (EpCombine combine : {EpCombine::exact, EpCombine::partial})
    for (std::int64_t capacity : {0, 16}) {
      SCOPED_TRACE(std::string(combine == EpCombine::exact ? "exact" : "partial") + " capacity " +
                   std::to_string(capacity));
      LayerOptions lo;
      lo.comm = &world();
      lo.ep.combine = combine;
      lo.ep.capacity = capacity;
      Layer layer(on_this_rank(config), local.weights(), lo);
      layer.reserve(16);
      const std::size_t reserved = layer.workspace_bytes();
      for (const RoutingMaker& routing : {RoutingMaker(any_experts), RoutingMaker(last_ranks_experts)}) {
        EpCase c;
        c.config = config;
        c.tokens = tokens_by_rank({16, 16, 16, 16});
        c.routing = routing;
        EpRunner runner(c, seed);
        const EpResult r = runner.run(layer);
        if (combine == EpCombine::exact) EXPECT_TRUE(same_bits(r));
        else EXPECT_LE(rel_err(r), 5e-3) << "seed " << r.seed;
        EXPECT_EQ(layer.workspace_bytes(), reserved) << "a call within the reservation allocates nothing";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(EveryScheme, EpLayerScheme,
                         ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                           QuantScheme::fp8_block),
                         [](const ::testing::TestParamInfo<QuantScheme>& info) {
                           return underscored(to_string(info.param));
                         });

// --- activations, scale formats, static scales -----------------------------------------------

struct Variant {
  const char* name;
  Activation activation;
  QuantScheme quant;
  ScaleFormat format;
  bool static_scales;
};

class EpLayerVariant : public ::testing::TestWithParam<Variant> {};

TEST_P(EpLayerVariant, BitIdenticalToEp1) {
  const Variant v = GetParam();
  EpCase c;
  c.config = make_config(RoutingMethod::softmax_topk, v.quant);
  c.config.activation = v.activation;
  c.config.quant.scale_format = v.format;
  c.static_scales = v.static_scales;
  c.tokens = tokens_by_rank({4, 7, 1, 6});
  EpRunner runner(c);
  EXPECT_TRUE(same_bits(runner.run()));
}

INSTANTIATE_TEST_SUITE_P(
    Activations, EpLayerVariant,
    ::testing::Values(Variant{"relu2_fp8_block", Activation::relu2, QuantScheme::fp8_block, ScaleFormat::f32, false},
                      Variant{"swiglu_oai_bf16", Activation::swiglu_oai, QuantScheme::bf16, ScaleFormat::f32, false},
                      Variant{"gelu_fp8_rowwise_ue8m0", Activation::gelu_and_mul, QuantScheme::fp8_rowwise,
                              ScaleFormat::ue8m0, false},
                      Variant{"silu_fp8_tensor_ue8m0", Activation::silu_and_mul, QuantScheme::fp8_tensor,
                              ScaleFormat::ue8m0, false},
                      Variant{"silu_fp8_tensor_static", Activation::silu_and_mul, QuantScheme::fp8_tensor,
                              ScaleFormat::f32, true}),
    [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

// --- shared experts ---------------------------------------------------------------------------------

// Every rank holds the shared experts and runs them for its own tokens: ep = 1's bits with the
// exact combine (fused and external routing, variable and fixed capacity), close with the partial
// one, and nothing of theirs crosses to another rank: the records sent elsewhere are the routed
// layer's.
class EpLayerShared : public ::testing::TestWithParam<QuantScheme> {};

TEST_P(EpLayerShared, RunOnTheTokensRankAndBitIdenticalToEp1) {
  for (const std::int64_t shared : {1, 2})
    for (const bool external : {false, true})
      for (const std::int64_t capacity : {0, 9}) {
        SCOPED_TRACE(std::to_string(shared) + " shared, " + (external ? "external" : "fused") + ", capacity " +
                     std::to_string(capacity));
        EpCase c;
        c.config = make_config(external ? RoutingMethod::external : RoutingMethod::sigmoid_bias_grouped, GetParam());
        c.config.shared_experts = shared;
        c.config.shared_expert_weight = shared == 2 ? 0.5f : 1.0f;
        c.tokens = tokens_by_rank({5, 0, 9, 3});
        if (external) c.routing = any_experts;
        c.ep.capacity = capacity;
        EpRunner runner(c);
        const EpResult r = runner.run();
        EXPECT_TRUE(same_bits(r));
        if (capacity > 0) continue;
        EpCase routed = c;
        routed.config.shared_experts = 0;
        const EpResult without = EpRunner(routed, r.seed).run();
        EXPECT_EQ(r.stats.dispatch_remote_bytes / r.stats.record_bytes,
                  without.stats.dispatch_remote_bytes / without.stats.record_bytes)
            << "records to other ranks";
      }
}

TEST_P(EpLayerShared, PartialCombineIsDeterministicAndClose) {
  EpCase c;
  c.config = make_config(RoutingMethod::softmax_topk_renorm, GetParam());
  c.config.shared_experts = 1;
  c.tokens = tokens_by_rank({6, 4, 9, 2});
  EpRunner runner(c);
  EpOptions partial;
  partial.combine = EpCombine::partial;
  const EpResult a = runner.run(partial), b = runner.run(partial);
  EXPECT_EQ(std::memcmp(a.mine.view().data, b.mine.view().data, a.mine.nbytes()), 0) << "run to run";
  EXPECT_LE(rel_err(a), 5e-3) << "seed " << a.seed;
}

INSTANTIATE_TEST_SUITE_P(EveryScheme, EpLayerShared,
                         ::testing::Values(QuantScheme::bf16, QuantScheme::fp8_tensor, QuantScheme::fp8_rowwise,
                                           QuantScheme::fp8_block),
                         [](const ::testing::TestParamInfo<QuantScheme>& info) {
                           return underscored(to_string(info.param));
                         });

// --- traffic and errors ---------------------------------------------------------------------------

TEST(EpLayer, Fp8DispatchSendsAboutHalfTheBytesOfBf16) {
  std::int64_t bytes[2] = {};
  const QuantScheme schemes[2] = {QuantScheme::bf16, QuantScheme::fp8_block};
  for (int i = 0; i < 2; ++i) {
    EpCase c;
    c.config = make_config(RoutingMethod::external, schemes[i]);
    c.tokens = tokens_by_rank({16});
    c.routing = any_experts;
    EpRunner runner(c);
    const EpResult r = runner.run();
    EXPECT_TRUE(same_bits(r));
    EXPECT_EQ(r.stats.dispatch_bytes, r.stats.records_sent * r.stats.record_bytes);
    bytes[i] = r.stats.record_bytes;
  }
  // H = 256, k = 4: bf16 512 + 32 routing; fp8-block 256 + 2 scales + 32, rounded to 16.
  EXPECT_EQ(bytes[0], 2 * kHidden + 32);
  EXPECT_EQ(bytes[1], 304);
}

TEST(EpLayer, ErrorsNameTheProblem) {
  const MoEConfig config = make_config(RoutingMethod::softmax_topk_renorm, QuantScheme::bf16);
  auto expect_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "expected an Error mentioning '" << words << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // ep_size > 1 without a communicator.
  MoEConfig two = config;
  two.ep_size = 2;
  const core::SyntheticLayer half = core::make_synthetic_layer(two, 3);
  expect_error([&] { Layer l(two, half.weights()); }, "comm: expected a communicator");
  // ... unless the caller asks for this rank's share alone, which takes no communicator.
  LayerOptions alone;
  alone.ep.scope = EpScope::this_rank;
  EXPECT_NO_THROW(Layer(two, half.weights(), alone));
  alone.comm = &world();
  expect_error([&] { Layer l(two, half.weights(), alone); }, "this_rank exchanges nothing");
  // A communicator of another size than ep_size.
  MoEConfig other = config;
  other.ep_size = world().size() == 2 ? 3 : 2;
  const core::SyntheticLayer part = core::make_synthetic_layer(other, 3);
  LayerOptions lo;
  lo.comm = &world();
  expect_error([&] { Layer l(other, part.weights(), lo); }, "comm: expected");
  // E not divisible by ep_size.
  MoEConfig five = config;
  five.ep_size = 5;
  expect_error([&] { Layer l(five, half.weights(), lo); }, "ep_size");
  // Over the fixed capacity: every rank fails alone, before communicating.
  const core::SyntheticLayer local = core::make_synthetic_layer(on_this_rank(config), 3);
  lo.ep.capacity = 2;
  Layer layer(on_this_rank(config), local.weights(), lo);
  Tensor hidden = core::make_hidden(3, kHidden, 3);
  Tensor logits = core::make_router_logits(3, kExperts, DType::f32, 3);
  Tensor out(DType::bf16, {3, kHidden});
  expect_error([&] { layer.forward(FusedArgs{hidden.view(), logits.view(), out.view(), {}, {}}); }, "EP capacity 2");
  world().barrier(nullptr);  // nothing is left pending
}

}  // namespace
}  // namespace moekit::test
