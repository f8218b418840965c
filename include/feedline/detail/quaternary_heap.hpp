// feedline/detail/quaternary_heap.hpp: a min-heap of (key, id) pairs with four children per node.
//
// The mixer keeps in two heaps the jobs a timing wheel or more away (sampling/mixer.hpp); when they
// held every domain's job, popped and pushed once per sample, a binary heap's 13 levels of
// unpredictable comparisons at 10,000 domains were 11% of the pipeline's CPU time (bench_mixture
// under perf). Four children halve the levels, and the four are 64 contiguous
// bytes (one or two cache lines). Entries compare by key, then id: with unique ids the pop
// order is a total order, the same as any other correct priority queue's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace feedline::detail {

class quaternary_heap {
public:
    struct entry {
        std::uint64_t key;
        std::uint32_t id;
    };

    void reserve(std::size_t n) { v_.reserve(n); }
    // Room for one more push, so that the push cannot throw (grown by doubling).
    void make_room_for_one() {
        if (v_.size() == v_.capacity()) v_.reserve(v_.capacity() < 8 ? 16 : 2 * v_.capacity());
    }
    bool empty() const noexcept { return v_.empty(); }
    std::size_t size() const noexcept { return v_.size(); }
    const entry& top() const noexcept { return v_.front(); }  // the least; not on an empty heap

    void push(entry e) {
        std::size_t i = v_.size();
        v_.push_back(e);
        while (i > 0) {
            const std::size_t parent = (i - 1) / 4;
            if (!less(e, v_[parent])) break;
            v_[i] = v_[parent];
            i = parent;
        }
        v_[i] = e;
    }

    void pop() {  // not on an empty heap
        const entry last = v_.back();
        v_.pop_back();
        const std::size_t n = v_.size();
        if (n == 0) return;
        std::size_t i = 0;
        for (;;) {
            const std::size_t first = 4 * i + 1;
            if (first >= n) break;
            const std::size_t end = first + 4 < n ? first + 4 : n;
            std::size_t best = first;
            for (std::size_t c = first + 1; c < end; ++c)
                if (less(v_[c], v_[best])) best = c;
            if (!less(v_[best], last)) break;
            v_[i] = v_[best];
            i = best;
        }
        v_[i] = last;
    }

private:
    static bool less(const entry& a, const entry& b) noexcept { return a.key != b.key ? a.key < b.key : a.id < b.id; }

    std::vector<entry> v_;
};

}  // namespace feedline::detail
