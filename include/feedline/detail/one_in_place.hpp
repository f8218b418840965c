// feedline/detail/one_in_place.hpp: a table of entries made once and never moved, whose first entry,
// when it is the only one, lives inside the table itself. A dataset's shards (format/dataset.hpp): a
// mixture holds a dataset per domain, most of one shard each, and a vector's block for that one cost
// a domain a chunk header, the vector's capacity word and a pointer chased per window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace feedline::detail {

template <class T>
class one_in_place {
public:
    one_in_place() noexcept {}
    one_in_place(const one_in_place&) = delete;
    one_in_place& operator=(const one_in_place&) = delete;
    ~one_in_place() {
        T* first = data();
        for (std::uint32_t i = size_; i > 0; --i) first[i - 1].~T();
        if (spread()) ::operator delete(many_, std::align_val_t{alignof(T)});
    }

    // Room for `n` entries, before the first push_back: one stays in place, more take a block.
    void reserve(std::size_t n) {
        if (size_ != 0 || capacity_ != 0) throw std::logic_error("one_in_place: reserve once, before the first entry");
        if (n > UINT32_MAX) throw std::length_error("one_in_place: too many entries");
        if (n > 1) many_ = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignof(T)}));
        capacity_ = static_cast<std::uint32_t>(n);
    }
    // Appends within the reserved room (entries never move, so references to them stay valid).
    T& push_back(T&& v) {
        if (size_ == capacity_) throw std::logic_error("one_in_place: past the reserved room");
        T* at = ::new (data() + size_) T(std::move(v));
        ++size_;
        return *at;
    }

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    T* data() noexcept { return spread() ? many_ : &one_; }
    const T* data() const noexcept { return spread() ? many_ : &one_; }
    T& operator[](std::size_t i) noexcept { return data()[i]; }
    const T& operator[](std::size_t i) const noexcept { return data()[i]; }
    T& at(std::size_t i) {
        if (i >= size_) throw std::out_of_range("one_in_place: entry " + std::to_string(i) + " of " + std::to_string(size_));
        return data()[i];
    }
    const T& at(std::size_t i) const { return const_cast<one_in_place&>(*this).at(i); }
    T* begin() noexcept { return data(); }
    T* end() noexcept { return data() + size_; }
    const T* begin() const noexcept { return data(); }
    const T* end() const noexcept { return data() + size_; }

private:
    bool spread() const noexcept { return capacity_ > 1; }
    union {
        T one_;    // room for one (alive while size_ == 1)
        T* many_;  // spread(): a block of room for capacity_
    };
    std::uint32_t size_ = 0, capacity_ = 0;
};

}  // namespace feedline::detail
