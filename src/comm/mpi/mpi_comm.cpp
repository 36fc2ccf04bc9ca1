// The MPI communicator: host buffers, nonblocking collectives polled against a deadline,
// so a dead or stalled peer turns into an Error instead of a hang.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "moekit/comm.h"

namespace moekit {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, std::size_t(length));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommOptions& options) : timeout_(options.timeout) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    require(initialized != 0, "mpi communicator: MPI is not initialized (start an MpiSession first)");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken communicator may still have a collective pending: leave it alone.
    if (!finalized && broken_.empty()) MPI_Comm_free(&comm_);
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_to_all_v(const AllToAllV& a, Stream) override {
    usable("all_to_all_v");
    require(a.send_counts.size() == std::size_t(size_) && a.send_offsets.size() == std::size_t(size_) &&
                a.recv_counts.size() == std::size_t(size_) && a.recv_offsets.size() == std::size_t(size_),
            "all_to_all_v: expected " + std::to_string(size_) + " counts and offsets each way");
    require(a.unit_bytes > 0 && a.unit_bytes <= std::size_t(INT_MAX), "all_to_all_v: unit_bytes out of range");
    // Point to point, one message per peer with a nonzero count, and a copy for this rank's
    // own block. (Open MPI 4.1's MPI_Ialltoallv lost messages here when ranks entered it
    // far apart in time; blocking MPI_Alltoallv did not, but cannot time out.)
    const std::vector<int> sc = ints(a.send_counts, "send_counts"), rc = ints(a.recv_counts, "recv_counts");
    (void)ints(a.send_offsets, "send_offsets");  // range checks
    (void)ints(a.recv_offsets, "recv_offsets");
    MPI_Datatype unit;
    check(MPI_Type_contiguous(int(a.unit_bytes), MPI_BYTE, &unit), "MPI_Type_contiguous");
    MPI_Type_commit(&unit);
    struct TypeGuard {
      MPI_Datatype& type;
      ~TypeGuard() { MPI_Type_free(&type); }
    } guard{unit};
    // MPI reads and writes staging memory, never the caller's: a collective that timed out
    // stays pending (MPI cannot cancel it) and may still land after the caller freed its
    // buffers; the staging memory of a broken communicator is never freed.
    const std::size_t send_bytes = extent(a.send_counts, a.send_offsets) * a.unit_bytes;
    const std::size_t recv_bytes = extent(a.recv_counts, a.recv_offsets) * a.unit_bytes;
    std::byte* send = staging(send_bytes + recv_bytes);
    std::byte* recv = send + send_bytes;
    if (send_bytes) std::memcpy(send, a.send, send_bytes);
    std::vector<MPI_Request> requests;
    for (int r = 0; r < size_; ++r) {
      const std::size_t rs = std::size_t(r);
      if (r == rank_ || rc[rs] == 0) continue;
      requests.emplace_back();
      check(MPI_Irecv(recv + std::size_t(a.recv_offsets[rs]) * a.unit_bytes, rc[rs], unit, r, kTag, comm_,
                      &requests.back()),
            "MPI_Irecv");
    }
    for (int i = 1; i <= size_; ++i) {  // rank + 1 first, so that peers do not all send to rank 0 first
      const int r = (rank_ + i) % size_;
      const std::size_t rs = std::size_t(r);
      if (r == rank_ || sc[rs] == 0) continue;
      requests.emplace_back();
      check(MPI_Isend(send + std::size_t(a.send_offsets[rs]) * a.unit_bytes, sc[rs], unit, r, kTag, comm_,
                      &requests.back()),
            "MPI_Isend");
    }
    const std::size_t me = std::size_t(rank_);
    require(sc[me] == rc[me], "all_to_all_v: this rank sends itself " + std::to_string(sc[me]) + " units but expects " +
                                  std::to_string(rc[me]));
    wait_all(requests, "all_to_all_v");
    auto* out = static_cast<std::byte*>(a.recv);
    for (int r = 0; r < size_; ++r) {
      const std::size_t rs = std::size_t(r), bytes = std::size_t(rc[rs]) * a.unit_bytes;
      const std::size_t at = std::size_t(a.recv_offsets[rs]) * a.unit_bytes;
      if (bytes == 0) continue;
      if (r == rank_) std::memcpy(out + at, send + std::size_t(a.send_offsets[rs]) * a.unit_bytes, bytes);
      else std::memcpy(out + at, recv + at, bytes);
    }
  }

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream) override {
    usable("all_gather");
    require(bytes <= std::size_t(INT_MAX), "all_gather: too many bytes");
    std::byte* mine = staging(bytes * std::size_t(size_ + 1));
    std::byte* all = mine + bytes;
    if (bytes) std::memcpy(mine, send, bytes);
    MPI_Request request;
    check(MPI_Iallgather(mine, int(bytes), MPI_BYTE, all, int(bytes), MPI_BYTE, comm_, &request), "MPI_Iallgather");
    wait(request, "all_gather");
    if (bytes) std::memcpy(recv, all, bytes * std::size_t(size_));
  }

  void all_reduce_max(float* values, std::int64_t count, Stream) override {
    usable("all_reduce_max");
    require(count >= 0 && count <= INT_MAX, "all_reduce_max: count out of range");
    const std::size_t bytes = sizeof(float) * std::size_t(count);
    auto* staged = reinterpret_cast<float*>(staging(bytes));
    if (bytes) std::memcpy(staged, values, bytes);
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, staged, int(count), MPI_FLOAT, MPI_MAX, comm_, &request), "MPI_Iallreduce");
    wait(request, "all_reduce_max");
    if (bytes) std::memcpy(values, staged, bytes);
  }

  void broadcast(void* data, std::size_t bytes, int root, Stream) override {
    usable("broadcast");
    require(root >= 0 && root < size_, "broadcast: root out of range");
    require(bytes <= std::size_t(INT_MAX), "broadcast: too many bytes");
    std::byte* staged = staging(bytes);
    if (bytes) std::memcpy(staged, data, bytes);
    MPI_Request request;
    check(MPI_Ibcast(staged, int(bytes), MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    wait(request, "broadcast");
    if (bytes) std::memcpy(data, staged, bytes);
  }

  void barrier(Stream) override {
    usable("barrier");
    MPI_Request request;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    wait(request, "barrier");
  }

  void synchronize(Stream) override { usable("synchronize"); }

 private:
  std::string where() const { return "mpi rank " + std::to_string(rank_) + "/" + std::to_string(size_); }

  void usable(const char* what) const {
    require(broken_.empty(), std::string(what) + " (" + where() + "): communicator unusable after: " + broken_);
  }

  void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    broken_ = std::string(call) + ": " + mpi_error_text(code);
    quarantine();  // operations posted before this one may still be pending
    throw Error(where() + ": " + broken_);
  }

  // Bytes (in units) up to the end of the last nonempty block.
  static std::size_t extent(std::span<const std::int64_t> counts, std::span<const std::int64_t> offsets) {
    std::size_t end = 0;
    for (std::size_t i = 0; i < counts.size(); ++i)
      if (counts[i] > 0) end = std::max(end, std::size_t(offsets[i] + counts[i]));
    return end;
  }

  // At least `bytes` of the communicator's staging memory (grown, never shrunk).
  std::byte* staging(std::size_t bytes) {
    if (bytes > staging_bytes_) {
      staging_.reset(new std::byte[bytes]);
      staging_bytes_ = bytes;
    }
    return staging_.get();
  }

  // A collective timed out and may still write into the staging memory: it stays allocated
  // (and reachable, so leak checkers see no leak) until the process ends.
  void quarantine() {
    static auto* kept = new std::vector<std::unique_ptr<std::byte[]>>();
    if (staging_) kept->push_back(std::move(staging_));
    staging_bytes_ = 0;
  }

  std::vector<int> ints(std::span<const std::int64_t> v, const char* name) const {
    std::vector<int> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      require(v[i] >= 0 && v[i] <= INT_MAX, std::string("all_to_all_v: ") + name + "[" + std::to_string(i) +
                                                "] expected in [0, INT_MAX], given " + std::to_string(v[i]));
      out[i] = int(v[i]);
    }
    return out;
  }

  void wait_all(std::vector<MPI_Request>& requests, const char* what) {
    try {
      comm::wait_until(
          [&] {
            int done = 0;
            check(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
            return done != 0;
          },
          timeout_, std::string(what) + " (" + where() + ")");
    } catch (const Error& e) {
      if (broken_.empty()) broken_ = e.what();
      quarantine();
      throw;
    }
  }

  void wait(MPI_Request& request, const char* what) {
    try {
      comm::wait_until(
          [&] {
            int done = 0;
            check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
            return done != 0;
          },
          timeout_, std::string(what) + " (" + where() + ")");
    } catch (const Error& e) {
      if (broken_.empty()) broken_ = e.what();
      quarantine();
      throw;
    }
  }

  static constexpr int kTag = 0x6d6b;  // the only point-to-point traffic on this communicator
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds timeout_;
  std::string broken_;  // why the communicator can no longer be used; empty while it can
  std::unique_ptr<std::byte[]> staging_;
  std::size_t staging_bytes_ = 0;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  return std::make_unique<MpiCommunicator>(options);
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  require(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS, "MPI_Init_thread failed");
  owns_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

int MpiSession::world_rank() const {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiSession::world_size() const {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

int MpiSession::local_rank() const {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

void MpiSession::abort(int code) const {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace moekit
