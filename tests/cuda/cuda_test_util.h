// Helpers for the CUDA tests: GPU presence, device buffers, transfers, poisoning, ulps.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/stages.h"
#include "test_util.h"

namespace moekit::test {

// Whether a CUDA device is usable; every CUDA test starts with
//   if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
inline bool have_gpu() {
  static const bool present = [] {
    int count = 0;
    const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    cudaGetLastError();  // a failed query leaves a sticky error behind
    return ok;
  }();
  return present;
}

// MOEKIT_CUDA_TEST_SMALL=1 shrinks the cases (for compute-sanitizer runs).
inline bool small_cases() {
  const char* v = std::getenv("MOEKIT_CUDA_TEST_SMALL");
  return v && *v && std::string(v) != "0";
}

#define MOEKIT_EXPECT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device memory of `count` elements of T (at least one byte is allocated).
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t count) : count_(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&data_), std::max<std::size_t>(1, count * sizeof(T))) != cudaSuccess) {
      data_ = nullptr;
      ADD_FAILURE() << "cudaMalloc of " << count * sizeof(T) << " bytes failed";
    }
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (data_) cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : data_(o.data_), count_(o.count_) { o.data_ = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    return *this;
  }

  T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  void upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), count_);
    if (!host.empty()) {
      ASSERT_EQ(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  // 0xff bytes: NaN as f32, bf16 and fp8, -1 as i32.
  void poison() const {
    if (count_ > 0) {
      EXPECT_EQ(cudaMemset(data_, 0xff, bytes()), cudaSuccess);
    }
  }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Device workspace of the size an op asks for.
class DeviceWorkspace {
 public:
  explicit DeviceWorkspace(std::size_t bytes) : buffer_(bytes) {}
  core::Workspace get() const { return {reinterpret_cast<std::byte*>(buffer_.data()), buffer_.bytes()}; }

 private:
  DeviceArray<std::uint8_t> buffer_;
};

// Waits for the GPU and fails the test on any asynchronous error.
inline void sync_and_check() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError()); }

// Distance in units in the last place between two floats of the same sign (NaN: huge).
inline std::int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : (std::int64_t(1) << 40);
  auto ordered = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? -std::int64_t(u & 0x7fffffffu) : std::int64_t(u);
  };
  const std::int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

inline std::vector<std::uint16_t> random_bf16(std::size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(dist(rng)).bits;
  return v;
}

inline std::vector<float> random_f32(std::size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace moekit::test
