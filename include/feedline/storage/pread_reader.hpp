// feedline/storage/pread_reader.hpp: the portable backend, one read per request: pread() for a local
// file, byte_source::read_at for any other source. Used when io_uring is unavailable and mmap is not
// wanted (e.g. files on a network filesystem where page faults stall unpredictably). Fed by datasets,
// feeds batch assembly.
#pragma once

#include <span>
#include <string_view>

#include <feedline/storage/read_request.hpp>

namespace feedline {

class pread_reader {
public:
    // Fills every request with its source's read_at (pread, retrying EINTR and short reads, for a local
    // file). Not thread-safe; allocates nothing; throws format_error / io_error as described by the
    // reader concept.
    void read(std::span<const read_request> requests) {
        for (const auto& r : requests) {
            detail::check_in_file(r);
            r.source->read_at(r.dest, r.length, r.offset);
        }
    }
    std::string_view name() const noexcept { return "pread"; }
};

static_assert(reader<pread_reader>);

}  // namespace feedline
