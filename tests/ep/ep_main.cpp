// The main of the EP tests: MPI up, one communicator over the world, GoogleTest on every
// rank. Rank 0 prints as usual; the other ranks print only their failures, with their rank.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "ep/ep_test_util.h"

namespace moekit::test {
namespace {

Communicator* g_world = nullptr;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

Communicator& world() { return *g_world; }

}  // namespace moekit::test

int main(int argc, char** argv) {
  moekit::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Long enough for a slow sanitizer build on two oversubscribed cores; short enough for CI.
  const std::unique_ptr<moekit::Communicator> world = moekit::make_mpi_communicator({std::chrono::seconds(120)});
  moekit::test::g_world = world.get();
  if (world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new moekit::test::FailurePrinter(world->rank()));
  }
  return RUN_ALL_TESTS();
}
