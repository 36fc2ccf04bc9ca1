// The collectives of the MPI communicator (and the self one), on every rank of the run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "ep/ep_test_util.h"

namespace moekit::test {
namespace {

// Units from rank s to rank d: (s + 2d) % 3, zero for some pairs; each byte names (s, d, i).
std::int64_t units(int s, int d) { return (s + 2 * d) % 3; }
std::uint8_t byte_of(int s, int d, std::size_t i) { return std::uint8_t(31 * s + 7 * d + i); }

TEST(EpComm, AllToAllVMovesEachBlockToItsRank) {
  Communicator& c = world();
  const int n = c.size(), me = c.rank();
  constexpr std::size_t kUnit = 5;
  std::vector<std::int64_t> send_counts(static_cast<std::size_t>(n)), recv_counts(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    send_counts[std::size_t(r)] = units(me, r);
    recv_counts[std::size_t(r)] = units(r, me);
  }
  // Offsets in reverse rank order: blocks need not be in rank order.
  auto reversed = [&](const std::vector<std::int64_t>& counts) {
    std::vector<std::int64_t> offsets(counts.size());
    std::int64_t at = 0;
    for (int r = n - 1; r >= 0; --r) {
      offsets[std::size_t(r)] = at;
      at += counts[std::size_t(r)];
    }
    return offsets;
  };
  const std::vector<std::int64_t> send_offsets = reversed(send_counts), recv_offsets = reversed(recv_counts);
  std::vector<std::uint8_t> send(kUnit * std::size_t(std::accumulate(send_counts.begin(), send_counts.end(), 0)) + 1);
  std::vector<std::uint8_t> recv(kUnit * std::size_t(std::accumulate(recv_counts.begin(), recv_counts.end(), 0)) + 1,
                                 0xee);
  for (int d = 0; d < n; ++d)
    for (std::size_t i = 0; i < kUnit * std::size_t(send_counts[std::size_t(d)]); ++i)
      send[kUnit * std::size_t(send_offsets[std::size_t(d)]) + i] = byte_of(me, d, i);
  c.all_to_all_v({send.data(), send_counts, send_offsets, recv.data(), recv_counts, recv_offsets, kUnit}, nullptr);
  for (int s = 0; s < n; ++s)
    for (std::size_t i = 0; i < kUnit * std::size_t(recv_counts[std::size_t(s)]); ++i)
      ASSERT_EQ(recv[kUnit * std::size_t(recv_offsets[std::size_t(s)]) + i], byte_of(s, me, i))
          << "from rank " << s << " byte " << i;
  EXPECT_EQ(recv.back(), 0xee) << "written past the end";
}

TEST(EpComm, AllGatherConcatenatesInRankOrder) {
  Communicator& c = world();
  const std::int64_t mine[2] = {c.rank(), 100 + c.rank()};
  std::vector<std::int64_t> all(2 * std::size_t(c.size()), -1);
  c.all_gather(mine, all.data(), sizeof mine, nullptr);
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[2 * std::size_t(r)], r);
    EXPECT_EQ(all[2 * std::size_t(r) + 1], 100 + r);
  }
}

TEST(EpComm, AllReduceMaxIsElementwise) {
  Communicator& c = world();
  const float inf = std::numeric_limits<float>::infinity();
  float v[4] = {float(c.rank()), -float(c.rank()), c.rank() == c.size() - 1 ? 1e-30f : 0.0f, -inf};
  c.all_reduce_max(v, 4, nullptr);
  EXPECT_EQ(v[0], float(c.size() - 1));
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[2], 1e-30f);
  EXPECT_EQ(v[3], -inf);
}

TEST(EpComm, BroadcastFromEveryRoot) {
  Communicator& c = world();
  for (int root = 0; root < c.size(); ++root) {
    std::uint64_t v = c.rank() == root ? 0xabcdef00ull + std::uint64_t(root) : 0;
    c.broadcast(&v, sizeof v, root, nullptr);
    EXPECT_EQ(v, 0xabcdef00ull + std::uint64_t(root));
  }
  c.barrier(nullptr);
}

TEST(EpComm, MpiRejectsWrongCountsWithoutCommunicating) {
  Communicator& c = world();
  const std::vector<std::int64_t> one(1, 0), many(std::size_t(c.size()) + 1, 0);
  const std::vector<std::int64_t>& wrong = c.size() == 1 ? many : one;
  try {
    c.all_to_all_v({nullptr, wrong, wrong, nullptr, wrong, wrong, 1}, nullptr);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("counts"), std::string::npos) << e.what();
  }
  c.barrier(nullptr);  // still usable: nothing was sent
}

TEST(EpComm, SelfCommunicatorCopies) {
  const std::unique_ptr<Communicator> self = make_self_communicator();
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->rank(), 0);
  const std::vector<std::int64_t> counts{3}, offsets{0};
  const std::uint8_t send[3] = {1, 2, 3};
  std::uint8_t recv[3] = {};
  self->all_to_all_v({send, counts, offsets, recv, counts, offsets, 1}, nullptr);
  EXPECT_EQ(recv[2], 3);
  float v = 2.0f;
  self->all_reduce_max(&v, 1, nullptr);
  EXPECT_EQ(v, 2.0f);
}

TEST(EpComm, NcclAbsentOrNeedsAHostBootstrap) {
  if (!nccl_available()) {
    EXPECT_THROW(make_nccl_communicator(world(), 0), Error);
    return;
  }
  GTEST_SKIP() << "NCCL is built; tests/cuda/nccl_comm_test.cpp covers it on a GPU";
}

}  // namespace
}  // namespace moekit::test
