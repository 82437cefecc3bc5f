// A persistent pool of worker threads for the kernels. One parallel region
// runs at a time; the calling thread works too. Workers spin briefly before
// sleeping, because decode issues hundreds of short regions per token.
#pragma once
#include <cstddef>
#include <functional>

namespace gd {

// Run fn(task) for every task in [0, n_tasks), spread over the pool's
// threads; returns when all are done. Exceptions from fn are rethrown here.
void parallel_for(size_t n_tasks, const std::function<void(size_t)>& fn);

// Threads used by parallel_for (the caller included); 0 means one per core.
void set_num_threads(int n);
int num_threads();

}  // namespace gd
