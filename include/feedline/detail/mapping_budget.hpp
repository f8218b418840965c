// feedline/detail/mapping_budget.hpp: keeps the file mappings feedline makes within vm.max_map_count.
// Every mmap is a VMA, and the kernel refuses a process more than vm.max_map_count of them (65,530 by
// default) with ENOMEM. A mixture maps each domain's shards as it first reads them, and a Megatron
// pair maps its .idx when opened, so 10,000 domains of a few Megatron pairs or llm.c shards each reach
// the limit and the job died mid-run on the first domain past it ("mmap failed"). Instead each file
// mapping takes a place here first; once the budget is spent, a file is read without one (pread into
// the worker's buffer, an index into memory: storage/file.hpp, storage/mmap_reader.hpp), which costs a
// syscall per read but runs. The budget leaves room for the process's own mappings (its libraries,
// thread stacks, malloc arenas, a CUDA context: thousands), like the descriptor pool's room under
// RLIMIT_NOFILE (detail/descriptor_pool.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>

namespace feedline::detail {

// The number a /proc file holds (0 when it cannot be read).
inline std::uint64_t read_proc_number(const char* path) {
    std::FILE* f = std::fopen(path, "re");
    if (f == nullptr) return 0;
    unsigned long long v = 0;
    const bool ok = std::fscanf(f, "%llu", &v) == 1;
    std::fclose(f);
    return ok ? v : 0;
}

// Mappings this process has now: the lines of /proc/self/maps (0 when it cannot be read).
inline std::uint64_t mappings_in_use() {
    std::FILE* f = std::fopen("/proc/self/maps", "re");
    if (f == nullptr) return 0;
    std::uint64_t lines = 0;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
        for (std::size_t i = 0; i < n; ++i) lines += buf[i] == '\n';
    std::fclose(f);
    return lines;
}

class mapping_budget {
public:
    static constexpr std::uint64_t default_max_map_count = 65530;  // the kernel's default (DEFAULT_MAX_MAP_COUNT)

    // Never destroyed: files in static storage may unmap after every other static is gone.
    static mapping_budget& instance() {
        static auto* const budget = new mapping_budget;
        return *budget;
    }

    // What the files may map together, decided at the first mapping: vm.max_map_count less the
    // mappings the process had then and room for those it makes later (an eighth of the limit, at
    // least 1,024), at least 16.
    static std::uint64_t default_limit() {
        std::uint64_t max = read_proc_number("/proc/sys/vm/max_map_count");
        if (max == 0) max = default_max_map_count;
        const std::uint64_t room = std::max<std::uint64_t>(max / 8, 1024), used = mappings_in_use();
        return max > used + room + 16 ? max - used - room : 16;
    }

    // A place for one more mapping: false once `limit()` are held (the file is read without one).
    bool take() noexcept {
        const std::uint64_t lim = limit();
        std::uint64_t now = held_.load(std::memory_order_relaxed);
        do {
            if (now >= lim) return false;
        } while (!held_.compare_exchange_weak(now, now + 1, std::memory_order_relaxed));
        return true;
    }
    // A mapping that took a place is gone.
    void give_back() noexcept { held_.fetch_sub(1, std::memory_order_relaxed); }
    // A file is read without a mapping for want of a place (or the kernel's room), until it closes.
    void unmapped_file_opened() noexcept { unmapped_.fetch_add(1, std::memory_order_relaxed); }
    void unmapped_file_closed() noexcept { unmapped_.fetch_sub(1, std::memory_order_relaxed); }
    // The kernel refused a mapping that had a place (ENOMEM: the process's other mappings grew past
    // the room left for them): no more than are held now from here on.
    void kernel_refused() noexcept {
        std::uint64_t lim = limit_.load(std::memory_order_relaxed);
        const std::uint64_t now = held_.load(std::memory_order_relaxed);
        while (now < lim && !limit_.compare_exchange_weak(lim, now, std::memory_order_relaxed)) {
        }
    }

    std::uint64_t limit() noexcept {
        std::uint64_t lim = limit_.load(std::memory_order_relaxed);
        if (lim != unset) return lim;
        std::call_once(decided_, [this] {
            std::uint64_t expected = unset;
            limit_.compare_exchange_strong(expected, default_limit(), std::memory_order_relaxed);
        });
        return limit_.load(std::memory_order_relaxed);
    }
    // Sets the limit (an application that maps much itself; tests). Mappings held already stay.
    void set_limit(std::uint64_t n) noexcept { limit_.store(n, std::memory_order_relaxed); }
    std::uint64_t held() const noexcept { return held_.load(std::memory_order_relaxed); }
    // Files open now that were refused a mapping (a file asks once: it then stays unmapped while open).
    std::uint64_t unmapped() const noexcept { return unmapped_.load(std::memory_order_relaxed); }

private:
    static constexpr std::uint64_t unset = ~std::uint64_t{0};
    mapping_budget() = default;
    std::atomic<std::uint64_t> limit_{unset}, held_{0}, unmapped_{0};
    std::once_flag decided_;
};

}  // namespace feedline::detail
