// Independent jobs on several threads: what `check` runs a release matrix with, and what
// `check --explain` runs its checks with.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace hpz {

/** Runs job(i) for every i < n on min(workers, n) threads (at least one); each job writes only
 *  its own result, so the results come in the jobs' order whatever order they finish in. While
 *  they run, the calling thread calls `waiting(done)` every 250 ms, when given (a progress bar).
 *  A job that threw is rethrown after all have finished: the first by index, as a serial loop
 *  would have met it. */
inline void parallel_for(std::size_t n, unsigned workers,
                         const std::function<void(std::size_t)>& job,
                         const std::function<void(std::size_t done)>& waiting = {}) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> done{0};
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> pool;
  const std::size_t threads = std::max<std::size_t>(1, std::min<std::size_t>(workers, n));
  for (std::size_t w = 0; w < threads; ++w) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) {
        try {
          job(i);
        } catch (...) {
          errors[i] = std::current_exception();
        }
        done.fetch_add(1);
      }
    });
  }
  if (waiting) {
    while (done.load() < n) {
      waiting(done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace hpz
