#include "bench_gpu.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <regex>
#include <vector>

#include "moekit/error.h"

#ifdef MOEKIT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#endif

namespace moekit::cli {

#ifdef MOEKIT_HAVE_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) { check(cudaMalloc(&p_, bytes), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(p_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

// Median milliseconds of `runs` calls after `warmup`, CUDA events on the default stream.
double median_ms(const std::function<void()>& call, int warmup, int runs) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < warmup + runs; ++i) {
    cudaEventRecord(start);
    call();
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "timed call");
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    if (i >= warmup) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double measure_copy_gbs() {
  const std::size_t bytes = std::size_t(2) << 30;
  DeviceMemory a(bytes), b(bytes);
  check(cudaMemset(a.get(), 1, bytes), "cudaMemset");
  const double ms = median_ms([&] { cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice); }, 2, 10);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

// Random finite values (timing on zeros or constants flatters the tensor cores' power):
// fp8 codes with the top exponent bit clear (no NaN), bf16 in ±[0.5, 1).
void fill_random(void* p, std::size_t n, bool fp8) {
  std::vector<std::uint16_t> host(n / 2);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::uint16_t& v : host) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = fp8 ? std::uint16_t(x & 0xbfbf) : std::uint16_t((x & 0x807f) | 0x3f00);
  }
  check(cudaMemcpy(p, host.data(), n, cudaMemcpyHostToDevice), "cudaMemcpy");
}

enum class Rate { bf16, fp8_tensor, fp8_block };

// The rate of one D[n, m] = W[n, k] x X[m, k]^T GEMM (cuBLASLt column-major: D = op(A) B with
// A = W transposed), bf16 out, f32 accumulation. Returns 0 and sets why when cuBLASLt refuses.
double gemm_tflops(cublasLtHandle_t lt, Rate rate, std::string& why) {
  constexpr std::int64_t kN = 8192;
  const bool fp8 = rate != Rate::bf16;
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const std::size_t elem = fp8 ? 1 : 2;
  DeviceMemory a(kN * kN * elem), b(kN * kN * elem), d(kN * kN * 2), workspace(std::size_t(64) << 20);
  const std::size_t scale_floats = std::size_t(kN) * (kN / 128);  // covers every scale layout here
  DeviceMemory scale_a(scale_floats * 4), scale_b(scale_floats * 4);
  fill_random(a.get(), kN * kN * elem, fp8);
  fill_random(b.get(), kN * kN * elem, fp8);
  const std::vector<float> scales(scale_floats, 0.5f);
  check(cudaMemcpy(scale_a.get(), scales.data(), scale_floats * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(scale_b.get(), scales.data(), scale_floats * 4, cudaMemcpyHostToDevice), "cudaMemcpy");

  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  double tflops = 0;
  const auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  };
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  bool ready = ok(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
               ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa))) &&
               ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (ready && fp8) {
    const void* pa = scale_a.get();
    const void* pb = scale_b.get();
    ready = ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof(pa))) &&
            ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof(pb)));
    if (ready && rate == Rate::fp8_block) {
      // A = the weights (128x128 blocks), B = the activations (1x128 groups along K).
      const cublasLtMatmulMatrixScale_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      const cublasLtMatmulMatrixScale_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      ready = ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a))) &&
              ok(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
    }
  }
  const std::size_t workspace_bytes = std::size_t(64) << 20;
  ready = ready && ok(cublasLtMatrixLayoutCreate(&la, in_type, kN, kN, kN)) &&
          ok(cublasLtMatrixLayoutCreate(&lb, in_type, kN, kN, kN)) &&
          ok(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, kN, kN, kN)) && ok(cublasLtMatmulPreferenceCreate(&pref)) &&
          ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  ready = ready && ok(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &found)) && found > 0;
  if (!ready) {
    why = "cuBLASLt has no algorithm for it here";
    cleanup();
    return 0;
  }
  const float alpha = 1.0f, beta = 0.0f;
  bool ran = true;
  const double ms = median_ms(
      [&] {
        ran = ran && ok(cublasLtMatmul(lt, desc, &alpha, a.get(), la, b.get(), lb, &beta, d.get(), ld, d.get(), ld,
                                       &heuristic.algo, workspace.get(), workspace_bytes, nullptr));
      },
      3, 20);
  if (ran) tflops = 2.0 * double(kN) * double(kN) * double(kN) / (ms * 1e-3) / 1e12;
  else why = "cublasLtMatmul failed";
  cleanup();
  return tflops;
}

}  // namespace

GpuInfo gpu_info() {
  GpuInfo info;
  cudaDeviceProp prop{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.sms = prop.multiProcessorCount;
  // The kernel module's version line: "NVRM version: NVIDIA UNIX ... Kernel Module  580.159.04 ...".
  std::ifstream version("/proc/driver/nvidia/version");
  std::string line;
  std::smatch m;
  if (std::getline(version, line) && std::regex_search(line, m, std::regex(R"((\d+\.\d+(\.\d+)?))"))) {
    info.driver = m[1];
  } else {
    int v = 0;
    cudaDriverGetVersion(&v);
    info.driver = "CUDA driver API " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  }
  return info;
}

Ceilings measure_ceilings(bool matrix) {
  Ceilings c;
  c.copy_gbs = measure_copy_gbs();
  c.source = "copy: 2 GiB cudaMemcpy D2D";
  if (!matrix) return c;
  cublasLtHandle_t lt = nullptr;
  if (!ok(cublasLtCreate(&lt))) throw Error("cublasLtCreate failed");
  const std::pair<Rate, double Ceilings::*> rates[] = {
      {Rate::bf16, &Ceilings::bf16_tflops}, {Rate::fp8_tensor, &Ceilings::fp8_tflops}, {Rate::fp8_block, &Ceilings::fp8_block_tflops}};
  const char* names[] = {"bf16", "fp8 per-tensor", "fp8 blockwise"};
  c.source += "; matrix: cuBLASLt 8192^3, bf16 out";
  for (std::size_t i = 0; i < std::size(rates); ++i) {
    std::string why;
    c.*rates[i].second = gemm_tflops(lt, rates[i].first, why);
    if (!why.empty()) c.source += std::string("; ") + names[i] + ": " + why;
  }
  cublasLtDestroy(lt);
  return c;
}

#else

GpuInfo gpu_info() { throw Error("this build has no CUDA"); }
Ceilings measure_ceilings(bool) { throw Error("this build has no CUDA"); }

#endif

}  // namespace moekit::cli
