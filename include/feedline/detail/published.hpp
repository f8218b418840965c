// feedline/detail/published.hpp: a value that one thread sets once and many read without a lock (a
// pointer to something made on first use that lives as long as its owner), in a struct that is still
// copied and moved while it is built (an atomic alone is neither).
#pragma once

#include <atomic>

namespace feedline::detail {

template <class T>
class published {
public:
    published() = default;
    // Copies are for building the owner (one thread): the value as it is.
    published(const published& o) noexcept : value_(o.get()) {}
    published& operator=(const published& o) noexcept {
        set(o.get());
        return *this;
    }

    // The value set last, or T{}. Acquire: what was made before set() is seen.
    T get() const noexcept { return value_.load(std::memory_order_acquire); }
    // Threads that race to set it set the same value (what they made is shared), so the last wins.
    void set(T v) const noexcept { value_.store(v, std::memory_order_release); }

private:
    mutable std::atomic<T> value_{};
};

}  // namespace feedline::detail
