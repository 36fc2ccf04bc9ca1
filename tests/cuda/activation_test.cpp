// CUDA activation + requantization against cpu::activate_row + cpu::quantize_rows, on rows laid
// out by a GPU permutation plan (padding rows hold NaN garbage: they must be skipped and
// zero-filled; rows past those in use must stay untouched). relu2 is compared bit for bit; the
// other activations call expf / erff, whose GPU and host versions may differ by an ulp of f32:
// scales within 2 ulp, codes within one step, and nearly all of them identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/activation.h"
#include "cpu/quant.h"
#include "cuda/activation/activate.h"
#include "cuda/permute/plan.h"
#include "cuda_test_util.h"
#include "moekit/quant.h"

namespace moekit {
namespace {

using cuda::ExpertRows;
using cuda::RowFormat;
using cuda::ScaleLayout;
using test::DeviceArray;

struct Output {
  QuantScheme scheme;
  ScaleFormat format;
  ScaleLayout layout;
  cuda::quant::TensorScale tensor_scale;
};

std::vector<Output> outputs() {
  using TS = cuda::quant::TensorScale;
  return {{QuantScheme::bf16, ScaleFormat::f32, ScaleLayout::k_major, TS::dynamic},
          {QuantScheme::fp8_tensor, ScaleFormat::f32, ScaleLayout::k_major, TS::dynamic},
          {QuantScheme::fp8_tensor, ScaleFormat::f32, ScaleLayout::k_major, TS::given},
          {QuantScheme::fp8_rowwise, ScaleFormat::f32, ScaleLayout::k_major, TS::dynamic},
          {QuantScheme::fp8_block, ScaleFormat::f32, ScaleLayout::k_major, TS::dynamic},
          {QuantScheme::fp8_block, ScaleFormat::ue8m0, ScaleLayout::k_major, TS::dynamic},
          {QuantScheme::fp8_block, ScaleFormat::f32, ScaleLayout::mn_major_per_expert, TS::dynamic},
          {QuantScheme::fp8_block, ScaleFormat::ue8m0, ScaleLayout::mn_major_per_expert, TS::dynamic}};
}

// Where a permuted row sits: in use or not, and its place in its expert's block.
struct Place {
  bool used = false;
  std::int64_t base = 0, span = 0, index = 0;
};

Place place(const ExpertRows& rows, const std::vector<std::int32_t>& offsets, const std::vector<std::int32_t>& counts,
            std::int64_t r) {
  Place p;
  if (rows.format == RowFormat::contiguous) {
    if (r >= offsets.back()) return p;
    const auto e = std::int64_t(std::upper_bound(offsets.begin(), offsets.end(), std::int32_t(r)) - offsets.begin() - 1);
    p = {true, offsets[std::size_t(e)], offsets[std::size_t(e + 1)] - offsets[std::size_t(e)], r - offsets[std::size_t(e)]};
    return p;
  }
  const std::int64_t e = r / rows.capacity, n = counts[std::size_t(e)];
  p = {false, e * rows.capacity, rows.capacity, r % rows.capacity};
  p.used = p.index < std::min<std::int64_t>((n + rows.alignment - 1) / rows.alignment * rows.alignment, rows.capacity);
  return p;
}

std::int64_t fp8_order(std::uint8_t c) { return (c & 0x80) ? -std::int64_t(c & 0x7f) : std::int64_t(c & 0x7f); }
std::int64_t bf16_order(std::uint16_t c) { return (c & 0x8000) ? -std::int64_t(c & 0x7fff) : std::int64_t(c & 0x7fff); }

TEST(CudaActivation, EveryActivationAndOutputMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const bool small = test::small_cases();
  std::int64_t compared = 0, differing = 0;
  int contiguous_cases = 0;
  for (const Activation act : {Activation::silu_and_mul, Activation::gelu_and_mul, Activation::swiglu_oai, Activation::relu2})
    for (const Output& out : outputs())
      for (const std::int64_t inter : {std::int64_t(72), std::int64_t(256), std::int64_t(2048)})
        for (const RowFormat format : {RowFormat::contiguous, RowFormat::masked}) {
          if (out.scheme == QuantScheme::fp8_block && inter % 16 != 0) continue;
          if (small && inter == 2048) continue;
          const std::int64_t tokens = small ? 9 : (inter == 2048 ? 40 : 150);
          const int k = 4;
          const std::int64_t local = 12;
          const ExpertRows rows{format, local, format == RowFormat::contiguous ? 16 : 4, tokens * k / local + 3};
          SCOPED_TRACE(std::string(to_string(act)) + " -> " + std::string(to_string(out.scheme)) + " " +
                       std::string(to_string(out.format)) + " " + std::string(cuda::to_string(out.layout)) +
                       (out.tensor_scale == cuda::quant::TensorScale::given ? " given" : "") + " I=" +
                       std::to_string(inter) + " " + rows.to_string() + " T=" + std::to_string(tokens));

          // A plan from random routing over 16 experts (4 of them on another rank: no rows).
          std::vector<std::int32_t> ids(std::size_t(tokens * k));
          std::vector<std::int32_t> experts(16);
          for (std::int64_t t = 0; t < tokens; ++t) {
            std::iota(experts.begin(), experts.end(), 0);
            std::shuffle(experts.begin(), experts.end(), rng);
            for (int j = 0; j < k; ++j) ids[std::size_t(t * k + j)] = experts[std::size_t(j)];
          }
          const cuda::permute::PlanProblem plan_problem{rows, tokens, k, 0};
          const std::int64_t max_rows = plan_problem.max_rows();
          DeviceArray<std::int32_t> d_ids(ids), d_counts{std::size_t(local)}, d_offsets{std::size_t(local + 1)},
              d_slot_rows(ids.size()), d_row_token{std::size_t(max_rows)}, d_row_expert{std::size_t(max_rows)}, d_dropped(1);
          test::DeviceWorkspace plan_ws(cuda::permute::workspace_size(plan_problem));
          cuda::permute::run(plan_problem, {d_ids.data(), d_counts.data(), d_offsets.data(), d_slot_rows.data(),
                                            d_row_token.data(), d_row_expert.data(), d_dropped.data()},
                             plan_ws.get(), nullptr);
          test::sync_and_check();
          const auto counts = d_counts.download(), offsets = d_offsets.download(), row_token = d_row_token.download();

          // GEMM1 output: token rows random (wide enough to hit swiglu's clamps), the rest NaN.
          const cuda::activation::Problem problem{rows, tokens, k, inter, act, 1.702f, 7.0f, {out.scheme, out.format},
                                                  out.layout, out.tensor_scale};
          const std::int64_t width = problem.input_width();
          std::vector<std::uint16_t> h1(std::size_t(max_rows * width), 0xffff);
          std::vector<std::int64_t> token_rows;
          for (std::int64_t r = 0; r < max_rows; ++r) {
            if (row_token[std::size_t(r)] < 0) continue;
            token_rows.push_back(r);
            const auto v = test::random_bf16(std::size_t(width), -10.0f, 10.0f, rng);
            std::copy(v.begin(), v.end(), h1.begin() + r * width);
          }

          // CPU: activate the token rows, quantize them as one compact matrix.
          const auto n_tok = std::int64_t(token_rows.size());
          std::vector<float> act_rows(std::size_t(n_tok * inter));
          cpu::ActivationParams params{act, 1.702f, 7.0f, inter};
          for (std::int64_t i = 0; i < n_tok; ++i)
            cpu::activate_row(params, reinterpret_cast<const bf16*>(h1.data()) + token_rows[std::size_t(i)] * width,
                              act_rows.data() + i * inter);
          const bool fp8 = out.scheme != QuantScheme::bf16;
          const std::size_t elem = fp8 ? 1 : 2;
          const std::int64_t groups = out.scheme == QuantScheme::fp8_block ? ceil_div(inter, kBlock) : 1;
          std::vector<std::uint8_t> cpu_q(std::size_t(n_tok * inter) * elem);
          std::vector<float> cpu_scales(std::size_t(std::max<std::int64_t>(1, n_tok * groups)));
          QuantizedRows cpu_out;
          cpu_out.q = TensorView::contiguous(cpu_q.data(), activation_dtype(out.scheme), {n_tok, inter});
          if (fp8) cpu_out.scales = TensorView::contiguous(cpu_scales.data(), DType::f32, scale_shape(out.scheme, n_tok, inter));
          const float given = 0.05f;
          const bool is_given = out.scheme == QuantScheme::fp8_tensor && out.tensor_scale == cuda::quant::TensorScale::given;
          cpu::quantize_rows({{out.scheme, out.format}, is_given ? given : 0.0f}, act_rows.data(), n_tok, inter, cpu_out);

          // GPU.
          ASSERT_TRUE(cuda::activation::can_implement(problem)) << cuda::activation::can_implement(problem).reason();
          DeviceArray<std::uint16_t> d_h1(h1);
          DeviceArray<float> d_given(std::vector<float>{given});
          DeviceArray<std::uint8_t> d_q(std::size_t(max_rows * inter) * elem);
          const std::int64_t scale_count = out.scheme == QuantScheme::fp8_tensor ? 1 : max_rows * groups;
          DeviceArray<float> d_scales{std::size_t(std::max<std::int64_t>(1, scale_count))};
          d_q.poison();
          d_scales.poison();
          test::DeviceWorkspace ws(cuda::activation::workspace_size(problem));
          // Rows found by the plan's row_expert (contiguous, every other case) or by searching the offsets.
          const bool by_row_expert = format == RowFormat::contiguous && contiguous_cases++ % 2 == 1;
          const cuda::RowPlan row_plan{d_offsets.data(), d_counts.data(), by_row_expert ? d_row_expert.data() : nullptr};
          cuda::activation::run(problem, {d_h1.data(), row_plan, d_given.data(), d_q.data(), d_scales.data(), {}}, ws.get(), nullptr);
          test::sync_and_check();
          const auto got_q = d_q.download();
          const auto got_scales = d_scales.download();

          const bool exact = act == Activation::relu2;
          std::vector<std::int64_t> compact_of(std::size_t(max_rows), -1);
          for (std::int64_t i = 0; i < n_tok; ++i) compact_of[std::size_t(token_rows[std::size_t(i)])] = i;
          auto check_scale = [&](float got, float want, const std::string& where) {
            const std::int64_t ulp = test::ulp_distance(got, want);
            ASSERT_LE(ulp, exact || is_given ? 0 : 2) << where << ": gpu " << got << " cpu " << want;
          };
          if (out.scheme == QuantScheme::fp8_tensor && n_tok > 0) check_scale(got_scales[0], cpu_scales[0], "tensor scale");
          for (std::int64_t r = 0; r < max_rows; ++r) {
            const Place pl = place(rows, offsets, counts, r);
            const std::int64_t i = compact_of[std::size_t(r)];
            const std::uint8_t* g = got_q.data() + std::size_t(r * inter) * elem;
            for (std::size_t b = 0; b < std::size_t(inter) * elem; ++b) {
              const std::uint8_t want_byte = !pl.used ? 0xff : (i < 0 ? 0 : cpu_q[std::size_t(i * inter) * elem + b]);
              if (i < 0 || exact) {
                ASSERT_EQ(int(g[b]), int(want_byte)) << "row " << r << (pl.used ? (i < 0 ? " (padding)" : "") : " (unused)") << " byte " << b;
              }
            }
            if (i >= 0 && !exact) {
              // bf16 keeps tiny values: near a zero of the activation an ulp of f32 is a large
              // relative change, so there the bound is absolute, 2^-16 of the row's largest value.
              float row_amax = 0.0f;
              for (std::int64_t c = 0; c < inter; ++c) row_amax = std::max(row_amax, std::fabs(act_rows[std::size_t(i * inter + c)]));
              for (std::int64_t c = 0; c < inter; ++c) {
                std::int64_t diff;
                bool close = false;
                if (fp8) {
                  diff = fp8_order(g[c]) - fp8_order(cpu_q[std::size_t(i * inter + c)]);
                } else {
                  std::uint16_t a, b;
                  std::memcpy(&a, g + 2 * c, 2);
                  std::memcpy(&b, cpu_q.data() + 2 * (i * inter + c), 2);
                  diff = bf16_order(a) - bf16_order(b);
                  close = std::fabs(bf16_to_float(bf16{a}) - bf16_to_float(bf16{b})) <= row_amax * 0x1p-16f;
                }
                ++compared;
                differing += diff != 0;
                ASSERT_TRUE(std::abs(diff) <= 1 || close) << "row " << r << " column " << c << ": " << diff << " steps";
              }
            }
            if (out.scheme == QuantScheme::fp8_rowwise || out.scheme == QuantScheme::fp8_block) {
              for (std::int64_t kb = 0; kb < groups; ++kb) {
                const std::int64_t at = out.layout == ScaleLayout::k_major || out.scheme == QuantScheme::fp8_rowwise
                                            ? r * groups + kb
                                            : pl.base * groups + kb * pl.span + pl.index;
                if (!pl.used) continue;
                const float got = got_scales[std::size_t(at)];
                if (i < 0) ASSERT_EQ(got, 0.0f) << "padding row " << r << " scale " << kb;
                else check_scale(got, cpu_scales[std::size_t(i * groups + kb)], "row " + std::to_string(r) + " scale " + std::to_string(kb));
              }
            }
          }
        }
  std::printf("activation: %lld values compared with a tolerance, %lld differ by one step\n",
              static_cast<long long>(compared), static_cast<long long>(differing));
  EXPECT_LE(differing, compared / 100 + 10);
}

TEST(CudaActivation, RejectsWidthsItCannotLoad) {
  cuda::activation::Problem p;
  p.rows = {RowFormat::contiguous, 8, 1, 0};
  p.tokens = 4;
  p.intermediate = 100;
  EXPECT_FALSE(cuda::activation::can_implement(p));
  p.intermediate = 72;
  EXPECT_TRUE(cuda::activation::can_implement(p));
  p.quant.scheme = QuantScheme::fp8_block;
  EXPECT_FALSE(cuda::activation::can_implement(p));
}

}  // namespace
}  // namespace moekit
