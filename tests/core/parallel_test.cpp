// MOEKIT_NUM_THREADS (src/core/parallel.h): a count, or a clean Error naming the variable;
// before issue #19 a non-number was silently ignored and a huge count aborted. parallel_for:
// every index exactly once, over many short jobs back to back (the pool once hung there).
#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/error.h"
#include "scoped_env.h"

namespace moekit::core {
namespace {

struct ThreadsCase {
  const char* name;
  const char* value;
  int threads;  // 0: an Error
};

class CoreNumThreads : public ::testing::TestWithParam<ThreadsCase> {};

TEST_P(CoreNumThreads, IsTheCountOrAnErrorNamingTheVariable) {
  const ThreadsCase& c = GetParam();
  test::ScopedEnv env("MOEKIT_NUM_THREADS", c.value);
  if (c.threads > 0) {
    EXPECT_EQ(num_threads(), c.threads);
    if (c.threads > 8) return;  // the pool is created once per process: not 1024 threads here
    std::atomic<std::int64_t> sum{0};
    parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
    return;
  }
  for (int call = 0; call < 2; ++call) {  // num_threads, then a parallel_for that needs it
    try {
      if (call == 0) num_threads();
      else parallel_for(1000, 1, [](std::int64_t, std::int64_t) {});
      ADD_FAILURE() << "no error for '" << c.value << "'";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MOEKIT_NUM_THREADS: expected an integer in [1, 1024], given '" + std::string(c.value) + "'"),
                std::string::npos)
          << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CoreNumThreads,
                         ::testing::Values(ThreadsCase{"one", "1", 1}, ThreadsCase{"three", "3", 3},
                                           ThreadsCase{"most", "1024", 1024}, ThreadsCase{"empty", "", 0},
                                           ThreadsCase{"word", "four", 0}, ThreadsCase{"trailing", "4x", 0},
                                           ThreadsCase{"space", " 4", 0}, ThreadsCase{"zero", "0", 0},
                                           ThreadsCase{"negative", "-2", 0}, ThreadsCase{"too_many", "1025", 0},
                                           ThreadsCase{"huge", "100000000", 0},
                                           ThreadsCase{"past_int", "99999999999999999999", 0},
                                           ThreadsCase{"fraction", "2.5", 0}),
                         [](const ::testing::TestParamInfo<ThreadsCase>& info) { return std::string(info.param.name); });

TEST(CoreNumThreads, UnsetIsTheHardware) {
  test::ScopedEnv env("MOEKIT_NUM_THREADS", nullptr);
  EXPECT_GE(num_threads(), 1);
  EXPECT_LE(num_threads(), kMaxThreads);
}

// Short jobs back to back leave workers still leaving one job as the next is posted: each index
// of each job must run once, and every job must end (the differential campaign's hangs on the
// H200's 16 threads: a late worker counted a chunk of the next job twice, run() waited forever).
TEST(CoreParallelFor, ManyShortJobsRunEachIndexOnce) {
  for (int job = 0; job < 20000; ++job) {
    const std::int64_t n = 1 + job % 67;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    parallel_for(n, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) hits[std::size_t(i)].fetch_add(1);
    });
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[std::size_t(i)].load(), 1) << "job " << job << " index " << i;
  }
}

TEST(CoreParallelFor, AnErrorInAChunkReachesTheCaller) {
  EXPECT_THROW(parallel_for(64, 1,
                            [](std::int64_t begin, std::int64_t) {
                              if (begin == 0) throw Error("chunk 0");
                            }),
               Error);
  std::atomic<int> after{0};
  parallel_for(64, 1, [&](std::int64_t begin, std::int64_t end) { after += int(end - begin); });
  EXPECT_EQ(after.load(), 64) << "the pool still works after an error";
}

}  // namespace
}  // namespace moekit::core
