// cuda::evict_l2 (the tuner's and grouped_gemm_bench's L2 eviction): it reads its buffer and leaves
// every byte as it was; a buffer it cannot read in 16-byte vectors is refused by name, before any
// launch (host code: this part runs without a GPU too).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/common/evict.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace moekit::test {
namespace {

TEST(CudaEvictL2, ABufferItCannotReadInVectorsIsRefused) {
  alignas(16) static unsigned char bytes[64];
  for (const auto& [buffer, size] : std::vector<std::pair<const void*, std::size_t>>{
           {nullptr, 16}, {bytes + 4, 32}, {bytes, 24}}) {
    try {
      cuda::evict_l2(buffer, size, nullptr);
      ADD_FAILURE() << "evict_l2 took a buffer at offset " << (buffer ? static_cast<const unsigned char*>(buffer) - bytes : -1)
                    << " of " << size << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("evict_l2: a 16-byte aligned buffer"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaEvictL2, ReadsTheBufferAndLeavesItAsItWas) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> host((std::size_t(96) << 20) / 4);  // past the L2 of an H200 (60 MB)
  for (std::uint32_t& v : host) v = std::uint32_t(rng());
  DeviceArray<std::uint32_t> buffer(host);
  cuda::evict_l2(buffer.data(), buffer.bytes(), nullptr);
  sync_and_check();
  const std::vector<std::uint32_t> after = buffer.download();
  for (std::size_t i = 0; i < host.size(); ++i) ASSERT_EQ(after[i], host[i]) << "word " << i;
}

}  // namespace
}  // namespace moekit::test
