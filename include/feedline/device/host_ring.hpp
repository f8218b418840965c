// feedline/device/host_ring.hpp: the staging ring without a GPU. Same slot protocol and interface as
// the pinned ring; batch buffers are page-aligned host memory (NUMA-local when asked), "copy" is nothing, and a
// batch handle's data() is the host memory itself. CPU trainers use it, and tests exercise the whole
// slot protocol through it under AddressSanitizer and ThreadSanitizer.
//
// A slot (seq % N) orders batches; the memory a batch is written into is chosen when it is acquired:
// of the free buffers its producer thread filled before, the one released last, so while the trainer
// keeps up a worker writes into lines still in its own caches. With memory fixed per slot, a worker
// cycled through all N buffers whatever the depth in use: 8 or more slots of 256 KiB outgrew the core's
// L2, and every store first read its line from L3 or DRAM (a gather loop into 16 rotating buffers ran
// 0.7x one into 4; docs/benchmarks.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <feedline/detail/spin_then_lock.hpp>
#include <feedline/device/staging_ring.hpp>
#include <feedline/exec/numa_memory.hpp>

namespace feedline {

namespace detail {

// A small number per thread, in the order threads first ask: a pipeline's workers, started together,
// usually get consecutive numbers (and so different homes in a ring), unless another thread asks between.
inline std::size_t this_thread_number() noexcept {
    static std::atomic<std::size_t> next{0};
    thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed);
    return mine;
}

}  // namespace detail

class host_ring final : public staging_ring {
public:
    // Allocates and touches every buffer now (first touch places pages on this thread's node when no
    // node is named). Throws config_error for a bad shape, std::bad_alloc when memory is short.
    explicit host_ring(const ring_options& o)
            : staging_ring(o), assigned_(o.slots), filled_by_(o.slots, o.slots), below_(o.slots), top_(o.slots + 1, none) {
        buffers_.reserve(o.slots);
        for (std::size_t i = 0; i < o.slots; ++i) {
            buffers_.emplace_back(o.slot_bytes, o.numa_node);
            push(o.slots, i);  // no producer's yet
        }
        placement_ = buffers_.front().placement();
    }
    ~host_ring() override { close(); }

    bool on_device() const noexcept override { return false; }
    bool pinned() const noexcept override { return false; }
    std::string description() const override {
        return "host ring: " + std::to_string(slots()) + " slots x " + std::to_string(slot_bytes()) + " bytes, " + placement_;
    }

private:
    static constexpr std::size_t none = static_cast<std::size_t>(-1);

    // A free buffer for the calling producer: the last one released of those its home filled, else one
    // no producer has filled yet, else another home's.
    void prepare_fill(std::size_t slot) override {
        const std::size_t homes = buffers_.size(), home = detail::this_thread_number() % homes;
        detail::spin_then_lock(free_mutex_, std::chrono::microseconds(5));  // held for nanoseconds: never worth a sleep
        const std::lock_guard lock(free_mutex_, std::adopt_lock);
        // A free slot holds no buffer and every other slot at most one, so some list has one.
        std::size_t from = top_[home] != none ? home : homes;
        for (std::size_t k = 1; top_[from] == none && k < homes; ++k) from = (home + k) % homes;
        if (top_[from] == none) throw std::logic_error("host_ring: a free slot found no free buffer");
        const std::size_t b = top_[from];
        top_[from] = below_[b];
        assigned_[slot] = b;
        filled_by_[b] = home;
    }
    // The consumer released the slot's batch: its buffer goes back on top of the list of the home that
    // filled it. Called before the slot is marked free.
    void record_release(std::size_t slot, void*) noexcept override {
        detail::spin_then_lock(free_mutex_, std::chrono::microseconds(5));
        const std::lock_guard lock(free_mutex_, std::adopt_lock);
        const std::size_t b = assigned_[slot];
        push(filled_by_[b], b);
    }
    void push(std::size_t list, std::size_t b) noexcept {
        below_[b] = top_[list];
        top_[list] = b;
    }
    // Read by the producer after prepare_fill and by the consumer after the publish's stamp.
    std::byte* host_slot(std::size_t slot) noexcept override { return buffers_[assigned_[slot]].data(); }
    void* device_slot(std::size_t slot) noexcept override { return buffers_[assigned_[slot]].data(); }

    std::vector<numa_buffer> buffers_;
    std::vector<std::size_t> assigned_;   // per slot: the buffer of the batch it holds
    std::vector<std::size_t> filled_by_;  // per buffer: the home of the producer that last filled it
    // Free buffers as intrusive stacks, the last released on top (O(slots) memory, no allocation after
    // construction): one per home (a producer thread's number modulo the slots) and, last, the buffers
    // no producer has filled yet. Guarded by free_mutex_, held for a few instructions per acquire and
    // per release.
    std::vector<std::size_t> below_;  // per free buffer: the next one down its stack
    std::vector<std::size_t> top_;    // per stack: its top buffer, or none
    std::mutex free_mutex_;
    std::string placement_;
};

}  // namespace feedline
