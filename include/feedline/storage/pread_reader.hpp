// feedline/storage/pread_reader.hpp: the portable backend, one read per request: pread() for a local
// file, byte_source::read_at for any other source. Used when io_uring is unavailable and mmap is not
// wanted (e.g. files on a network filesystem where page faults stall unpredictably). Fed by datasets,
// feeds batch assembly.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/read_request.hpp>

namespace feedline {

class pread_reader {
public:
    // Fills every request with its source's read_at (pread, retrying EINTR and short reads, for a local
    // file); other sources read theirs all at once (read_remote: a fetch-ahead's first). Not thread-safe; allocates
    // nothing once warm; throws format_error / io_error as described by the reader concept.
    void read(std::span<const read_request> requests) {
        others_.clear();
        for (const auto& r : requests) {
            detail::check_in_file(r);
            if (r.source->local_file() != nullptr)
                r.source->read_at(r.dest, r.length, r.offset);
            else if (r.length > 0)
                others_.push_back(r);
        }
        detail::read_remote(others_);
    }
    std::string_view name() const noexcept { return "pread"; }

private:
    std::vector<read_request> others_;  // requests of sources that are not local files (reused)
};

static_assert(reader<pread_reader>);

}  // namespace feedline
