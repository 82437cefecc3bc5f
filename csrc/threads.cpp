#include "threads.h"

#include <atomic>
#include <condition_variable>
#include <exception>
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
    // Workers start from the current generation: one that starts late must
    // still take part in the first region after its creation.
    const unsigned start = generation_.load();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, start] { worker_loop(start); });
  }

  int size() const { return n_threads_; }

  void run(size_t n_tasks, const std::function<void(size_t)>& fn) {
    if (n_tasks == 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
      for (size_t t = 0; t < n_tasks; ++t) fn(t);
      return;
    }
    std::lock_guard<std::mutex> region(region_mutex_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0);
    active_.store(int(workers_.size()));
    error_ = nullptr;
    {
      std::lock_guard<std::mutex> lk(m_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    while (active_.load(std::memory_order_acquire) != 0) cpu_relax();
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      const size_t t = next_.fetch_add(1);
      if (t >= n_tasks_) break;
      try {
        (*fn_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_tasks_);
      }
    }
  }

  void worker_loop(unsigned seen) {
    for (;;) {
      // Spin a little for the next region, then sleep.
      for (int i = 0; i < 20000 && generation_.load(std::memory_order_acquire) == seen && !quit_; ++i)
        cpu_relax();
      if (generation_.load(std::memory_order_acquire) == seen && !quit_) {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return generation_.load() != seen || quit_; });
      }
      if (quit_) return;
      seen = generation_.load();
      work();
      active_.fetch_sub(1, std::memory_order_acq_rel);
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
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  std::atomic<unsigned> generation_{0};
  std::atomic<size_t> next_{0};
  std::atomic<int> active_{0};
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_tasks_ = 0;
  std::exception_ptr error_;
  std::atomic<bool> quit_{false};
  int n_threads_ = 0;
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

void parallel_for(size_t n_tasks, const std::function<void(size_t)>& fn) { pool().run(n_tasks, fn); }
void set_num_threads(int n) { pool().resize(n); }
int num_threads() { return pool().size(); }

}  // namespace gd
