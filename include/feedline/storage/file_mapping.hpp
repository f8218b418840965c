// feedline/storage/file_mapping.hpp: a read-only mapping of a whole file, with its readahead hint.
// Apart from mmap_reader.hpp because every local file holds the one mapping its readers share
// (storage/file.hpp), in place rather than on the heap.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <feedline/detail/mapping_budget.hpp>
#include <feedline/error.hpp>

namespace feedline {

// How a reader expects to be used; mmap turns this into madvise hints.
enum class access_pattern { sequential, random };

// A read-only shared mapping of a whole file. Move-only; unmaps on destruction. An empty file maps
// to an empty span (mmap refuses length 0). Each takes a place in the process's mapping budget
// (detail/mapping_budget.hpp); without one, or when the kernel has no room (ENOMEM), the file is not
// mapped and refused() says so: its reader reads it without a mapping.
class file_mapping {
public:
    file_mapping() = default;
    // The whole of `f` (a storage/file.hpp file: a template only because that header holds one in
    // each file). Its descriptor is leased for the call: the mapping outlives it. Throws io_error
    // (not for want of room: refused()).
    template <class File>
    requires requires(const File& f) {
        f.use().fd();
        f.size();
        f.path();
    }
    explicit file_mapping(const File& f, access_pattern pattern = access_pattern::random) {
        if (f.size() == 0) return;
        if (!detail::mapping_budget::instance().take()) {
            refuse();
            return;
        }
        void* p = MAP_FAILED;
        int err = 0;
        try {
            const auto held = f.use();  // may throw (the file replaced while its descriptor was closed)
            p = ::mmap(nullptr, f.size(), PROT_READ, MAP_SHARED, held.fd(), 0);
            err = errno;
        } catch (...) {
            detail::mapping_budget::instance().give_back();
            throw;
        }
        if (p == MAP_FAILED) {
            detail::mapping_budget::instance().give_back();
            if (err != ENOMEM) throw io_error(f.path(), err, "mmap failed");
            detail::mapping_budget::instance().kernel_refused();  // past vm.max_map_count (or the address space)
            refuse();
            return;
        }
        data_ = static_cast<const std::byte*>(p);
        size_ = f.size();
        advise(pattern);
    }
    file_mapping(file_mapping&& o) noexcept
            : data_(std::exchange(o.data_, nullptr)),
              size_(std::exchange(o.size_, 0)),
              advised_(o.advised_.load(std::memory_order_relaxed)),
              refused_(std::exchange(o.refused_, false)) {}
    file_mapping& operator=(file_mapping&& o) noexcept {
        if (this != &o) {
            unmap();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            advised_.store(o.advised_.load(std::memory_order_relaxed), std::memory_order_relaxed);
            refused_ = std::exchange(o.refused_, false);
        }
        return *this;
    }
    file_mapping(const file_mapping&) = delete;
    file_mapping& operator=(const file_mapping&) = delete;
    ~file_mapping() { unmap(); }

    std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
    // The file was not mapped for want of room (the mapping budget, or ENOMEM): bytes() is empty.
    bool refused() const noexcept { return refused_; }

    // Hints the kernel's readahead: sequential scans read ahead aggressively, random sampling turns
    // readahead off so each fault reads only what is used. Never fails (hints are advisory). Not for a
    // file within one readahead window (128 KiB by default): unadvised, a cold one is read whole at its
    // first fault (at most that window) where random access would read a page at a time, and the call
    // takes the process's mapping lock for writing, a quarter of what mapping each of a mixture's
    // 10,000 small files cost (bench_mixture, perf).
    static constexpr std::uint64_t advised_from_bytes = std::uint64_t{128} << 10;
    void advise(access_pattern pattern) const noexcept {
        advised_.store(pattern, std::memory_order_relaxed);
        if (data_ != nullptr && size_ > advised_from_bytes)
            ::madvise(const_cast<std::byte*>(data_), size_, pattern == access_pattern::sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
    }

    // Asks the kernel to start reading [offset, offset + length) in the background. Never blocks.
    void will_need(std::uint64_t offset, std::uint64_t length) const noexcept {
        if (data_ == nullptr || length == 0 || offset >= size_) return;
        const std::uint64_t page = 4096;
        std::uint64_t begin = offset & ~(page - 1);
        std::uint64_t end = std::min<std::uint64_t>(size_, offset + length);
        ::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_WILLNEED);
    }

    // Hands the mapping over, with its place in the mapping budget: this is left empty, and the caller
    // unmaps the bytes with unmap_taken (a holder that keeps their span anyway holds them once).
    std::span<const std::byte> take() noexcept {
        const std::span<const std::byte> taken{data_, size_};
        data_ = nullptr;
        size_ = 0;
        return taken;
    }
    static void unmap_taken(std::span<const std::byte> taken) noexcept {
        if (taken.data() == nullptr) return;
        ::munmap(const_cast<std::byte*>(taken.data()), taken.size());
        detail::mapping_budget::instance().give_back();
    }

    // The pattern of the last advise() (readers with another pattern advise again).
    access_pattern advised() const noexcept { return advised_.load(std::memory_order_relaxed); }

private:
    void refuse() noexcept {
        refused_ = true;
        detail::mapping_budget::instance().unmapped_file_opened();
    }
    void unmap() noexcept {
        if (data_ != nullptr) {
            ::munmap(const_cast<std::byte*>(data_), size_);
            detail::mapping_budget::instance().give_back();
        }
        if (refused_) detail::mapping_budget::instance().unmapped_file_closed();
        data_ = nullptr;
        size_ = 0;
        refused_ = false;
    }
    const std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
    mutable std::atomic<access_pattern> advised_{access_pattern::random};
    bool refused_ = false;  // in advised_'s padding: a file holds one (storage/file.hpp)
};
static_assert(sizeof(file_mapping) == 24);

}  // namespace feedline
