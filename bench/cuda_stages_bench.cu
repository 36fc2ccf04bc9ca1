// Times each CUDA stage op at T = 16384 for the DeepSeek-V3 and Qwen3-30B-A3B shapes and
// prints µs, bytes moved (each input read once, each output written once), GB/s and the
// share of the copy bandwidth measured in the same run (METHOD: CUDA events, warm-up, median
// of 30 runs, the L2 emptied before each by a read of 256 MB (MOEKIT_FLUSH=write: a memset), random data).
//   cuda_stages_bench [tokens]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/activation/activate.h"
#include "cuda/common/check.h"
#include "cuda/finalize/finalize.h"
#include "cuda/permute/gather.h"
#include "cuda/permute/plan.h"
#include "cuda/quant/quantize.h"
#include "cuda/routing/route.h"
#include "moekit/quant.h"

namespace {

using namespace moekit;
using moekit::cuda::ExpertRows;
using moekit::cuda::RowFormat;
using moekit::cuda::ScaleLayout;

constexpr int kRuns = 30;

// ---- random data on the device ----------------------------------------------------------

__device__ std::uint32_t hash(std::uint64_t i, std::uint32_t seed) {
  std::uint64_t x = i * 0x9e3779b97f4a7c15ull + seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return std::uint32_t(x >> 16);
}

__global__ void fill_f32(float* p, std::int64_t n, float lo, float hi, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * float(hash(i, seed) >> 8) * (1.0f / 16777216.0f);
}

__global__ void fill_bf16(std::uint16_t* p, std::int64_t n, float lo, float hi, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float v = lo + (hi - lo) * float(hash(i, seed) >> 8) * (1.0f / 16777216.0f);
    p[i] = std::uint16_t(__float_as_uint(v) >> 16);
  }
}

template <class T>
struct Buffer {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Buffer(std::size_t count) : n(count) { MOEKIT_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(1, count * sizeof(T)))); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

void random_f32(Buffer<float>& b, float lo, float hi, std::uint32_t seed) {
  fill_f32<<<1024, 256>>>(b.p, std::int64_t(b.n), lo, hi, seed);
  MOEKIT_CUDA_CHECK_LAUNCH("fill_f32");
}
void random_bf16(Buffer<std::uint16_t>& b, float lo, float hi, std::uint32_t seed) {
  fill_bf16<<<1024, 256>>>(b.p, std::int64_t(b.n), lo, hi, seed);
  MOEKIT_CUDA_CHECK_LAUNCH("fill_bf16");
}

// ---- timing -------------------------------------------------------------------------------

// Reads the flush buffer: afterwards the L2 holds its lines, clean. `sink` is written only for
// a sum no fill makes, so the loads stay.
__global__ void read_all(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// How the L2 is emptied before each timed run. read (default): a kernel reads a buffer larger
// than the L2, which leaves it full of clean lines, so the timed op reads its inputs from DRAM
// and writes back only its own data. write (MOEKIT_FLUSH=write, the method before 2026-12-01):
// a memset of that buffer, which leaves the L2 full of dirty lines: the timed op then also
// writes back up to an L2 of the memset's data (docs/perf-log/stages.md, 2026-12-01 second session).
struct Timer {
  Buffer<std::uint8_t> flush{std::size_t(256) << 20};  // > L2 (60 MB on H200)
  Buffer<unsigned> sink{1};
  bool write_flush = false;
  cudaEvent_t start{}, stop{};
  Timer() {
    MOEKIT_CUDA_CHECK(cudaEventCreate(&start));
    MOEKIT_CUDA_CHECK(cudaEventCreate(&stop));
    MOEKIT_CUDA_CHECK(cudaMemset(flush.p, 0x5a, flush.n));
    const char* mode = std::getenv("MOEKIT_FLUSH");
    write_flush = mode != nullptr && std::string(mode) == "write";
  }
  const char* flush_name() const { return write_flush ? "write (memset)" : "read"; }
  void empty_l2(int run) {
    if (write_flush) {
      MOEKIT_CUDA_CHECK(cudaMemsetAsync(flush.p, run & 0xff, flush.n));
    } else {
      read_all<<<1024, 512>>>(reinterpret_cast<const uint4*>(flush.p), flush.n / sizeof(uint4), sink.p);
      MOEKIT_CUDA_CHECK_LAUNCH("read_all");
    }
  }
  // Median µs of kRuns runs of `op` after 3 warm-ups, the L2 emptied before each run.
  double median_us(const std::function<void()>& op) {
    for (int i = 0; i < 3; ++i) op();
    std::vector<double> us;
    for (int i = 0; i < kRuns; ++i) {
      empty_l2(i);
      MOEKIT_CUDA_CHECK(cudaEventRecord(start));
      op();
      MOEKIT_CUDA_CHECK(cudaEventRecord(stop));
      MOEKIT_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      MOEKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      us.push_back(double(ms) * 1e3);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
};

struct Row {
  std::string model, stage;
  double us, bytes;
};

std::vector<Row> rows;
double copy_gbps = 0;

void report(const std::string& model, const std::string& stage, double us, double bytes) {
  rows.push_back({model, stage, us, bytes});
  std::printf("%-14s %-34s %10.1f us %10.1f MB %8.0f GB/s %6.1f %%\n", model.c_str(), stage.c_str(), us, bytes / 1e6,
              bytes / us / 1e3, copy_gbps > 0 ? 100.0 * bytes / us / 1e3 / copy_gbps : 0.0);
  std::fflush(stdout);
}

struct Model {
  std::string name;
  std::int64_t hidden, inter, experts;
  int top_k;
  RoutingConfig routing;
};

void bench_model(const Model& m, std::int64_t tokens, Timer& timer) {
  const std::int64_t t = tokens, h = m.hidden, e = m.experts, in = m.inter;
  const int k = m.top_k;
  const std::int64_t slots = t * k;
  const std::int64_t g_h = ceil_div(h, kBlock), g_i = ceil_div(in, kBlock);
  const cudaStream_t stream = nullptr;

  // Routing (f32 logits).
  Buffer<float> logits{std::size_t(t * e)}, bias{std::size_t(e)}, weights{std::size_t(slots)};
  Buffer<std::int32_t> ids{std::size_t(slots)};
  random_f32(logits, -4.0f, 4.0f, 1);
  random_f32(bias, -0.5f, 0.5f, 2);
  const cuda::routing::Problem rp{m.routing, t, e, DType::f32, DType::f32};
  const auto route = [&] { cuda::routing::run(rp, {logits.p, bias.p, ids.p, weights.p}, {}, stream); };
  report(m.name, "routing " + std::string(to_string(m.routing.method)),
         timer.median_us(route), double(t * e * 4 + e * 4 + slots * 8));

  // Quantize the hidden states (fp8-block).
  Buffer<std::uint16_t> hidden{std::size_t(t * h)};
  random_bf16(hidden, -3.0f, 3.0f, 3);
  Buffer<std::uint8_t> q{std::size_t(t * h)};
  Buffer<float> q_scales{std::size_t(t * g_h)};
  const cuda::quant::Problem qp{{QuantScheme::fp8_block, ScaleFormat::f32}, t, h};
  const auto quantize = [&] { cuda::quant::run(qp, {hidden.p, nullptr, nullptr, q.p, q_scales.p, {}}, {}, stream); };
  report(m.name, "quantize fp8-block", timer.median_us(quantize), double(t * h * 2 + t * h + t * g_h * 4));

  // Permutation plan (contiguous, padded to 128 rows).
  const ExpertRows er{RowFormat::contiguous, e, 128, 0};
  const cuda::permute::PlanProblem pp{er, t, k, 0};
  const std::int64_t max_rows = pp.max_rows();
  Buffer<std::int32_t> counts{std::size_t(e)}, offsets{std::size_t(e + 1)}, slot_rows{std::size_t(slots)},
      row_token{std::size_t(max_rows)}, row_expert{std::size_t(max_rows)};
  Buffer<std::uint8_t> plan_ws{cuda::permute::workspace_size(pp)};
  const auto plan = [&] {
    cuda::permute::run(pp, {ids.p, counts.p, offsets.p, slot_rows.p, row_token.p, row_expert.p, nullptr},
                       {reinterpret_cast<std::byte*>(plan_ws.p), plan_ws.n}, stream);
  };
  report(m.name, "permute plan (align 128)", timer.median_us(plan),
         double(slots * 4 * 2 + max_rows * 4 * 2 + (2 * e + 1) * 4));
  std::int32_t used_rows = 0;
  MOEKIT_CUDA_CHECK(cudaMemcpy(&used_rows, offsets.p + e, sizeof used_rows, cudaMemcpyDeviceToHost));

  // Gather into expert order, MN-major scales.
  Buffer<std::uint8_t> a1{std::size_t(max_rows * h)};
  Buffer<float> a1_scales{std::size_t(max_rows * g_h)};
  const cuda::permute::GatherProblem gp{er, t, k, h, QuantScheme::fp8_block, ScaleLayout::mn_major_per_expert};
  const auto gather = [&] {
    cuda::permute::run(gp, {q.p, q_scales.p, {offsets.p, counts.p}, row_token.p, a1.p, a1_scales.p}, {}, stream);
  };
  report(m.name, "gather fp8-block mn-major", timer.median_us(gather),
         double(slots * (h + g_h * 4) + std::int64_t(used_rows) * (h + g_h * 4 + 4)));

  // Activation + requant (silu, fp8-block MN-major) on a GEMM1 output.
  {
    Buffer<std::uint16_t> h1{std::size_t(max_rows * 2 * in)};
    random_bf16(h1, -4.0f, 4.0f, 4);
    Buffer<std::uint8_t> a2{std::size_t(max_rows * in)};
    Buffer<float> a2_scales{std::size_t(max_rows * g_i)};
    cuda::activation::Problem ap;
    ap.rows = er;
    ap.tokens = t;
    ap.top_k = k;
    ap.intermediate = in;
    ap.quant = {QuantScheme::fp8_block, ScaleFormat::f32};
    ap.scale_layout = ScaleLayout::mn_major_per_expert;
    const auto activate = [&] {
      cuda::activation::run(ap, {h1.p, {offsets.p, counts.p}, nullptr, a2.p, a2_scales.p, {}}, {}, stream);
    };
    report(m.name, "activation silu -> fp8-block", timer.median_us(activate),
           double(slots * 2 * in * 2 + std::int64_t(used_rows) * (in + g_i * 4)));
  }

  // Finalize from the expert outputs.
  {
    Buffer<std::uint16_t> expert_out{std::size_t(max_rows * h)}, out{std::size_t(t * h)};
    random_bf16(expert_out, -4.0f, 4.0f, 5);
    const cuda::finalize::Problem fp{t, k, h};
    const auto finalize = [&] { cuda::finalize::run(fp, {expert_out.p, slot_rows.p, weights.p, out.p}, {}, stream); };
    report(m.name, "finalize (weighted, bf16)", timer.median_us(finalize), double(slots * h * 2 + slots * 8 + t * h * 2));
  }
  MOEKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
    cudaDeviceProp prop{};
    MOEKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    Timer timer;
    std::printf("device: %s, %d SMs, L2 %d MB; T=%lld; L2 flush: %s\n", prop.name, prop.multiProcessorCount,
                prop.l2CacheSize >> 20, static_cast<long long>(tokens), timer.flush_name());
    {
      const std::size_t bytes = std::size_t(2) << 30;
      Buffer<std::uint8_t> a(bytes), b(bytes);
      MOEKIT_CUDA_CHECK(cudaMemset(a.p, 1, bytes));
      const double us = timer.median_us([&] { MOEKIT_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice)); });
      copy_gbps = 2.0 * double(bytes) / us / 1e3;
      std::printf("copy roofline: cudaMemcpy D2D of %zu MB: %.1f us, %.0f GB/s (read + write)\n", bytes >> 20, us, copy_gbps);
    }
    RoutingConfig deepseek;
    deepseek.method = RoutingMethod::sigmoid_bias_grouped;
    deepseek.top_k = 8;
    deepseek.n_group = 8;
    deepseek.topk_group = 4;
    deepseek.routed_scaling_factor = 2.5f;
    RoutingConfig qwen;
    qwen.method = RoutingMethod::softmax_topk_renorm;
    qwen.top_k = 8;
    bench_model({"deepseek-v3", 7168, 2048, 256, 8, deepseek}, tokens, timer);
    bench_model({"qwen3-30b-a3b", 2048, 768, 128, 8, qwen}, tokens, timer);

    std::printf("\n| model | stage | µs | MB moved | GB/s | %% of copy (%.0f GB/s) |\n|---|---|---:|---:|---:|---:|\n", copy_gbps);
    for (const Row& r : rows)
      std::printf("| %s | %s | %.1f | %.1f | %.0f | %.1f |\n", r.model.c_str(), r.stage.c_str(), r.us, r.bytes / 1e6,
                  r.bytes / r.us / 1e3, 100.0 * r.bytes / r.us / 1e3 / copy_gbps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_stages_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
