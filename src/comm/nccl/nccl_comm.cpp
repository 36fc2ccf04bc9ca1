// The NCCL communicator: GPU buffers, collectives queued on a CUDA stream. The
// communicator is nonblocking (ncclConfig_t::blocking = 0), so every wait, the queueing
// of a collective and synchronize() alike, polls against the timeout; on expiry the
// communicator is aborted (ncclCommAbort) and the call throws.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "comm/deadline.h"
#include "moekit/comm.h"

namespace moekit {
namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, int device, const CommOptions& options)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), device_(device), timeout_(options.timeout) {
    require(bootstrap.device() == Device::cpu,
            "nccl communicator: the bootstrap communicator must move host memory (mpi or self), given " +
                std::string(bootstrap.name()));
    cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(&id, sizeof id, 0, nullptr);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      nccl(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), "ncclCommInitRankConfig");
      settle("ncclCommInitRankConfig");
      cuda(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(float)), "cudaMalloc");
    } catch (...) {  // no destructor runs for a constructor that throws
      abort_now();
      throw;
    }
  }
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (scratch_) cudaFree(scratch_);
  }

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_to_all_v(const AllToAllV& a, Stream stream) override {
    usable("all_to_all_v");
    require(a.send_counts.size() == std::size_t(size_) && a.send_offsets.size() == std::size_t(size_) &&
                a.recv_counts.size() == std::size_t(size_) && a.recv_offsets.size() == std::size_t(size_),
            "all_to_all_v: expected " + std::to_string(size_) + " counts and offsets each way");
    const auto* send = static_cast<const std::byte*>(a.send);
    auto* recv = static_cast<std::byte*>(a.recv);
    nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      const std::size_t rs = std::size_t(r);
      if (a.send_counts[rs] > 0)
        nccl(ncclSend(send + std::size_t(a.send_offsets[rs]) * a.unit_bytes, std::size_t(a.send_counts[rs]) * a.unit_bytes,
                      ncclUint8, r, comm_, cuda_stream(stream)),
             "ncclSend");
      if (a.recv_counts[rs] > 0)
        nccl(ncclRecv(recv + std::size_t(a.recv_offsets[rs]) * a.unit_bytes, std::size_t(a.recv_counts[rs]) * a.unit_bytes,
                      ncclUint8, r, comm_, cuda_stream(stream)),
             "ncclRecv");
    }
    queued(ncclGroupEnd(), "all_to_all_v");
  }

  void all_gather(const void* send, void* recv, std::size_t bytes, Stream stream) override {
    usable("all_gather");
    queued(ncclAllGather(send, recv, bytes, ncclUint8, comm_, cuda_stream(stream)), "all_gather");
  }

  void all_reduce_max(float* values, std::int64_t count, Stream stream) override {
    usable("all_reduce_max");
    queued(ncclAllReduce(values, values, std::size_t(count), ncclFloat32, ncclMax, comm_, cuda_stream(stream)),
           "all_reduce_max");
  }

  void broadcast(void* data, std::size_t bytes, int root, Stream stream) override {
    usable("broadcast");
    require(root >= 0 && root < size_, "broadcast: root out of range");
    queued(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, cuda_stream(stream)), "broadcast");
  }

  void barrier(Stream stream) override {
    all_reduce_max(scratch_, 1, stream);
    synchronize(stream);
  }

  void synchronize(Stream stream) override {
    usable("synchronize");
    wait("synchronize", [&] {
      const cudaError_t status = cudaStreamQuery(cuda_stream(stream));
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) cuda(status, "cudaStreamQuery");
      async_error("synchronize");
      return false;
    });
  }

 private:
  static cudaStream_t cuda_stream(Stream s) { return static_cast<cudaStream_t>(s); }

  std::string where() const { return "nccl rank " + std::to_string(rank_) + "/" + std::to_string(size_); }

  void usable(const char* what) const {
    require(broken_.empty(), std::string(what) + " (" + where() + "): communicator unusable after: " + broken_);
  }

  void fail(const std::string& message) {
    if (broken_.empty()) broken_ = message;
    abort_now();
    throw Error(where() + ": " + message);
  }

  // Stops what is queued (the caller may free its buffers next); the communicator is done.
  void abort_now() {
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void cuda(cudaError_t status, const char* call) {
    if (status != cudaSuccess) fail(std::string(call) + ": " + cudaGetErrorString(status));
  }

  void nccl(ncclResult_t result, const char* call) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    fail(std::string(call) + ": " + ncclGetErrorString(result) + (comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : ""));
  }

  // True when nothing is in progress; throws on an asynchronous error.
  bool async_error(const char* what) {
    ncclResult_t state = ncclSuccess;
    nccl(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) fail(std::string(what) + ": " + ncclGetErrorString(state));
    return true;
  }

  template <class Done>
  void wait(const char* what, Done&& done) {
    try {
      comm::wait_until(done, timeout_, std::string(what) + " (" + where() + ")");
    } catch (const Error& e) {
      if (broken_.empty()) broken_ = e.what();
      abort_now();
      throw;
    }
  }

  // Waits until a nonblocking call has finished queueing (or initializing).
  void settle(const char* what) {
    wait(what, [&] { return async_error(what); });
  }

  void queued(ncclResult_t result, const char* what) {
    nccl(result, what);
    if (result == ncclInProgress) settle(what);
  }

  int rank_ = 0, size_ = 1, device_ = 0;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  float* scratch_ = nullptr;  // [1] for barrier
  std::string broken_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int cuda_device,
                                                     const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(bootstrap, cuda_device, options);
}

}  // namespace moekit
