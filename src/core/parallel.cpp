#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "moekit/error.h"

namespace moekit::core {
namespace {

thread_local bool t_inside_job = false;

// Workers sleep until a job is posted; the caller works on the job too. Each job's state is its
// own (on the caller's stack): a worker takes the job under the mutex and works on that job
// alone, and run() returns once every chunk is done and no worker holds the job any more.
// (Issue #19: one state shared by every job let a worker that was late leaving job G read job
// G + 1's chunk count before its counter was reset, run a chunk twice and push the done count
// past the total, which run() then waited for forever: the differential campaign's rare hangs.)
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void run(std::int64_t chunks, const std::function<void(std::int64_t)>& chunk) {
    std::unique_lock<std::mutex> serial(run_mutex_);  // one job at a time
    Job job(chunk, chunks);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      ++generation_;
    }
    wake_.notify_all();
    work(job);
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = nullptr;  // no worker takes it from here on
    finished_.wait(lock, [&] { return job.done == job.total && job.holders == 0; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    Job(const std::function<void(std::int64_t)>& b, std::int64_t n) : body(b), total(n) {}
    const std::function<void(std::int64_t)>& body;
    const std::int64_t total;
    std::atomic<std::int64_t> next{0};
    std::int64_t done = 0;  // chunks finished (mutex_)
    int holders = 0;        // workers inside work() on this job (mutex_)
    std::exception_ptr error;
  };

  void worker_loop() {
    std::uint64_t seen = 0;
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && job_ != nullptr); });
        if (stopping_) return;
        seen = generation_;
        job = job_;
        ++job->holders;
      }
      work(*job);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--job->holders == 0) finished_.notify_all();
    }
  }

  void work(Job& job) {
    for (;;) {
      const std::int64_t i = job.next.fetch_add(1);
      if (i >= job.total) return;
      try {
        t_inside_job = true;
        job.body(i);
        t_inside_job = false;
      } catch (...) {
        t_inside_job = false;
        std::lock_guard<std::mutex> lock(mutex_);
        if (!job.error) job.error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (++job.done == job.total) finished_.notify_all();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  std::vector<std::thread> workers_;
  Job* job_ = nullptr;  // the job being posted (mutex_)
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
};

Pool& pool() {
  static Pool instance(num_threads());
  return instance;
}

}  // namespace

int num_threads() {
  const char* env = std::getenv("MOEKIT_NUM_THREADS");
  if (!env) return int(std::clamp(std::thread::hardware_concurrency(), 1u, unsigned(kMaxThreads)));
  const std::string_view text(env);
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  // A typo must not silently mean "all cores", nor a huge count abort in thread creation.
  require(!text.empty() && ec == std::errc() && end == text.data() + text.size() && n >= 1 && n <= kMaxThreads,
          "MOEKIT_NUM_THREADS: expected an integer in [1, " + std::to_string(kMaxThreads) + "], given '" +
              std::string(text) + "'");
  return n;
}

void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t max_chunks = std::int64_t(num_threads()) * 4;
  const std::int64_t chunks = std::clamp<std::int64_t>((n + grain - 1) / grain, 1, max_chunks);
  if (chunks == 1 || t_inside_job) {  // nested calls run inline
    body(0, n);
    return;
  }
  const std::int64_t per = (n + chunks - 1) / chunks;
  pool().run(chunks, [&](std::int64_t c) {
    const std::int64_t begin = c * per;
    const std::int64_t end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
  });
}

}  // namespace moekit::core
