// The per-step breakdown of `moekit bench --stages`: a StepObserver that timestamps each step
// of a forward (CUDA events on the GPU, the host clock on the CPU) while it is active. With the host
// clock on the GPU too it shows where the host time of an eager call goes (bench's host profile).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/layer.h"

namespace moekit::cli {

// device: what each step takes on the device (the host clock on the CPU); host: what enqueueing it
// takes on the host.
enum class StepClock : std::uint8_t { device, host };

class StepTimes final : public StepObserver {
 public:
  explicit StepTimes(Device device) : device_(device) {}
  ~StepTimes() override;
  StepTimes(const StepTimes&) = delete;
  StepTimes& operator=(const StepTimes&) = delete;

  // Marks are kept from begin() until finish() or hold(); inactive otherwise. A forward captured in
  // a CUDA graph meanwhile records each mark as an event node: every replay of the graph records the
  // same events again.
  void begin(StepClock clock = StepClock::device);
  void step(std::string_view name, Stream stream) override;
  // Stops marking and keeps the marks (a graph captured since begin(), read after each replay).
  void hold() { active_ = false; }
  // After the device finished the forward (or a replay): each step's µs, in the order they ran
  // ("end" closes the last one).
  std::vector<std::pair<std::string, double>> elapsed() const;
  // elapsed() of an eager forward; deactivates.
  std::vector<std::pair<std::string, double>> finish() {
    hold();
    return elapsed();
  }

 private:
  Device device_;
  bool active_ = false;
  bool host_clock_ = false;
  std::vector<std::string> names_;
  std::vector<void*> events_;  // cudaEvent_t, reused from call to call
  std::vector<std::chrono::steady_clock::time_point> host_times_;
};

}  // namespace moekit::cli
