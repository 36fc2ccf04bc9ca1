// The whole CUDA layer past 2^31 elements (issue #19, DESIGN §8: 64-bit offsets everywhere):
// T = 300,000 tokens of deepseek-v3's H = 7168, so hidden and out hold 2.15e9 elements and the
// permuted rows T·k·H = 4.3e9 (past 2^32 too); few experts and a small I keep the weights small.
// Fused routing through the staged path for bf16 and fp8-block (CUTLASS's GEMMs), fp8-block with
// exact and strict accumulation and fp8-rowwise (moekit's WGMMA GEMMs), and every slot on one
// expert (one group of 4.3e9 elements in each GEMM). Checked on sampled tokens (the first, the
// last, the ones whose hidden row crosses element 2^31, and random ones) against the CPU
// references computed on those tokens alone; every output element must be written.
//
// Each token's output depends on that token alone in these schemes, so the references of a
// sample are the references of the whole batch at those rows: routing is per token
// (route.cuh, a warp per token); fp8-block quantizes per 1x128 group of a row, fp8-rowwise per
// row (quantize.cuh), and the activation's requantization is per row too (activate.cuh); GEMM
// rows are independent (the tile a batch size picks changes the order of a row's sums, which
// DESIGN §8's bounds allow); finalize sums a token's own k rows. Not so fp8-tensor with a
// dynamic scale (one amax over the whole batch), which this test leaves out.
//
// Skipped without ~48 GB of free device memory, and under MOEKIT_CUDA_TEST_SMALL (sanitizer runs).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "core/parallel.h"
#include "cuda_layer_util.h"

namespace moekit::test {
namespace {

constexpr std::int64_t kTokens = 300000, kHidden = 7168, kExperts = 8, kInter = 128;
constexpr int kTopK = 2;
constexpr std::size_t kDeviceBytesNeeded = std::size_t(48) << 30;

enum class Routed : std::uint8_t { fused, one_expert };

struct BigCase {
  QuantScheme scheme;
  Fp8Accumulation accumulation;
  Routed routed;
};

std::string big_case_name(const BigCase& b) {
  std::string s = underscored(to_string(b.scheme));
  if (b.scheme != QuantScheme::bf16) s += "_" + std::string(to_string(b.accumulation));
  return s + (b.routed == Routed::fused ? "_fused" : "_one_expert");
}

LayerCase layer_case(const BigCase& b) {
  LayerCase c;
  c.scheme = b.scheme;
  c.accumulation = b.scheme == QuantScheme::bf16 ? QuantConfig{}.accumulation : b.accumulation;
  c.experts = kExperts, c.hidden = kHidden, c.inter = kInter, c.tokens = kTokens, c.top_k = kTopK;
  c.path = ExpertsPath::staged;
  c.ids = b.routed == Routed::fused ? Ids::routed : Ids::one_expert;
  return c;
}

// The sampled tokens: the first and last, the two around element 2^31 of hidden, and random
// ones, 64 in all, in order.
std::vector<std::int64_t> sample_tokens(std::mt19937_64& rng) {
  const std::int64_t crossing = (std::int64_t(1) << 31) / kHidden;  // its row holds element 2^31
  std::set<std::int64_t> picked{0, kTokens - 1, crossing, crossing + 1};
  std::uniform_int_distribution<std::int64_t> any(0, kTokens - 1);
  while (picked.size() < 64) picked.insert(any(rng));
  return {picked.begin(), picked.end()};
}

// Rows `tokens` of a device tensor [T, cols], as a host tensor [tokens, cols].
Tensor device_rows(const DeviceTensor& d, const std::vector<std::int64_t>& tokens) {
  const TensorView& v = d.view();
  Tensor out(v.dtype, {std::int64_t(tokens.size()), v.size(1)});
  const std::size_t row = std::size_t(v.size(1)) * dtype_size(v.dtype);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    EXPECT_EQ(cudaMemcpy(static_cast<std::byte*>(out.view().data) + i * row,
                         static_cast<const std::byte*>(v.data) + std::size_t(tokens[i]) * row, row, cudaMemcpyDeviceToHost),
              cudaSuccess);
  return out;
}

Tensor host_rows(const Tensor& t, const std::vector<std::int64_t>& tokens) {
  Tensor out(t.dtype(), {std::int64_t(tokens.size()), t.size(1)});
  const std::size_t row = std::size_t(t.size(1)) * dtype_size(t.dtype());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    std::memcpy(static_cast<std::byte*>(out.view().data) + i * row,
                static_cast<const std::byte*>(t.view().data) + std::size_t(tokens[i]) * row, row);
  return out;
}

// NaN elements of a device bf16 tensor (the poison that nothing overwrote), counted on the host
// a chunk at a time.
std::int64_t nan_elements(const DeviceTensor& d) {
  const std::size_t total = std::size_t(d.view().numel()), chunk = std::size_t(1) << 28;
  std::vector<std::uint16_t> host(std::min(total, chunk));
  std::int64_t nans = 0;
  for (std::size_t first = 0; first < total; first += chunk) {
    const std::size_t n = std::min(chunk, total - first);
    EXPECT_EQ(cudaMemcpy(host.data(), static_cast<const std::uint16_t*>(d.view().data) + first, n * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::atomic<std::int64_t> found{0};
    core::parallel_for(std::int64_t(n), 1 << 20, [&](std::int64_t b, std::int64_t e) {
      std::int64_t here = 0;
      for (std::int64_t i = b; i < e; ++i) here += (host[std::size_t(i)] & 0x7fff) > 0x7f80;
      found += here;
    });
    nans += found.load();
  }
  return nans;
}

TEST(CudaLayerPast2GiB, SampledTokensMatchTheReferences) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (small_cases()) GTEST_SKIP() << "MOEKIT_CUDA_TEST_SMALL: 48 GB of device memory is no reduced case";
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (free_bytes < kDeviceBytesNeeded)
    GTEST_SKIP() << "needs " << (kDeviceBytesNeeded >> 30) << " GB of free device memory, " << (free_bytes >> 30) << " GB free";

  const std::uint64_t seed = fresh_seed();
  std::printf("past-2GiB: seed %llu (MOEKIT_TEST_SEED=%llu replays it), T=%lld H=%lld k=%d E=%lld I=%lld\n",
              (unsigned long long)seed, (unsigned long long)seed, (long long)kTokens, (long long)kHidden, kTopK,
              (long long)kExperts, (long long)kInter);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::int64_t> tokens = sample_tokens(rng);
  static_assert(kTokens * kHidden > (std::int64_t(1) << 31), "hidden past 2^31 elements");
  static_assert(kTokens * kTopK * kHidden > (std::int64_t(1) << 32), "permuted rows past 2^32 elements");

  // The inputs once, for every case: hidden [T, H] (4.3 GB), logits [T, E].
  const Tensor hidden = core::make_hidden(kTokens, kHidden, seed + 1);
  const Tensor logits = core::make_router_logits(kTokens, kExperts, DType::f32, seed + 2);
  const DeviceTensor d_hidden = on_gpu(hidden), d_logits = on_gpu(logits);
  const Tensor sample_hidden = host_rows(hidden, tokens), sample_logits = host_rows(logits, tokens);

  for (const BigCase& b : {BigCase{QuantScheme::bf16, Fp8Accumulation::fast, Routed::fused},
                           BigCase{QuantScheme::fp8_block, Fp8Accumulation::fast, Routed::fused},
                           BigCase{QuantScheme::fp8_block, Fp8Accumulation::exact, Routed::fused},
                           BigCase{QuantScheme::fp8_block, Fp8Accumulation::strict, Routed::fused},
                           BigCase{QuantScheme::fp8_rowwise, Fp8Accumulation::fast, Routed::fused},
                           BigCase{QuantScheme::fp8_block, Fp8Accumulation::fast, Routed::one_expert},
                           BigCase{QuantScheme::bf16, Fp8Accumulation::fast, Routed::one_expert}}) {
    const LayerCase c = layer_case(b);
    SCOPED_TRACE(big_case_name(b));
    const TestLayer lw = make_test_layer(c, seed);
    const MoEConfig config = config_of(c);
    LayerOptions options;
    options.backend = "cuda";
    // The references route the sampled tokens on the CPU (fused), or take the given ids.
    Routing sample_routing = route_with(config.routing, sample_logits, lw.synthetic.e_score_correction_bias);
    DeviceTensor out = poisoned(DType::bf16, {kTokens, kHidden});
    {
      Layer layer(config, lw.weights(), options);
      if (b.routed == Routed::fused) {
        DeviceTensor ids = poisoned(DType::i32, {kTokens, kTopK}), weights = poisoned(DType::f32, {kTokens, kTopK});
        layer.forward(FusedArgs{d_hidden.view(), d_logits.view(), out.view(), ids.view(), weights.view()});
        synchronize(Device::cuda);
        EXPECT_EQ(bit_differences(device_rows(ids, tokens), sample_routing.ids), 0) << "ids must equal the CPU router's";
      } else {
        // Every slot on expert E - 2 (case_routing's one_expert), the weights of the fused routing.
        Tensor all_ids(DType::i32, {kTokens, kTopK});
        std::fill_n(all_ids.ptr<std::int32_t>(), all_ids.numel(), std::int32_t(kExperts - 2));
        const Routing all = route_with(config.routing, logits, lw.synthetic.e_score_correction_bias);
        const DeviceTensor ids = on_gpu(all_ids), weights = on_gpu(all.weights);
        layer.forward(ExternalArgs{d_hidden.view(), ids.view(), weights.view(), out.view()});
        synchronize(Device::cuda);
        sample_routing = {host_rows(all_ids, tokens), host_rows(all.weights, tokens)};
      }
    }  // the layer's workspace (~20 GB) goes before the next case
    EXPECT_EQ(nan_elements(out), 0) << "output elements left unwritten (NaN poison) or NaN";
    const Tensor got = device_rows(out, tokens);
    const References refs = make_references(config, lw, seed, sample_hidden, sample_routing);
    const core::CheckResult check = design_check(got, refs, config.quant);
    std::printf("past-2GiB: %-22s %s\n", big_case_name(b).c_str(), check.to_string().c_str());
    expect_meets_the_check(check, c);
  }
}

}  // namespace
}  // namespace moekit::test
