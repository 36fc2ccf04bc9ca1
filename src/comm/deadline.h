// Polling a nonblocking operation against a deadline, without burning a core that the
// peers (often oversubscribed CPU ranks) need: spin briefly, then sleep in growing steps.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "moekit/error.h"

namespace moekit::comm {

class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout)
      : timeout_(timeout), end_(std::chrono::steady_clock::now() + timeout) {}
  bool passed() const { return std::chrono::steady_clock::now() > end_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Called between polls.
  void pause() {
    if (++polls_ < 64) return;
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point end_;
  int polls_ = 0;
  std::chrono::microseconds sleep_{10};
};

// Polls done() until it returns true; throws Error naming `what` once the deadline passes.
template <class Done>
void wait_until(Done&& done, std::chrono::milliseconds timeout, const std::string& what) {
  Deadline deadline(timeout);
  while (!done()) {
    if (deadline.passed())
      throw Error(what + ": timed out after " + std::to_string(timeout.count()) +
                  " ms waiting for the other ranks (a peer died, stalls, or called a different collective)");
    deadline.pause();
  }
}

}  // namespace moekit::comm
