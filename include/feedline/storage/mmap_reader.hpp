// feedline/storage/mmap_reader.hpp: the page-cache backend: map each shard once, memcpy out.
// Fastest when the data is cached (no syscall per request); madvise tells the kernel whether we scan
// or sample. Fed by datasets, feeds batch assembly; view() gives zero-copy access for inspection.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/guarded_copy.hpp>
#include <feedline/storage/read_request.hpp>

namespace feedline {

// A read-only shared mapping of a whole file. Move-only; unmaps on destruction. An empty file maps
// to an empty span (mmap refuses length 0).
class file_mapping {
public:
    file_mapping() = default;
    explicit file_mapping(const file& f, access_pattern pattern = access_pattern::random) : size_(f.size()) {
        if (size_ == 0) return;
        const file::lease held = f.use();  // the mapping outlives the descriptor
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

class mmap_reader {
public:
    explicit mmap_reader(access_pattern pattern = access_pattern::random) : pattern_(pattern) {}

    // Copies every request out of the mapping of its file (mapped on first use). Not thread-safe.
    // Allocates only when a file is first mapped (by any reader), or for more remote requests than before. A file truncated by another process
    // after mapping would raise SIGBUS in a plain memcpy; the copy is guarded (storage/guarded_copy.hpp)
    // and throws format_error naming the file and offset instead.
    // Sources that are not local files are read through them, all at once (read_remote: a fetch-ahead's first).
    void read(std::span<const read_request> requests) {
        others_.clear();
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (r.length == 0) continue;
            if (const file* f = r.source->local_file())
                (void)mapping_for(*f);  // maps what is new (may throw) before the guarded pass
            else
                others_.push_back(r);
        }
        detail::read_remote(others_);
        volatile std::size_t at = 0;  // the request being copied, for the error
        const bool whole = detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
            for (std::size_t i = 0; i < requests.size(); ++i) {
                const read_request& r = requests[i];
                const file* f = r.source->local_file();
                if (r.length == 0 || f == nullptr) continue;
                const std::byte* src = mapping_for(*f).bytes().data() + r.offset;  // found: no allocation, no throw
                at = i;
                guard.covering(src, r.length);
                detail::copy_from_mapping(r.dest, src, r.length);
            }
        });
        if (!whole) throw detail::file_shrank_error(requests[at].source->name(), requests[at].offset);
    }

    // Zero-copy access to [offset, offset + length) of `f`, valid while `f` (or the file it is moved
    // into) lives; assigning another file over it ends it. Unlike
    // read(), touching the view of a file truncated under it raises SIGBUS: for tools on files at rest.
    std::span<const std::byte> view(const file& f, std::uint64_t offset, std::uint64_t length) {
        detail::check_in_file(read_request{&f, offset, length, nullptr});
        if (length == 0) return {};
        return mapping_for(f).bytes().subspan(offset, length);
    }

    // Starts background reads of upcoming requests (MADV_WILLNEED) so later read() calls hit memory.
    // Costs one syscall per request: call it for batches that are likely cold, not on every read.
    void prefetch(std::span<const read_request> requests) {
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (const file* f = r.source->local_file()) mapping_for(*f).will_need(r.offset, r.length);
        }
    }

    std::string_view name() const noexcept { return "mmap"; }

private:
    // The file's one mapping (storage/file.hpp), which lives as long as the file: the reader keeps no
    // table of its own, so a mixture of 10,000 files costs each worker's reader nothing per file (a
    // table per reader cost ~80 B a file per worker). A reader that comes to a file last advised with
    // another pattern advises its own: the latest reader's pattern steers readahead. Only on coming to
    // it (not per request), since madvise takes the process's mapping lock for writing.
    const file_mapping& mapping_for(const file& f) {
        const file_mapping* m = f.mapping_if_made();
        if (m == nullptr) m = f.shared_mapping([&] { return std::make_shared<const file_mapping>(f, pattern_); }).get();
        if (m != last_ && m->advised() != pattern_) m->advise(pattern_);
        last_ = m;
        return *m;
    }

    access_pattern pattern_;
    const file_mapping* last_ = nullptr;  // the mapping used last
    std::vector<read_request> others_;    // requests of sources that are not local files (reused)
};

static_assert(reader<mmap_reader>);

}  // namespace feedline
