// feedline/exec/numa_memory.hpp: page-aligned buffers placed on a chosen NUMA node.
// Worker scratch space and ring slots belong on the node of the CPUs that fill them and the GPU that
// reads them. With libnuma and more than one node the pages are bound to the node (numa_alloc_onnode);
// otherwise they are placed by first touch, done here by the allocating thread, and the reason is kept.
// Fed by the topology; feeds the host/pinned rings.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#if FEEDLINE_HAS_NUMA
#include <numa.h>
#endif

namespace feedline {

class numa_buffer {
public:
    numa_buffer() = default;
    // Allocates `bytes` (rounded up to pages) on `node` (-1: no preference) and touches every page so
    // later writes never fault. Throws std::bad_alloc when memory is short.
    explicit numa_buffer(std::size_t bytes, int node = -1) : size_((bytes + 4095) & ~std::size_t(4095)) {
        if (size_ == 0) return;
#if FEEDLINE_HAS_NUMA
        if (node >= 0 && ::numa_available() >= 0 && ::numa_max_node() > 0 && node <= ::numa_max_node()) {
            data_ = static_cast<std::byte*>(::numa_alloc_onnode(size_, node));
            if (data_ == nullptr) throw std::bad_alloc();
            numa_ = true;
            placement_ = "bound to node " + std::to_string(node) + " (libnuma)";
        }
#endif
        if (data_ == nullptr) {
            void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            data_ = static_cast<std::byte*>(p);
            placement_ = node < 0 ? "no node requested: first touch by the allocating thread"
#if FEEDLINE_HAS_NUMA
                         : ::numa_available() < 0 || ::numa_max_node() == 0 ? "single NUMA node: placement is a no-op"
#endif
                                                                            : "first touch by the allocating thread (libnuma not built)";
        }
        std::memset(data_, 0, size_);  // first touch: pages land on the toucher's node and are faulted in now
    }
    numa_buffer(numa_buffer&& o) noexcept
            : data_(std::exchange(o.data_, nullptr)),
              size_(std::exchange(o.size_, 0)),
              numa_(o.numa_),
              placement_(std::move(o.placement_)) {}
    numa_buffer& operator=(numa_buffer&& o) noexcept {
        if (this != &o) {
            release();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            numa_ = o.numa_;
            placement_ = std::move(o.placement_);
        }
        return *this;
    }
    numa_buffer(const numa_buffer&) = delete;
    numa_buffer& operator=(const numa_buffer&) = delete;
    ~numa_buffer() { release(); }

    std::byte* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }
    // How the pages were placed, for stats and logs.
    const std::string& placement() const noexcept { return placement_; }

private:
    void release() noexcept {
        if (data_ == nullptr) return;
#if FEEDLINE_HAS_NUMA
        if (numa_) {
            ::numa_free(data_, size_);
            data_ = nullptr;
            return;
        }
#endif
        ::munmap(data_, size_);
        data_ = nullptr;
    }
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
    bool numa_ = false;
    std::string placement_;
};

}  // namespace feedline
