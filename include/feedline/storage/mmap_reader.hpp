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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/file_mapping.hpp>
#include <feedline/storage/guarded_copy.hpp>
#include <feedline/storage/read_request.hpp>

namespace feedline {

class mmap_reader {
public:
    explicit mmap_reader(access_pattern pattern = access_pattern::random) : pattern_(pattern) {}

    // Copies every request out of the mapping of its file (mapped on first use). Not thread-safe.
    // Allocates only for more remote requests than before (a file's mapping is held in the file). A file truncated by another process
    // after mapping would raise SIGBUS in a plain memcpy; the copy is guarded (storage/guarded_copy.hpp)
    // and throws format_error naming the file and offset instead.
    // Sources that are not local files are read through them, all at once (read_remote: a fetch-ahead's first).
    // A file the mapping budget had no room for is read with pread here (detail/mapping_budget.hpp).
    void read(std::span<const read_request> requests) {
        others_.clear();
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (r.length == 0) continue;
            if (const file* f = r.source->local_file()) {
                if (mapping_for(*f) == nullptr) f->read_at(r.dest, r.length, r.offset);  // maps what is new (may throw) before the guarded pass
            } else {
                others_.push_back(r);
            }
        }
        detail::read_remote(others_);
        volatile std::size_t at = 0;  // the request being copied, for the error
        const bool whole = detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
            for (std::size_t i = 0; i < requests.size(); ++i) {
                const read_request& r = requests[i];
                const file* f = r.source->local_file();
                if (r.length == 0 || f == nullptr) continue;
                const file_mapping* m = mapping_for(*f);  // found (or refused): no allocation, no throw
                if (m == nullptr) continue;               // read above
                const std::byte* src = m->bytes().data() + r.offset;
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
    // Throws io_error when the file could not be mapped for want of room (view_if_mapped does not).
    std::span<const std::byte> view(const file& f, std::uint64_t offset, std::uint64_t length) {
        if (auto v = view_if_mapped(f, offset, length)) return *v;
        throw io_error(f.path(), ENOMEM,
                       "cannot be mapped: the process's mappings reached their budget under vm.max_map_count (" +
                           std::to_string(detail::mapping_budget::instance().limit()) + " for files)");
    }
    // The same, or nullopt when the mapping budget had no room for the file: read it with read_at.
    std::optional<std::span<const std::byte>> view_if_mapped(const file& f, std::uint64_t offset, std::uint64_t length) {
        detail::check_in_file(read_request{&f, offset, length, nullptr});
        if (length == 0) return std::span<const std::byte>{};
        const file_mapping* m = mapping_for(f);
        if (m == nullptr) return std::nullopt;
        return m->bytes().subspan(offset, length);
    }

    // Starts background reads of upcoming requests (MADV_WILLNEED) so later read() calls hit memory.
    // Costs one syscall per request: call it for batches that are likely cold, not on every read.
    void prefetch(std::span<const read_request> requests) {
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (const file* f = r.source->local_file())
                if (const file_mapping* m = mapping_for(*f)) m->will_need(r.offset, r.length);
        }
    }

    std::string_view name() const noexcept { return "mmap"; }

private:
    // The file's one mapping (storage/file.hpp), which lives as long as the file: the reader keeps no
    // table of its own, so a mixture of 10,000 files costs each worker's reader nothing per file (a
    // table per reader cost ~80 B a file per worker). A reader that comes to a file last advised with
    // another pattern advises its own: the latest reader's pattern steers readahead. Only on coming to
    // it (not per request), since madvise takes the process's mapping lock for writing.
    // Null: the file was refused a mapping (it is read with pread).
    const file_mapping* mapping_for(const file& f) {
        const file_mapping* m = f.mapping_if_made();
        if (m == nullptr) m = f.mapping(pattern_);
        if (m == nullptr) return nullptr;
        if (m != last_ && m->advised() != pattern_) m->advise(pattern_);
        last_ = m;
        return m;
    }

    access_pattern pattern_;
    const file_mapping* last_ = nullptr;  // the mapping used last
    std::vector<read_request> others_;    // requests of sources that are not local files (reused)
};

static_assert(reader<mmap_reader>);

}  // namespace feedline
