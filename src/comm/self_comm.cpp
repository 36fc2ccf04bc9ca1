// The communicator of one process alone: every collective is a host copy.
#include <cstring>

#include "moekit/comm.h"

namespace moekit {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(const CommOptions& options) : timeout_(options.timeout) {}
  std::string_view name() const override { return "self"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return Device::cpu; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void all_to_all_v(const AllToAllV& a, Stream) override {
    require(a.send_counts.size() == 1 && a.send_offsets.size() == 1 && a.recv_counts.size() == 1 &&
                a.recv_offsets.size() == 1,
            "all_to_all_v: expected 1 count and offset each way");
    require(a.send_counts[0] == a.recv_counts[0], "all_to_all_v: send_counts[0] " + std::to_string(a.send_counts[0]) +
                                                      " != recv_counts[0] " + std::to_string(a.recv_counts[0]));
    const std::size_t bytes = std::size_t(a.send_counts[0]) * a.unit_bytes;
    if (bytes == 0) return;
    std::memmove(static_cast<std::byte*>(a.recv) + std::size_t(a.recv_offsets[0]) * a.unit_bytes,
                 static_cast<const std::byte*>(a.send) + std::size_t(a.send_offsets[0]) * a.unit_bytes, bytes);
  }
  void all_gather(const void* send, void* recv, std::size_t bytes, Stream) override {
    if (bytes) std::memmove(recv, send, bytes);
  }
  void all_reduce_max(float*, std::int64_t, Stream) override {}
  void broadcast(void*, std::size_t, int root, Stream) override {
    require(root == 0, "broadcast: root out of range");
  }
  void barrier(Stream) override {}
  void synchronize(Stream) override {}

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(const CommOptions& options) {
  return std::make_unique<SelfCommunicator>(options);
}

}  // namespace moekit
