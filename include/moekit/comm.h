// Communicators: the transport of expert parallelism (DESIGN §7). MPI moves host memory
// between CPU ranks (and launches the processes that bootstrap NCCL); NCCL moves GPU
// memory between GPU ranks. Every collective either completes or throws moekit::Error
// within the communicator's timeout: a peer that died or stalls never hangs the others.
// After such an Error the communicator is broken (MPI cannot cancel a collective): each
// later call throws at once, and the process should end.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "moekit/backend.h"
#include "moekit/tensor.h"

namespace moekit {

// An all-to-all with a count per peer. Counts and offsets are in units of unit_bytes
// (one record, one row) and live on the host, one entry per rank; the data lives where
// the communicator's device() says. Rank r's send block r arrives as rank r's recv block
// of this rank; zero counts are allowed.
struct AllToAllV {
  const void* send = nullptr;
  std::span<const std::int64_t> send_counts;   // [size]
  std::span<const std::int64_t> send_offsets;  // [size]
  void* recv = nullptr;
  std::span<const std::int64_t> recv_counts;   // [size]
  std::span<const std::int64_t> recv_offsets;  // [size]
  std::size_t unit_bytes = 1;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;  // "mpi", "nccl", "self"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of the collectives live: Device::cpu (MPI, self) or Device::cuda (NCCL).
  virtual Device device() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  virtual void all_to_all_v(const AllToAllV& args, Stream stream) = 0;
  // recv [size * bytes] = every rank's send [bytes], in rank order.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes, Stream stream) = 0;
  // values [count] = elementwise max over the ranks (in place).
  virtual void all_reduce_max(float* values, std::int64_t count, Stream stream) = 0;
  // data [bytes] = root's data on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root, Stream stream) = 0;
  virtual void barrier(Stream stream) = 0;
  // Waits for the collectives queued on stream (NCCL), failing within timeout();
  // MPI's collectives are already complete when they return.
  virtual void synchronize(Stream stream) = 0;
};

struct CommOptions {
  // How long one collective may wait for its peers before it throws.
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
};

// Whether this build has each transport (MOEKIT_WITH_MPI; NCCL with CUDA).
bool mpi_available();
bool nccl_available();

// Owns MPI for a process that uses it: MPI_Init_thread (funneled) at construction,
// MPI_Finalize at destruction. Throws Error when built without MPI.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int world_rank() const;
  int world_size() const;
  // This process's rank among those on its node: the GPU a rank per GPU takes.
  int local_rank() const;
  // Ends every process of the job (MPI_Abort): for a command line that failed on one rank.
  [[noreturn]] void abort(int code) const;

 private:
  [[maybe_unused]] bool owns_ = false;  // used by the MPI build only
};

// Over a duplicate of MPI_COMM_WORLD (MPI must be initialized). Collective over the world.
std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options = {});

// One process alone (size 1, host buffers): the collectives are copies.
std::unique_ptr<Communicator> make_self_communicator(const CommOptions& options = {});

// NCCL over the same ranks as bootstrap (a host communicator, e.g. MPI), on CUDA device
// `cuda_device`: rank 0 makes the ncclUniqueId and bootstrap broadcasts it. Collective.
// Buffers are device memory; the collectives are queued on the given cudaStream_t.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device,
                                                     const CommOptions& options = {});

}  // namespace moekit
