// feedline/storage/mmap_reader.hpp: the page-cache backend: map each shard once, memcpy out.
// Fastest when the data is cached (no syscall per request); madvise tells the kernel whether we scan
// or sample. Fed by datasets, feeds batch assembly; view() gives zero-copy access for inspection.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
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
    file_mapping(file_mapping&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    file_mapping& operator=(file_mapping&& o) noexcept {
        if (this != &o) {
            unmap();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    file_mapping(const file_mapping&) = delete;
    file_mapping& operator=(const file_mapping&) = delete;
    ~file_mapping() { unmap(); }

    std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }

    // Hints the kernel's readahead: sequential scans read ahead aggressively, random sampling turns
    // readahead off so each fault reads only what is used. Never fails (hints are advisory).
    void advise(access_pattern pattern) const noexcept {
        if (data_ != nullptr)
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

private:
    void unmap() noexcept {
        if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
        data_ = nullptr;
        size_ = 0;
    }
    const std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
};

class mmap_reader {
public:
    explicit mmap_reader(access_pattern pattern = access_pattern::random) : pattern_(pattern) {}

    // Copies every request out of the mapping of its file (mapped on first use). Not thread-safe.
    // Allocates only when it meets a file for the first time. A file truncated by another process
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

    // Zero-copy access to [offset, offset + length) of `f`, valid while this reader lives. Unlike
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
    const file_mapping& mapping_for(const file& f) {
        // The last hit is checked first; then a scan while the files are few (shards of one dataset),
        // a hash past that (a mixture's thousands of shards: a scan per window cost more than its copy).
        if (last_ < mappings_.size() && mappings_[last_].first == &f) return *mappings_[last_].second;
        if (mappings_.size() <= scan_max) {
            for (std::size_t i = 0; i < mappings_.size(); ++i)
                if (mappings_[i].first == &f) return *mappings_[last_ = i].second;
        } else if (const auto it = index_.find(&f); it != index_.end()) {
            return *mappings_[last_ = it->second].second;
        }
        auto shared = f.shared_mapping([&] { return std::make_shared<const file_mapping>(f, pattern_); });
        shared->advise(pattern_);  // the latest reader's pattern steers readahead
        mappings_.emplace_back(&f, std::move(shared));
        last_ = mappings_.size() - 1;
        if (mappings_.size() == scan_max + 1)
            for (std::size_t i = 0; i < mappings_.size(); ++i) index_.emplace(mappings_[i].first, i);
        else if (mappings_.size() > scan_max + 1)
            index_.emplace(&f, last_);
        return *mappings_.back().second;
    }

    static constexpr std::size_t scan_max = 16;
    access_pattern pattern_;
    // Each file's shared mapping (storage/file.hpp), held while this reader lives.
    std::vector<std::pair<const file*, std::shared_ptr<const file_mapping>>> mappings_;
    std::unordered_map<const file*, std::size_t> index_;  // mappings_' positions, once they outnumber scan_max
    std::size_t last_ = 0;
    std::vector<read_request> others_;  // requests of sources that are not local files (reused)
};

static_assert(reader<mmap_reader>);

}  // namespace feedline
