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

#include <feedline/error.hpp>

namespace feedline {

// How a reader expects to be used; mmap turns this into madvise hints.
enum class access_pattern { sequential, random };

// A read-only shared mapping of a whole file. Move-only; unmaps on destruction. An empty file maps
// to an empty span (mmap refuses length 0).
class file_mapping {
public:
    file_mapping() = default;
    // The whole of `f` (a storage/file.hpp file: a template only because that header holds one in
    // each file). Its descriptor is leased for the call: the mapping outlives it. Throws io_error.
    template <class File>
    requires requires(const File& f) {
        f.use().fd();
        f.size();
        f.path();
    }
    explicit file_mapping(const File& f, access_pattern pattern = access_pattern::random) : size_(f.size()) {
        if (size_ == 0) return;
        const auto held = f.use();
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, held.fd(), 0);
        if (p == MAP_FAILED) throw io_error(f.path(), errno, "mmap failed");
        data_ = static_cast<const std::byte*>(p);
        advise(pattern);
    }
    file_mapping(file_mapping&& o) noexcept
            : data_(std::exchange(o.data_, nullptr)),
              size_(std::exchange(o.size_, 0)),
              advised_(o.advised_.load(std::memory_order_relaxed)) {}
    file_mapping& operator=(file_mapping&& o) noexcept {
        if (this != &o) {
            unmap();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
            advised_.store(o.advised_.load(std::memory_order_relaxed), std::memory_order_relaxed);
        }
        return *this;
    }
    file_mapping(const file_mapping&) = delete;
    file_mapping& operator=(const file_mapping&) = delete;
    ~file_mapping() { unmap(); }

    std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

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

    // The pattern of the last advise() (readers with another pattern advise again).
    access_pattern advised() const noexcept { return advised_.load(std::memory_order_relaxed); }

private:
    void unmap() noexcept {
        if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
        data_ = nullptr;
        size_ = 0;
    }
    const std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
    mutable std::atomic<access_pattern> advised_{access_pattern::random};
};

}  // namespace feedline
