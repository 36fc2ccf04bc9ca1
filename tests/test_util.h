// Shared helpers for the tests: data paths, random fills, poisoning.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "moekit/tensor.h"

namespace moekit::test {

inline std::string data_path(const std::string& relative) {
  return std::string(MOEKIT_TEST_DATA) + "/" + relative;
}

// A fresh seed per call, so every comparison draws new data (each caller prints it on failure,
// SCOPED_TRACE("seed ...")). MOEKIT_TEST_SEED=N makes every call return N: a printed failure runs
// again as it was. CI fixes it (scripts/test.sh); the device scripts draw one per run and print it.
inline std::uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("MOEKIT_TEST_SEED")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(fixed, &end, 10);
    if (*fixed < '0' || *fixed > '9' || *end != '\0')  // a typo must not turn into seed 0 silently
      throw std::invalid_argument(std::string("MOEKIT_TEST_SEED: expected a decimal integer, given '") + fixed + "'");
    return v;
  }
  static std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

// Uniform f32 values in [lo, hi) written as the tensor's dtype (f32, bf16).
inline void fill_uniform(Tensor& t, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng);
    if (t.dtype() == DType::f32) t.ptr<float>()[i] = v;
    else t.ptr<bf16>()[i] = float_to_bf16(v);
  }
}

// Fills with a byte pattern that is NaN for f32, bf16 and fp8 and a large negative for ints,
// so an element nothing wrote stands out.
inline void poison(const TensorView& t) { std::memset(t.data, 0xff, t.nbytes()); }

}  // namespace moekit::test
