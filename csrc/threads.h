// A persistent pool of worker threads for the kernels. One parallel region
// runs at a time; the calling thread works too. Each thread takes the tasks
// of its own contiguous share in order, one at a time, then helps with the
// others' shares, so a slow thread holds up at most the task it has.
//
// Never spin against a busy core: workers wait for the next region (decode
// issues hundreds of short regions per token) spinning about 50 us, then
// yielding the core to whatever else is runnable until 1 ms, then asleep on
// a condition variable; the caller, once it has no task left, waits for the
// workers the same way. A region whose caller keeps
// waiting far longer than it worked (a worker's core is taken by another
// process, so the worker is descheduled in the middle of a task) turns the
// pool to the caller alone for a while (20 ms, doubling each time it happens
// again, up to 2 s), then it tries the workers again;
// a region too small to be worth waking a thread runs on the caller.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

namespace gd {

// Run fn(task) for every task in [0, n_tasks), spread over the pool's
// threads; returns when all are done. Exceptions from fn are rethrown here.
// work_bytes: about how many bytes the region reads (its weights, times
// the tokens); under kMinParallelBytes the caller runs it alone.
void parallel_for(size_t n_tasks, const std::function<void(size_t)>& fn, size_t work_bytes = SIZE_MAX);
constexpr size_t kMinParallelBytes = size_t(256) << 10;

// Threads used by parallel_for (the caller included); 0 means one per core.
void set_num_threads(int n);
int num_threads();

// Counters of the pool since the process started: regions run in parallel,
// regions run on the caller (too small, or the pool was turned to the
// caller), times contention turned it so.
struct PoolStats {
  unsigned long long parallel = 0, inline_small = 0, inline_contended = 0, contended_events = 0;
};
PoolStats pool_stats();

}  // namespace gd
