// feedline/detail/spin_lock.hpp: a one-byte lock for objects there are thousands of, rarely wanted by
// two threads at once and mostly held for well under a microsecond: a mixture's per-domain sample
// streams, which pipeline workers plan outside the shared planner's lock (sampler::plan_drawn; a
// stream also lays out a new epoch under it, O(documents), once per epoch), each domain's files
// (storage/file.hpp: a lease, or a descriptor opened again) and its dataset's document index
// (format/dataset.hpp: built once, O(tokens)). A std::mutex is 40 bytes, and 10,000 of them would be
// a fifth of the memory a domain may cost. Waiting out a long hold costs a sleeping thread, not a
// spinning core (below).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include <feedline/detail/futex.hpp>  // cpu_relax

namespace feedline::detail {

// Lockable (std::lock_guard works). Test-and-test-and-set. After a few hundred tries it yields the
// CPU, since the holder may have been preempted (workers and the trainer share few cores); after a
// few hundred yields it sleeps between tries (50 us), since then the holder is laying out an epoch
// and a core with nothing else to run would return from every yield at once. Moving or copying makes
// a new, unlocked lock: only objects not yet shared between threads are moved.
class spin_lock {
public:
    spin_lock() noexcept = default;
    spin_lock(const spin_lock&) noexcept {}
    spin_lock& operator=(const spin_lock&) noexcept { return *this; }

    bool try_lock() noexcept { return !held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire); }
    void lock() noexcept {
        for (unsigned tries = 0; !try_lock(); ++tries) {
            if (tries < 256)
                cpu_relax();
            else if (tries < 512)
                std::this_thread::yield();
            else
                std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    void unlock() noexcept { held_.store(false, std::memory_order_release); }

private:
    std::atomic<bool> held_{false};
};

}  // namespace feedline::detail
