// feedline/detail/fixed_array.hpp: an array whose size is fixed when it is filled, 16 bytes where a
// vector is 24 (its capacity), and never more room than entries. A dataset's document starts
// (format/dataset.hpp): a mixture holds a dataset per domain, most with none.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

namespace feedline::detail {

template <class T>
class fixed_array {
public:
    fixed_array() = default;
    // A copy of `v`, exactly its size.
    fixed_array& operator=(const std::vector<T>& v) {
        auto next = v.empty() ? nullptr : std::make_unique_for_overwrite<T[]>(v.size());
        std::copy(v.begin(), v.end(), next.get());
        data_ = std::move(next);
        size_ = v.size();
        return *this;
    }

    std::size_t size() const noexcept { return size_; }
    bool empty() const noexcept { return size_ == 0; }
    const T& operator[](std::size_t i) const noexcept { return data_[i]; }
    const T& back() const noexcept { return data_[size_ - 1]; }
    const T* begin() const noexcept { return data_.get(); }
    const T* end() const noexcept { return data_.get() + size_; }

private:
    std::unique_ptr<T[]> data_;
    std::size_t size_ = 0;
};

}  // namespace feedline::detail
