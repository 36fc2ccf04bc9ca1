// MOEKIT_NUM_THREADS (src/core/parallel.h): a count, or a clean Error naming the variable;
// before issue #19 a non-number was silently ignored and a huge count aborted.
#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>

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

}  // namespace
}  // namespace moekit::core
