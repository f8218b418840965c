// feedline/exec/queue.hpp: a bounded queue between any number of threads, lock-free at the core,
// blocking on top. The core is Boost.Lockfree's queue; the blocking layer spins briefly, yields, then
// sleeps on a futex, so an idle tokenizing pass burns no CPU.
// Move-only payloads travel as slot indices through the lock-free core (Boost needs trivially
// copyable types). Used by transform/tokenize_in_order.hpp (a reader thread handing chunks of documents
// to tokenizing threads); the pipeline needs no queue: its workers claim step numbers and the staging
// ring orders their batches.
#pragma once

#include <boost/lockfree/queue.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <feedline/detail/closable.hpp>
#include <feedline/error.hpp>

namespace feedline {

namespace detail {

// The lock-free core for a trivially copyable type.
template <class T>
class lockfree_core {
public:
    // Boost's fixed-size queue keeps one node as a dummy: reserve one more than the capacity.
    explicit lockfree_core(std::size_t capacity) : q_(capacity + 1), capacity_(capacity) {}
    bool push(const T& v) noexcept {
        // bounded_push never allocates: the node pool reserved at construction is the bound. The
        // size counter keeps the bound exact (Boost may hand out a spare node).
        if (size_.fetch_add(1) >= capacity_) {
            size_.fetch_sub(1);
            return false;
        }
        if (q_.bounded_push(v)) return true;
        size_.fetch_sub(1);
        return false;
    }
    bool pop(T& v) noexcept {
        if (!q_.pop(v)) return false;
        size_.fetch_sub(1);
        return true;
    }
    bool empty() noexcept { return size_.load() == 0; }

private:
    boost::lockfree::queue<T, boost::lockfree::fixed_sized<true>> q_;
    std::size_t capacity_;
    std::atomic<std::size_t> size_{0};
};

template <class T>
inline constexpr bool lockfree_storable =
    std::is_trivially_copyable_v<T>&& std::is_trivially_destructible_v<T>&& std::is_default_constructible_v<T>;

}  // namespace detail

// A bounded queue of T that any number of threads push to and pop from concurrently. Capacity is fixed
// at construction; nothing grows. close() wakes every waiter: later pushes fail, pops drain what is left
// and then report closed (nullopt).
template <class T>
class mpmc_queue : public detail::closable<mpmc_queue<T>, T> {
    friend class detail::closable<mpmc_queue<T>, T>;
    static constexpr bool direct = detail::lockfree_storable<T>;
    // Boost's fixed-size queue addresses nodes with 16-bit indices.
    static constexpr std::size_t max_capacity = 65534;

public:
    // Allocates all storage. Throws config_error when capacity is 0 or too large.
    explicit mpmc_queue(std::size_t capacity) : capacity_(capacity), items_(checked(capacity)), free_(direct ? 1 : capacity) {
        if constexpr (!direct) {
            slots_ = std::make_unique<std::optional<T>[]>(capacity);
            for (std::uint32_t i = 0; i < capacity; ++i) free_.push(i);
        }
    }
    mpmc_queue(const mpmc_queue&) = delete;
    mpmc_queue& operator=(const mpmc_queue&) = delete;

    // Never blocks. False when full or closed; `value` is then left untouched. Never allocates.
    bool try_push(T&& value) { return push_impl(value); }
    bool try_push(const T& value) requires std::is_copy_constructible_v<T> {
        T copy(value);
        return push_impl(copy);
    }

    // Blocks while full. False only when the queue is closed (the value is dropped).
    bool push(T value) { return push_until(value, std::chrono::steady_clock::time_point::max()); }

    // Blocks while full, at most `timeout`. False on timeout or when closed (check closed()).
    template <class Rep, class Period>
    bool push_for(T value, std::chrono::duration<Rep, Period> timeout) {
        return push_until(value, std::chrono::steady_clock::now() + timeout);
    }

    // Never blocks. nullopt when empty (closed or not).
    std::optional<T> try_pop() {
        std::optional<T> out;
        pop_impl(out);
        return out;
    }

    // pop() and pop_for() block while the queue is empty and open; close() wakes every waiter, later
    // pushes fail and pops drain what is left (detail::closable).
    std::size_t capacity() const noexcept { return capacity_; }
    // Items in the queue right now (approximate under concurrency: for stats, not for control).
    std::size_t size_approx() const noexcept {
        auto pushed = pushed_.load(std::memory_order_relaxed), popped = popped_.load(std::memory_order_relaxed);
        return pushed > popped ? static_cast<std::size_t>(pushed - popped) : 0;
    }

private:
    static std::size_t checked(std::size_t capacity) {
        if (capacity == 0 || capacity > max_capacity)
            throw config_error("queue capacity", "must be in [1, " + std::to_string(max_capacity) + "], got " + std::to_string(capacity));
        return capacity;
    }

    bool push_impl(T& value) {
        // Registered before checking closed_: a consumer reports "closed" only when no push is in
        // flight, so a push that saw the queue open is never stranded behind the consumer's last look.
        pushes_in_flight_.fetch_add(1);
        struct leave {
            mpmc_queue* q;
            ~leave() {
                q->pushes_in_flight_.fetch_sub(1);
                q->has_item_.notify();
            }
        } guard{this};
        if (this->closed_.load()) return false;
        bool ok;
        if constexpr (direct) {
            ok = items_.push(value);
        } else {
            std::uint32_t slot;
            if (!free_.pop(slot)) return false;
            slots_[slot].emplace(std::move(value));
            ok = items_.push(slot);  // cannot fail: there are as many slots as places in items_
        }
        if (ok) pushed_.fetch_add(1, std::memory_order_relaxed);
        return ok;
    }

    bool pop_impl(std::optional<T>& out) {
        bool ok;
        if constexpr (direct) {
            T v;
            ok = items_.pop(v);
            if (ok) out.emplace(v);
        } else {
            std::uint32_t slot;
            ok = items_.pop(slot);
            if (ok) {
                out.emplace(std::move(*slots_[slot]));
                slots_[slot].reset();
                free_.push(slot);
            }
        }
        if (ok) {
            popped_.fetch_add(1, std::memory_order_relaxed);
            this->has_room_.notify();
        }
        return ok;
    }

    bool push_until(T& value, std::chrono::steady_clock::time_point deadline) {
        bool pushed = false;
        this->has_room_.wait([&] { return this->closed_.load() || (pushed = push_impl(value)); }, deadline);
        return pushed;
    }

    std::optional<T> pop_until(std::chrono::steady_clock::time_point deadline) {
        std::optional<T> out;
        // Closed means drained only once no push that saw the queue open is still in flight.
        auto drained = [&] { return this->closed_.load() && pushes_in_flight_.load() == 0; };
        this->has_item_.wait([&] { return pop_impl(out) || drained(); }, deadline);
        if (!out && drained()) pop_impl(out);
        return out;
    }

    using index_or_value = std::conditional_t<direct, T, std::uint32_t>;
    std::size_t capacity_;
    detail::lockfree_core<index_or_value> items_;
    // Free slot indices for move-only payloads. Pushers take, poppers return.
    detail::lockfree_core<std::uint32_t> free_;
    std::unique_ptr<std::optional<T>[]> slots_;
    // Written by pushers only / poppers only, on separate cache lines: a shared counter written from
    // both sides would bounce its line on every item.
    alignas(64) std::atomic<std::uint32_t> pushes_in_flight_{0};
    std::atomic<std::uint64_t> pushed_{0};
    alignas(64) std::atomic<std::uint64_t> popped_{0};
};

}  // namespace feedline
