// feedline/exec/reorder.hpp: hands out results in sequence order, whatever order workers finish in.
// Work item k may complete before k-1; it waits in slot k % capacity until the consumer has taken every
// earlier one. A producer whose item lies beyond the window (k >= next + capacity) sleeps until the
// consumer catches up, so the window bounds memory: at most `capacity` results exist at once.
// Fed by transform/tokenize_in_order.hpp's tokenizing threads; feeds its writing thread. (The pipeline's
// batches are reordered by the staging ring itself: batch k lives in slot k mod N.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include <feedline/detail/closable.hpp>
#include <feedline/error.hpp>

namespace feedline {

template <class T>
class reorder_window : public detail::closable<reorder_window<T>, T> {
    friend class detail::closable<reorder_window<T>, T>;

public:
    // Allocates `capacity` slots up front. Throws config_error for capacity 0.
    explicit reorder_window(std::size_t capacity, std::uint64_t first_sequence = 0)
            : capacity_(capacity), slots_(std::make_unique<slot[]>(capacity == 0 ? 1 : capacity)), next_(first_sequence) {
        if (capacity == 0) throw config_error("reorder window", "capacity must be at least 1");
    }
    reorder_window(const reorder_window&) = delete;
    reorder_window& operator=(const reorder_window&) = delete;

    // Producer: blocks (spin, yield, then sleep) until `seq` fits in the window. False when closed.
    // Thread-safe for any number of producers.
    bool wait_for_room(std::uint64_t seq) {
        this->has_room_.wait([&] { return this->closed_.load() || seq < next_.load(std::memory_order_acquire) + capacity_; });
        return !this->closed_.load();
    }

    // Producer: stores the result for `seq`, which must have passed wait_for_room and not been put
    // before. Never blocks; thread-safe across distinct sequence numbers.
    void put(std::uint64_t seq, T value) {
        slot& s = slots_[seq % capacity_];
        s.value.emplace(std::move(value));
        s.ready.store(1, std::memory_order_release);
        this->has_item_.notify();
    }

    // Consumer (one thread at a time): pop() blocks until the next result in sequence is ready and
    // returns it, nullopt once closed; pop_for() gives up after a timeout; close() wakes every producer
    // and the consumer (detail::closable).

    std::uint64_t next_sequence() const noexcept { return next_.load(std::memory_order_acquire); }
    std::size_t capacity() const noexcept { return capacity_; }
    // Results finished but not yet taken (approximate: for stats).
    std::size_t ready_count() const noexcept {
        std::size_t n = 0;
        for (std::size_t i = 0; i < capacity_; ++i) n += slots_[i].ready.load(std::memory_order_relaxed);
        return n;
    }

private:
    struct alignas(64) slot {
        std::atomic<std::uint32_t> ready{0};
        std::optional<T> value;
    };

    std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) {
        slot& s = slots_[next_.load(std::memory_order_relaxed) % capacity_];
        this->has_item_.wait([&] { return this->closed_.load() || s.ready.load(std::memory_order_acquire) == 1; }, deadline);
        if (this->closed_.load() || s.ready.load(std::memory_order_acquire) == 0) return std::nullopt;
        std::optional<T> out(std::move(*s.value));
        s.value.reset();
        s.ready.store(0, std::memory_order_relaxed);
        next_.fetch_add(1, std::memory_order_release);
        this->has_room_.notify();
        return out;
    }

    std::size_t capacity_;
    std::unique_ptr<slot[]> slots_;
    alignas(64) std::atomic<std::uint64_t> next_;
};

}  // namespace feedline
