// feedline/detail/futex.hpp: sleeping on a 32-bit atomic until it changes, with an optional timeout.
// C++20's std::atomic::wait has no timeout, and the blocking queues need one (pop_for), so the queues
// use the Linux futex directly: the same mechanism std::atomic::wait uses underneath.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <thread>

namespace feedline::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free,
              "futex needs a plain 32-bit word");

// Sleeps while `word` holds `expected`, at most `timeout` (nullptr: forever). Returns on a wake-up, a
// change, a signal or the timeout; callers re-check their condition. Never throws.
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, const timespec* timeout = nullptr) noexcept {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, timeout, nullptr, 0);
}

// Wakes every thread sleeping on `word`. Never throws.
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

inline timespec to_timespec(std::chrono::nanoseconds d) noexcept {
    if (d.count() < 0) d = std::chrono::nanoseconds(0);
    return timespec{static_cast<time_t>(d.count() / 1'000'000'000), static_cast<long>(d.count() % 1'000'000'000)};
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// A condition that threads wait on: spin briefly, then yield, then sleep on a futex, so a busy
// pipeline hands off in nanoseconds and an idle one burns no CPU. Waiters re-check `ready()` after
// every wake-up; notifiers call notify() after making it true. Lost wake-ups are impossible (Dekker):
// a sleeper registers (seq_cst RMW on the sleeper count) before its last check of ready(); a notifier
// reads the count with a seq_cst RMW after making ready() true. The RMWs are totally ordered: either
// the notifier's comes later and sees the sleeper, and bumps the epoch the sleeper's futex waits on,
// or the sleeper's reads the notifier's (release, so ready()'s new state is visible to its check).
// An RMW rather than a fence + load: the same cost here (bench_queue shows no difference beyond its
// noise), and ThreadSanitizer models RMWs but not standalone fences, so it checks this hand-off too.
// When nobody sleeps, notify() costs that one RMW on a line written only by notifiers and sleepers.
class wait_point {
public:
    // Spin and yield counts: ~1-2 us of spinning covers a hand-off between two running threads;
    // yielding covers a producer that was just descheduled; past that, sleep.
    static constexpr int spin_iterations = 128;
    static constexpr int yield_iterations = 8;

    // Blocks until ready() is true or the deadline passes. Returns ready()'s last value.
    template <class Ready>
    bool wait(Ready&& ready, std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
        return spin(ready) || sleep(ready, deadline);
    }

    // The first phase of wait(): spins, then yields, without sleeping. Returns ready()'s last value.
    template <class Ready>
    bool spin(Ready&& ready) {
        for (int i = 0; i < spin_iterations; ++i) {
            if (ready()) return true;
            cpu_relax();
        }
        for (int i = 0; i < yield_iterations; ++i) {
            if (ready()) return true;
            std::this_thread::yield();
        }
        return ready();
    }

    // The second phase: sleeps until ready() or the deadline. A waiter that tells notifiers what it
    // waits for (so they can skip waking it: notify_if) writes that before calling sleep(); the
    // sleeper's registration below orders the write before its last check, as for ready()'s state.
    template <class Ready>
    bool sleep(Ready&& ready, std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
        for (;;) {
            std::uint32_t e = epoch_.load();
            sleepers_.fetch_add(1);
            if (ready()) {
                sleepers_.fetch_sub(1);
                return true;
            }
            if (deadline == std::chrono::steady_clock::time_point::max()) {
                futex_wait(epoch_, e);
            } else {
                auto now = std::chrono::steady_clock::now();
                if (now >= deadline) {
                    sleepers_.fetch_sub(1);
                    return ready();
                }
                timespec ts = to_timespec(deadline - now);
                futex_wait(epoch_, e, &ts);
            }
            sleepers_.fetch_sub(1);
        }
    }

    // Wakes waiters if any sleep. Call after making the condition true. Never blocks or throws.
    void notify() noexcept {
        notify_if([] { return true; });
    }

    // Wakes sleepers only if `wanted()` says one waits for what the caller just made true; read after
    // the sleeper count, so it sees what a registered sleeper wrote before sleep() (see above).
    template <class Wanted>
    void notify_if(Wanted&& wanted) noexcept {
        if (sleepers_.fetch_add(0, std::memory_order_seq_cst) > 0 && wanted()) {
            epoch_.fetch_add(1);
            futex_wake_all(epoch_);
        }
    }

    // Threads registered as sleeping now, and futex wake-ups issued so far: for tests that must know a
    // waiter is blocked (a handshake, not a sleep) or that no wake-up was sent.
    std::uint32_t sleepers() const noexcept { return sleepers_.load(); }
    std::uint32_t wakes() const noexcept { return epoch_.load(); }

private:
    alignas(64) std::atomic<std::uint32_t> epoch_{0};
    std::atomic<std::uint32_t> sleepers_{0};
};

}  // namespace feedline::detail
