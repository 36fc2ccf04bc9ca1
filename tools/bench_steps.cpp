#include "bench_steps.h"

#include "moekit/error.h"

#ifdef MOEKIT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit::cli {

StepTimes::~StepTimes() {
#ifdef MOEKIT_HAVE_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void StepTimes::begin(StepClock clock) {
  names_.clear();
  host_times_.clear();
  active_ = true;
  host_clock_ = clock == StepClock::host || device_ == Device::cpu;
}

void StepTimes::step(std::string_view name, Stream stream) {
  if (!active_) return;
  names_.emplace_back(name);
  if (host_clock_) {
    host_times_.push_back(std::chrono::steady_clock::now());
    return;
  }
#ifdef MOEKIT_HAVE_CUDA
  if (events_.size() < names_.size()) {
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) throw Error("cudaEventCreate failed");
    events_.push_back(e);
  }
  const auto e = static_cast<cudaEvent_t>(events_[names_.size() - 1]);
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) throw Error("step timing: cudaStreamIsCapturing failed");
  // In a capture, an event node of the graph (without the flag the record would only order the capture).
  if (capture == cudaStreamCaptureStatusActive) {
    if (cudaEventRecordWithFlags(e, s, cudaEventRecordExternal) != cudaSuccess)
      throw Error("step timing: cudaEventRecordWithFlags failed");
  } else {
    cudaEventRecord(e, s);
  }
#else
  (void)stream;
#endif
}

std::vector<std::pair<std::string, double>> StepTimes::elapsed() const {
  std::vector<std::pair<std::string, double>> steps;
  for (std::size_t i = 0; i + 1 < names_.size(); ++i) {
    double us = 0;
    if (host_clock_) {
      us = std::chrono::duration<double, std::micro>(host_times_[i + 1] - host_times_[i]).count();
    } else {
#ifdef MOEKIT_HAVE_CUDA
      float ms = 0;
      if (cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i + 1])) != cudaSuccess ||
          cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[i]), static_cast<cudaEvent_t>(events_[i + 1])) !=
              cudaSuccess)
        throw Error("step timing: a CUDA event failed");
      us = double(ms) * 1e3;
#endif
    }
    steps.emplace_back(names_[i], us);
  }
  return steps;
}

}  // namespace moekit::cli
