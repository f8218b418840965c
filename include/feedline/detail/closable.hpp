// feedline/detail/closable.hpp: what the two blocking hand-offs (mpmc_queue, reorder_window) share:
// a closed flag, a wait point for each side (producers waiting for room, the consumer waiting for an
// item), close() waking both, and the blocking pops written once over the class's own
// pop_until(deadline).
#pragma once

#include <atomic>
#include <chrono>
#include <optional>

#include <feedline/detail/futex.hpp>

namespace feedline::detail {

// CRTP base: `Derived` defines `std::optional<T> pop_until(steady_clock::time_point)` (it may be
// private if it befriends this class).
template <class Derived, class T>
class closable {
    using clock = std::chrono::steady_clock;

public:
    // Blocks until an item is ready. nullopt only when closed (a queue first drains what is left).
    std::optional<T> pop() { return self().pop_until(clock::time_point::max()); }

    // As pop(), at most `timeout`: nullopt on timeout too (check closed()).
    template <class Rep, class Period>
    std::optional<T> pop_for(std::chrono::duration<Rep, Period> timeout) {
        return self().pop_until(clock::now() + timeout);
    }

    // Wakes every waiter on both sides; later pushes fail. Idempotent; thread-safe.
    void close() noexcept {
        closed_.store(true);
        has_item_.notify();
        has_room_.notify();
    }
    bool closed() const noexcept { return closed_.load(); }

protected:
    closable() = default;
    ~closable() = default;

    std::atomic<bool> closed_{false};
    wait_point has_item_, has_room_;

private:
    Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace feedline::detail
