// feedline/device/host_ring.hpp: the staging ring without a GPU. Same slot protocol and interface as
// the pinned ring; slots are page-aligned host memory (NUMA-local when asked), "copy" is nothing, and a
// batch handle's data() is the host slot itself. CPU trainers use it, and tests exercise the whole
// slot protocol through it under AddressSanitizer and ThreadSanitizer.
#pragma once

#include <string>
#include <vector>

#include <feedline/device/staging_ring.hpp>
#include <feedline/exec/numa_memory.hpp>

namespace feedline {

class host_ring final : public staging_ring {
public:
    // Allocates and touches every slot now (first touch places pages on this thread's node when no
    // node is named). Throws config_error for a bad shape, std::bad_alloc when memory is short.
    explicit host_ring(const ring_options& o) : staging_ring(o) {
        slots_.reserve(o.slots);
        for (std::size_t i = 0; i < o.slots; ++i) slots_.emplace_back(o.slot_bytes, o.numa_node);
        placement_ = slots_.front().placement();
    }
    ~host_ring() override { close(); }

    bool on_device() const noexcept override { return false; }
    bool pinned() const noexcept override { return false; }
    std::string description() const override {
        return "host ring: " + std::to_string(slots()) + " slots x " + std::to_string(slot_bytes()) + " bytes, " + placement_;
    }

private:
    std::byte* host_slot(std::size_t i) noexcept override { return slots_[i].data(); }
    void* device_slot(std::size_t i) noexcept override { return slots_[i].data(); }

    std::vector<numa_buffer> slots_;
    std::string placement_;
};

}  // namespace feedline
