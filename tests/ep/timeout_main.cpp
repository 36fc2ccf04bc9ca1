// A rank that leaves or stalls must make the others fail with an Error within the
// communicator's timeout, never hang. Run as: mpirun -np N test_ep_timeout exit|stall|finalize
//   exit:     the last rank ends its process without a word (needs mpirun's
//             --mca orte_allowed_exit_without_sync 1, else mpirun ends the whole job)
//   finalize: the last rank leaves cleanly (MPI_Finalize) before the second forward
//   stall:    the last rank sleeps for twice the timeout before its second forward
// Every rank first runs one forward with all ranks present. Exit code 0 when every
// surviving rank saw an Error saying "timed out" within timeout + slack.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/synthetic.h"
#include "moekit/moekit.h"

using namespace moekit;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kTimeout = std::chrono::seconds(3);
constexpr auto kSlack = std::chrono::seconds(3);

int check(bool ok, int rank, const std::string& what) {
  std::printf("[rank %d] %s: %s\n", rank, ok ? "ok" : "FAILED", what.c_str());
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "exit" && mode != "finalize" && mode != "stall") {
    std::fprintf(stderr, "usage: test_ep_timeout exit|finalize|stall\n");
    return 2;
  }
  MpiSession mpi(&argc, &argv);
  std::unique_ptr<Communicator> comm = make_mpi_communicator({kTimeout});
  const int rank = comm->rank(), size = comm->size();
  const bool victim = rank == size - 1;

  MoEConfig c;
  c.num_experts = 12;
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.routing.top_k = 4;
  c.quant.scheme = QuantScheme::fp8_block;
  c.ep_size = size;
  c.ep_rank = rank;
  const core::SyntheticLayer weights = core::make_synthetic_layer(c, 11);
  LayerOptions options;
  options.comm = comm.get();
  Layer layer(c, weights.weights(), options);
  const Tensor hidden = core::make_hidden(8, c.hidden_size, 100 + std::uint64_t(rank));
  const Tensor logits = core::make_router_logits(8, c.num_experts, DType::f32, 100 + std::uint64_t(rank));
  Tensor out(DType::bf16, {8, c.hidden_size});
  const FusedArgs args{hidden.view(), logits.view(), out.view(), {}, {}};

  layer.forward(args);  // everyone present
  int failures = 0;
  if (victim && mode == "exit") {
    std::fflush(stdout);
    std::_Exit(0);
  }
  if (victim && mode == "finalize") {
    comm.reset();
    return 0;  // MpiSession finalizes
  }
  if (victim) std::this_thread::sleep_for(2 * kTimeout);

  const Clock::time_point start = Clock::now();
  std::string message;
  try {
    layer.forward(args);
  } catch (const Error& e) {
    message = e.what();
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  failures += check(message.find("timed out") != std::string::npos, rank, "error: " + (message.empty() ? "(none)" : message));
  failures += check(waited <= kTimeout + kSlack, rank, "failed after " + std::to_string(waited.count()) + " ms");
  // The broken communicator refuses further work at once.
  try {
    comm->barrier(nullptr);
    failures += check(false, rank, "a broken communicator still works");
  } catch (const Error& e) {
    failures += check(std::strstr(e.what(), "unusable") != nullptr, rank, std::string("then: ") + e.what());
  }
  // With a peer gone for good, MPI_Finalize (a fence over every process) may wait forever:
  // end without it, as mpirun was told to allow.
  std::fflush(stdout);
  if (mode == "exit") std::_Exit(failures ? 1 : 0);
  return failures ? 1 : 0;
}
