#include "threads.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() {}
#endif

namespace gd {
namespace {

using Clock = std::chrono::steady_clock;
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// A worker waits for the next region spinning kSpinNs, then yielding its
// core to any other runnable thread until kYieldNs, then asleep; the caller
// waits for the workers the same way. Yielding costs nothing on an idle
// core and gives a busy one back to its owner at once.
constexpr int64_t kSpinNs = 50'000, kYieldNs = 1'000'000;
// A region is a straggler when the caller, its own tasks done, waited more
// than this and more than it worked: a worker was descheduled mid-task.
constexpr int64_t kStragglerNs = 200'000;
constexpr int kStrikes = 3;                 // stragglers in a row that turn the pool to the caller
// Then the caller runs alone for kSoloFirstNs, and probes with the workers
// again; each new contention doubles the spell, up to kSoloMaxNs.
constexpr int64_t kSoloFirstNs = 20'000'000, kSoloMaxNs = 2'000'000'000;

class Pool {
 public:
  ~Pool() { stop_workers(); }

  void resize(int n) {
    std::lock_guard<std::mutex> region(region_mutex_);
    if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
    if (n == n_threads_) return;
    stop_workers();
    n_threads_ = n;
    quit_ = false;
    solo_until_ = 0;
    solo_ns_ = kSoloFirstNs;
    strikes_ = 0;
    // Workers start from the current generation: one that starts late must
    // still take part in the first region after its creation.
    const unsigned start = generation_.load();
    ranges_.reset(new Range[n]);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, start, i] { worker_loop(start, i); });
  }

  int size() const { return n_threads_; }

  PoolStats stats() {
    std::lock_guard<std::mutex> region(region_mutex_);
    return stats_;
  }

  void run(size_t n_tasks, const std::function<void(size_t)>& fn, size_t work_bytes) {
    if (n_tasks == 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
      for (size_t t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    std::lock_guard<std::mutex> region(region_mutex_);
    const bool small = work_bytes < kMinParallelBytes;
    if (small || (solo_until_ != 0 && now_ns() < solo_until_)) {
      ++(small ? stats_.inline_small : stats_.inline_contended);
      for (size_t t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    ++stats_.parallel;
    fn_ = &fn;
    for (int i = 0; i < n_threads_; ++i) {
      ranges_[i].next.store(n_tasks * i / n_threads_, std::memory_order_relaxed);
      ranges_[i].end = n_tasks * (i + 1) / n_threads_;
    }
    active_.store(int(workers_.size()));
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lk(m_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    const int64_t t0 = now_ns();
    work(0);
    const int64_t t_own = now_ns();
    wait_workers(t_own);
    observe(t_own - t0, now_ns() - t_own);
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Thread `self` takes the tasks of its own range in order, then helps with
  // the others' (from their next task on).
  void work(int self) {
    for (int k = 0; k < n_threads_; ++k) {
      Range& r = ranges_[(self + k) % n_threads_];
      for (;;) {
        const size_t t = r.next.fetch_add(1);
        if (t >= r.end) break;
        try {
          (*fn_)(t);
        } catch (...) {
          std::lock_guard<std::mutex> lk(m_);
          if (!error_) error_ = std::current_exception();
          for (int i = 0; i < n_threads_; ++i) ranges_[i].next.store(ranges_[i].end);
        }
      }
    }
  }

  // Spin, then yield, until ready() or kYieldNs have passed; true if ready.
  template <class Ready>
  static bool spin_then_yield(int64_t from, Ready ready) {
    for (int i = 0; !ready(); ++i) {
      if ((i & 63) != 63) {
        cpu_relax();
        continue;
      }
      const int64_t waited = now_ns() - from;
      if (waited > kYieldNs) return false;
      if (waited > kSpinNs) std::this_thread::yield();
    }
    return true;
  }

  void wait_workers(int64_t from) {
    auto done = [&] { return active_.load(std::memory_order_acquire) == 0; };
    if (spin_then_yield(from, done)) return;
    std::unique_lock<std::mutex> lk(m_);
    caller_waiting_ = true;
    done_cv_.wait(lk, done);
    caller_waiting_ = false;
  }

  // Called with region_mutex_ held, after each parallel region.
  void observe(int64_t own_ns, int64_t wait_ns) {
    if (wait_ns > kStragglerNs && wait_ns > own_ns) {
      if (++strikes_ >= kStrikes) {
        ++stats_.contended_events;
        strikes_ = 0;
        solo_until_ = now_ns() + solo_ns_;
        solo_ns_ = std::min(kSoloMaxNs, solo_ns_ * 2);
      }
    } else {
      strikes_ = 0;
      if (++clean_ >= 1024) {   // a long quiet stretch: back to short solo spells
        clean_ = 0;
        solo_ns_ = kSoloFirstNs;
      }
      return;
    }
    clean_ = 0;
  }

  void worker_loop(unsigned seen, int self) {
    for (;;) {
      // Spin a little for the next region, then yield, then sleep.
      auto next = [&] { return generation_.load(std::memory_order_acquire) != seen || quit_; };
      if (!spin_then_yield(now_ns(), next)) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return generation_.load() != seen || quit_; });
      }
      if (quit_) return;
      seen = generation_.load();
      work(self);
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m_);   // the caller may be asleep: wake it
        if (caller_waiting_) done_cv_.notify_one();
      }
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(m_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::mutex region_mutex_, m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  std::atomic<unsigned> generation_{0};
  // A region's tasks in one contiguous range per thread: decode's tasks are
  // runs of weight rows, and a thread that walks its own run streams one
  // sequence of addresses (its prefetches and the hardware's stay ahead of
  // it), where a shared counter dealt the threads alternate runs: MXFP4 at
  // one token from memory 1.13-1.31x, Q8_0 1.04-1.23x on 2 threads (AMD EPYC
  // Zen 2).
  struct alignas(64) Range {
    std::atomic<size_t> next{0};
    size_t end = 0;
  };
  std::unique_ptr<Range[]> ranges_;
  std::atomic<int> active_{0};
  const std::function<void(size_t)>* fn_ = nullptr;
  std::exception_ptr error_;
  std::atomic<bool> quit_{false};
  bool caller_waiting_ = false;   // guarded by m_
  int n_threads_ = 0;
  // contention (guarded by region_mutex_)
  int64_t solo_until_ = 0, solo_ns_ = kSoloFirstNs;
  unsigned clean_ = 0;
  int strikes_ = 0;
  PoolStats stats_;
};

Pool& pool() {
  static Pool* p = [] {
    auto* q = new Pool();  // never destroyed: workers may outlive static teardown
    q->resize(0);
    return q;
  }();
  return *p;
}

}  // namespace

void parallel_for(size_t n_tasks, const std::function<void(size_t)>& fn, size_t work_bytes) {
  pool().run(n_tasks, fn, work_bytes);
}
void set_num_threads(int n) { pool().resize(n); }
int num_threads() { return pool().size(); }
PoolStats pool_stats() { return pool().stats(); }

}  // namespace gd
