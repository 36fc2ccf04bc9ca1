// A small fixed thread pool for the CPU backend. Work is split into contiguous chunks;
// each index is handled by exactly one thread, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace moekit::core {

inline constexpr int kMaxThreads = 1024;

// Threads used: MOEKIT_NUM_THREADS if set, else std::thread::hardware_concurrency() (at most
// kMaxThreads). Error naming MOEKIT_NUM_THREADS when it is set to anything but an integer in
// [1, kMaxThreads] (empty included).
int num_threads();

// Calls body(begin, end) over [0, n) in chunks of at least `grain` indices, in parallel,
// and returns when all are done. The first exception thrown by a chunk is rethrown.
// A call from inside a body runs inline on the calling thread.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t begin, std::int64_t end)>& body);

}  // namespace moekit::core
