// feedline/detail/spin_then_lock.hpp: takes a mutex that is held for a few microseconds at a time
// (the pipeline's planner) by trying it for a bounded while before sleeping on it. A worker that finds
// the planner busy used to sleep in the kernel (futex) and be woken by the one finishing: with two
// workers planning a mixture of 10,000 domains, the sleeps and wake-ups were 17% of all CPU time
// (perf, bench_mixture), longer than the wait itself. glibc's adaptive mutexes do the same, but
// std::mutex cannot be made one.
#pragma once

#include <chrono>
#include <mutex>

#include <feedline/detail/futex.hpp>  // cpu_relax

namespace feedline::detail {

// Locks `m`: tries it for up to `spin` (checking the clock every 32 tries), then waits for it as
// lock() does. Returns with `m` held.
inline void spin_then_lock(std::mutex& m, std::chrono::nanoseconds spin) {
    if (m.try_lock()) return;
    const auto until = std::chrono::steady_clock::now() + spin;
    for (;;) {
        for (int i = 0; i < 32; ++i) {
            cpu_relax();
            if (m.try_lock()) return;
        }
        if (std::chrono::steady_clock::now() >= until) break;
    }
    m.lock();
}

}  // namespace feedline::detail
