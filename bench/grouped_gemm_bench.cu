// Grouped GEMM benchmark on the GPU: each kind x tile on MoE shapes, random data (never zeros),
// CUDA events, warm-up then the median of 20 runs. Prints one table row per case; TFLOP/s count
// the rows that carry data, `pad` is the share of computed rows that are tile padding.
//   grouped_gemm_bench [--groups G --rows M --n N --k K]   (default: the issue's cases)
//   grouped_gemm_bench --masked | --decode                  (the masked-format cases; decode's and them)
//   grouped_gemm_bench --cases FILE   fp8-block cases, one a line: `label N K rows0 rows1 ...` (a group's
//                                     rows each; e.g. a layer file's routing, as DeepGEMM's peer runs them)
//   MOEKIT_BENCH_NO_F16=1: leave out the f16 (strict) tiles
//   MOEKIT_BENCH_TILES=a,b: only the tiles whose name contains one of these (e.g. persistent,cooperative)
//   MOEKIT_BENCH_ONCE=1: one launch per tile and case, no warm-up (ncu: one profiled launch per row)
//   MOEKIT_BENCH_COLD=1: 256 MiB read before each timed run (outside the events) evicts the L2, so
//     that decode cases, whose hit weights fit in it, stream them from HBM as the layer does
// Groups sit in A and D as the layer's plan puts them: each padded to 16 rows, the counts given.
// Ragged cases take each group's rows from a routing: T tokens, each to top_k distinct experts of
// E drawn uniformly (seeded), as deepseek-v3's T = 4096 routing spreads ~128 +- 11 rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/common/evict.h"
#include "cuda/gemm/grouped_gemm.h"

namespace {

using moekit::cuda::GemmKind;
using moekit::cuda::GemmTile;

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

__device__ unsigned hash(unsigned x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}

// fp8 codes of magnitude ~2^-2..2^3 with random sign, or bf16 in [-1, 1): no zeros, no NaN.
__global__ void fill_random(unsigned char* p, std::size_t bytes, bool fp8, unsigned seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += std::size_t(gridDim.x) * blockDim.x) {
    const unsigned h = hash(unsigned(i) * 2654435761U ^ seed);
    if (fp8) p[i] = (unsigned char)(((h & 0x80) | (0x28 + (h >> 8) % 40)));
    else p[i] = (i & 1) ? (unsigned char)(0x3c | ((h >> 7) & 0x80) | ((h >> 12) & 0x3)) : (unsigned char)h;
  }
}

__global__ void fill_scales(float* p, std::size_t count, unsigned seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x)
    p[i] = 1e-3f * (1.0f + float(hash(unsigned(i) ^ seed) % 1000) / 1000.0f);
}

// MOEKIT_BENCH_ONCE=1: each tile's kernel launched once per case, no warm-up (for a profiler: one
// launch per table row, in the table's order).
bool once() { return std::getenv("MOEKIT_BENCH_ONCE") != nullptr; }

struct Case {
  GemmKind kind;
  int groups;
  long long rows_per_group, n, k;
  int routed_tokens = 0, top_k = 0;  // > 0: rows per group from a uniform random routing
  long long capacity = 0;            // > 0: the masked format, each group in a block of this many rows
  std::vector<long long> given = {};  // non-empty: each group's rows (--cases)
  std::string label = {};
};

// Rows per expert of `tokens` tokens routed each to top_k distinct experts, uniformly.
std::vector<long long> routed_rows(const Case& c) {
  if (!c.given.empty()) return c.given;
  std::vector<long long> rows(std::size_t(c.groups), c.rows_per_group);
  if (c.routed_tokens == 0) return rows;
  std::fill(rows.begin(), rows.end(), 0);
  unsigned state = 12345;
  auto next = [&] { state = state * 1664525u + 1013904223u; return state >> 8; };
  for (int t = 0; t < c.routed_tokens; ++t) {
    std::vector<int> picked;
    while (int(picked.size()) < c.top_k) {
      const int e = int(next() % unsigned(c.groups));
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
    }
    for (int e : picked) ++rows[std::size_t(e)];
  }
  return rows;
}


// MOEKIT_BENCH_TILES: a comma-separated list of parts of tile names; unset: every tile.
bool selected(GemmTile tile) {
  const char* env = std::getenv("MOEKIT_BENCH_TILES");
  if (!env || !*env) return true;
  const std::string name(moekit::cuda::to_string(tile)), list(env);
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string part = list.substr(at, end - at);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    at = end + 1;
  }
  return false;
}

// --cases FILE: one fp8-block case a line, `label N K rows0 rows1 ...`.
std::vector<Case> read_cases(const char* path) {
  std::vector<Case> out;
  std::FILE* f = std::fopen(path, "r");
  if (!f) {
    std::fprintf(stderr, "--cases: cannot open %s\n", path);
    std::exit(2);
  }
  char line[1 << 16];
  while (std::fgets(line, sizeof line, f)) {
    Case c{GemmKind::fp8_block, 0, 0, 0, 0};
    char label[256];
    int used = 0;
    if (std::sscanf(line, "%255s %lld %lld%n", label, &c.n, &c.k, &used) != 3) continue;
    c.label = label;
    for (const char* p = line + used;;) {
      char* end = nullptr;
      const long long r = std::strtoll(p, &end, 10);
      if (end == p) break;
      c.given.push_back(r < 0 ? 0 : r);
      p = end;
    }
    c.groups = int(c.given.size());
    if (c.groups > 0 && c.n > 0 && c.k > 0) out.push_back(c);
  }
  std::fclose(f);
  return out;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_case(const Case& c) {
  const std::vector<long long> group_rows = routed_rows(c);
  long long data = 0, max_group = 0, padded = 0;
  for (long long r : group_rows) data += r, max_group = std::max(max_group, r), padded += (r + 15) / 16 * 16;
  const long long rows = c.capacity > 0 ? c.groups * c.capacity : padded;  // rows of A and D
  const bool fp8 = c.kind != GemmKind::bf16;
  const std::size_t elem = fp8 ? 1 : 2;
  const long long kb = (c.k + 127) / 128, nb = c.kind == GemmKind::fp8_block ? (c.n + 127) / 128 : c.n;
  void *a, *w, *d, *a_s, *w_s, *offsets, *counts;
  CHECK(cudaMalloc(&a, rows * c.k * elem));
  CHECK(cudaMalloc(&w, c.groups * c.n * c.k * elem));
  CHECK(cudaMalloc(&d, rows * c.n * 2));
  CHECK(cudaMalloc(&a_s, (rows * kb + 128 * 64) * sizeof(float)));
  CHECK(cudaMalloc(&w_s, (c.groups * kb * nb + 128) * sizeof(float)));
  CHECK(cudaMalloc(&offsets, (c.groups + 1) * sizeof(int)));
  CHECK(cudaMalloc(&counts, c.groups * sizeof(int)));
  fill_random<<<1024, 256>>>(static_cast<unsigned char*>(a), rows * c.k * elem, fp8, 1);
  fill_random<<<1024, 256>>>(static_cast<unsigned char*>(w), c.groups * c.n * c.k * elem, fp8, 2);
  fill_scales<<<256, 256>>>(static_cast<float*>(a_s), rows * kb + 128 * 64, 3);
  CHECK(cudaMemset(d, 0xff, rows * c.n * 2));  // NaN: the rows a kernel leaves unwritten
  fill_scales<<<256, 256>>>(static_cast<float*>(w_s), c.groups * kb * nb + 128, 4);
  std::vector<int> off(c.groups + 1);
  std::vector<int> cnt(c.groups);
  for (int e = 0; e < c.groups; ++e) {
    cnt[e] = int(group_rows[std::size_t(e)]);
    off[e + 1] = off[e] + (c.capacity > 0 ? int(c.capacity) : (cnt[e] + 15) / 16 * 16);
  }
  CHECK(cudaMemcpy(offsets, off.data(), off.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(counts, cnt.data(), cnt.size() * sizeof(int), cudaMemcpyHostToDevice));

  // The rows that carry data; the weights of the groups that have rows, those rows and their outputs
  // are the bytes moved.
  const double flops = 2.0 * double(data) * double(c.n) * double(c.k);
  const long long hit = std::count_if(group_rows.begin(), group_rows.end(), [](long long r) { return r > 0; });
  const double weight_bytes = double(hit * c.n * c.k) * elem;
  const double bytes = double(data * c.k) * elem + weight_bytes + double(data * c.n) * 2;
  // Every tile that runs this case, set up first; then rounds in which each takes its turn, so that
  // the GPU's clock and temperature drift over the case weigh on all of them alike.
  struct Run {
    GemmTile tile;
    moekit::cuda::GroupedGemmDesc desc;
    void* workspace = nullptr;
    void* act_q = nullptr;
    void* act_scales = nullptr;
    moekit::cuda::GroupedGemmArgs args;
    std::vector<float> times;
  };
  std::vector<Run> runs;
  for (GemmTile tile : moekit::cuda::kAllGemmTiles) {
    const bool decode = tile == GemmTile::rows8_warp_mma || tile == GemmTile::tokens8_n128_wgmma ||
                        tile == GemmTile::tokens16_n128_wgmma || tile == GemmTile::tokens32_n128_wgmma ||
                        tile == GemmTile::tokens8_n256_act || tile == GemmTile::tokens16_n256_act ||
                        tile == GemmTile::tokens32_n256_act;
    if (decode && max_group > 32) continue;  // decode only
    // GEMM2 + the weighted combine needs the layer's slots: timed in the layer (moekit bench).
    if (moekit::cuda::output_of(tile) == moekit::cuda::GemmOutput::combined) continue;
    if (std::getenv("MOEKIT_BENCH_NO_F16") && (tile == GemmTile::m128_n128_f16 || tile == GemmTile::m64_n128_f16))
      continue;
    if (!selected(tile)) continue;
    Run r;
    r.tile = tile;
    r.desc = {c.kind, c.groups, c.n, c.k, rows, data};
    // GEMM1 + activation: N = 2I in, the activated FP8 rows [rows, I] and their scales out.
    const bool activated = moekit::cuda::output_of(tile) == moekit::cuda::GemmOutput::activated_fp8;
    if (activated) r.desc.output = moekit::cuda::GemmOutput::activated_fp8;
    const moekit::Status ok = moekit::cuda::can_implement(r.desc, {tile});
    if (!ok) {
      std::printf("%-12s %-22s skipped: %s\n", std::string(moekit::cuda::to_string(c.kind)).c_str(),
                  std::string(moekit::cuda::to_string(tile)).c_str(), ok.reason().c_str());
      continue;
    }
    CHECK(cudaMalloc(&r.workspace, moekit::cuda::workspace_size(r.desc, {tile})));
    r.args.a = a;
    r.args.a_scales = fp8 ? static_cast<float*>(a_s) : nullptr;
    r.args.offsets = static_cast<const std::int32_t*>(offsets);
    r.args.w = w;
    r.args.w_scales = fp8 ? static_cast<float*>(w_s) : nullptr;
    r.args.d = static_cast<moekit::bf16*>(d);
    r.args.counts = static_cast<const std::int32_t*>(counts);
    if (activated) {
      CHECK(cudaMalloc(&r.act_q, rows * (c.n / 2)));
      CHECK(cudaMalloc(&r.act_scales, rows * (c.n / 256) * sizeof(float)));
      r.args.activated = {r.act_q, static_cast<float*>(r.act_scales), moekit::Activation::silu_and_mul, 1.702f, 7.0f, false};
    }
    for (int i = 0; i < (once() ? 0 : 3); ++i) moekit::cuda::run_grouped_gemm(r.desc, {tile}, r.args, r.workspace, nullptr);
    runs.push_back(std::move(r));
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const std::size_t flush_bytes = std::getenv("MOEKIT_BENCH_COLD") ? std::size_t(256) << 20 : 0;
  void* flush = nullptr;
  if (flush_bytes > 0) {
    CHECK(cudaMalloc(&flush, flush_bytes));
    fill_random<<<1024, 256>>>(static_cast<unsigned char*>(flush), flush_bytes, false, 5);
  }
  for (int round = 0; round < (once() ? 1 : 4); ++round)
    for (Run& r : runs)
      for (int i = 0; i < (once() ? 1 : 6); ++i) {
        if (flush) moekit::cuda::evict_l2(flush, flush_bytes, nullptr);
        CHECK(cudaEventRecord(start));
        moekit::cuda::run_grouped_gemm(r.desc, {r.tile}, r.args, r.workspace, nullptr);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        r.times.push_back(ms);
      }
  for (Run& r : runs) {
    const GemmTile tile = r.tile;
    const double ms = median(r.times);
    long long computed = 0;
    for (long long rr : group_rows) computed += moekit::cuda::computed_rows(tile, rr);
    const std::string shape = !c.label.empty() ? c.label
                              : c.routed_tokens ? "routed T=" + std::to_string(c.routed_tokens) + " k=" + std::to_string(c.top_k)
                              : c.capacity > 0 ? "masked " + std::to_string(c.rows_per_group) + "/" + std::to_string(c.capacity)
                                               : "rows/group=" + std::to_string(c.rows_per_group);
    std::printf("%-12s %-32s groups=%-4d %-20s N=%-6lld K=%-6lld %9.1f us %8.1f TFLOP/s %7.0f GB/s W %7.0f GB/s pad %4.1f%%\n",
                std::string(moekit::cuda::to_string(c.kind)).c_str(), std::string(moekit::cuda::to_string(tile)).c_str(),
                c.groups, shape.c_str(), c.n, c.k, ms * 1e3, flops / ms / 1e9, bytes / ms / 1e6, weight_bytes / ms / 1e6,
                computed > 0 ? 100.0 * double(computed - data) / double(computed) : 0.0);
    cudaFree(r.workspace);
    cudaFree(r.act_q);
    cudaFree(r.act_scales);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (void* p : {a, w, d, a_s, w_s, offsets, counts, flush}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases;
  // The masked format (DeepEP low-latency dispatch): deepseek-v3's 256 experts x 8 rows in blocks
  // of 128; issue #17's target is >= 3.9 TB/s of weights on GEMM1.
  const std::vector<Case> masked = {
      {GemmKind::fp8_block, 256, 8, 4096, 7168, 0, 0, 128},
      {GemmKind::fp8_block, 256, 8, 7168, 2048, 0, 0, 128},
      {GemmKind::bf16, 256, 8, 4096, 7168, 0, 0, 128},
  };
  // Decode: the groups a few tokens hit, a row or two each.
  const std::vector<Case> decode = {
      {GemmKind::fp8_block, 8, 1, 4096, 7168},   // deepseek-v3 GEMM1, T=1: the 8 experts hit
      {GemmKind::fp8_block, 8, 1, 7168, 2048},   // deepseek-v3 GEMM2, T=1
      {GemmKind::fp8_block, 8, 1, 1536, 2048},   // qwen3-30b-a3b GEMM1, T=1
      {GemmKind::fp8_block, 8, 1, 2048, 768},    // qwen3-30b-a3b GEMM2, T=1
      {GemmKind::fp8_block, 48, 1, 4096, 7168},  // deepseek-v3 GEMM1, T=8 (~47 experts hit)
      {GemmKind::fp8_block, 256, 2, 4096, 7168},  // deepseek-v3 GEMM1, T=64
      {GemmKind::fp8_block, 256, 2, 7168, 2048},  // deepseek-v3 GEMM2, T=64
      {GemmKind::fp8_block, 128, 4, 1536, 2048},  // qwen3-30b-a3b GEMM1, T=64
      {GemmKind::fp8_block, 128, 4, 2048, 768},   // qwen3-30b-a3b GEMM2, T=64
  };
  if (argc == 2 && std::strcmp(argv[1], "--masked") == 0) {
    cases = masked;
  } else if (argc == 2 && std::strcmp(argv[1], "--decode") == 0) {
    cases = decode;
    cases.insert(cases.end(), masked.begin(), masked.end());
  } else if (argc == 3 && std::strcmp(argv[1], "--cases") == 0) {
    cases = read_cases(argv[2]);
  } else if (argc == 9) {
    cases.push_back({GemmKind::fp8_block, std::atoi(argv[2]), std::atoll(argv[4]), std::atoll(argv[6]), std::atoll(argv[8])});
  } else {
    cases = {
        {GemmKind::fp8_block, 8, 4096, 4096, 7168},    // the issue's target case
        {GemmKind::fp8_channel, 8, 4096, 4096, 7168},
        {GemmKind::bf16, 8, 4096, 4096, 7168},
        {GemmKind::fp8_block, 256, 128, 4096, 7168},   // deepseek-v3 GEMM1, T=4096 (k=8, balanced)
        {GemmKind::fp8_block, 256, 128, 7168, 2048},   // deepseek-v3 GEMM2, T=4096
        {GemmKind::fp8_block, 256, 155, 4096, 7168},   // deepseek-v3 GEMM1, T=4096, rows as its routing gives
        {GemmKind::fp8_block, 256, 155, 7168, 2048},   // deepseek-v3 GEMM2, same
        {GemmKind::fp8_block, 256, 0, 4096, 7168, 4096, 8},    // deepseek-v3 GEMM1, T=4096 uniform top-8
        {GemmKind::fp8_block, 256, 0, 7168, 2048, 4096, 8},    // deepseek-v3 GEMM2, T=4096 uniform top-8
        {GemmKind::fp8_block, 256, 0, 4096, 7168, 16384, 8},   // deepseek-v3 GEMM1, T=16384
        {GemmKind::fp8_block, 256, 0, 7168, 2048, 16384, 8},   // deepseek-v3 GEMM2, T=16384
        {GemmKind::fp8_block, 128, 0, 1536, 2048, 4096, 8},    // qwen3-30b-a3b GEMM1, T=4096
        {GemmKind::fp8_block, 128, 0, 2048, 768, 4096, 8},     // qwen3-30b-a3b GEMM2, T=4096
        {GemmKind::fp8_block, 128, 0, 1536, 2048, 16384, 8},   // qwen3-30b-a3b GEMM1, T=16384
        {GemmKind::fp8_block, 128, 0, 2048, 768, 16384, 8},    // qwen3-30b-a3b GEMM2, T=16384
        {GemmKind::fp8_block, 256, 2, 4096, 7168},     // deepseek-v3 GEMM1, T=64 (decode-ish)
        {GemmKind::fp8_block, 8, 1, 4096, 7168},       // deepseek-v3 GEMM1, T=1: the 8 experts hit
        {GemmKind::fp8_block, 8, 1, 7168, 2048},       // deepseek-v3 GEMM2, T=1
        {GemmKind::fp8_block, 8, 1, 1536, 2048},       // qwen3-30b-a3b GEMM1, T=1
        {GemmKind::fp8_block, 8, 1, 2048, 768},        // qwen3-30b-a3b GEMM2, T=1
        {GemmKind::fp8_block, 48, 1, 4096, 7168},      // deepseek-v3 GEMM1, T=8 (~47 experts hit)
    };
    cases.insert(cases.end(), masked.begin(), masked.end());
  }
  std::printf("%-12s %-30s %s\n", "kind", "tile", "shape / time / rate");
  for (const Case& c : cases) run_case(c);
  return 0;
}
