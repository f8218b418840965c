// feedline/storage/read_request.hpp: what every storage backend is asked to do.
// Datasets turn "tokens [a, b) of document d" into byte ranges of shards (byte sources: local files or
// remote objects); a backend fills caller-owned buffers with exactly those bytes. Fed by format/, feeds
// the workers' batch assembly.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <feedline/storage/byte_source.hpp>
#include <feedline/storage/file.hpp>

namespace feedline {

// read_request (one byte range of one source into a buffer) is declared with byte_source
// (storage/byte_source.hpp).

// access_pattern (how a reader expects to be used) is declared with file_mapping
// (storage/file_mapping.hpp).

// A storage backend: fills every request of a batch, in any order, before returning. Backends with a
// path for local files (mmap, io_uring) read other sources through byte_source::read_at.
// Contract for implementations: not thread-safe (one reader per worker thread); read() either fills
// every byte of every request or throws (format_error for ranges beyond the end of a file, io_error
// for system failures) after all in-flight I/O has finished, so no buffer is written after it returns.
template <class R>
concept reader = requires(R& r, std::span<const read_request> requests) {
    { r.read(requests) } -> std::same_as<void>;
    { r.name() } -> std::convertible_to<std::string_view>;
};

namespace detail {

// Rejects a request that does not lie inside its file; shared by every backend so all of them
// report out-of-range requests identically.
inline void check_in_file(const read_request& r) {
    if (r.source == nullptr) throw config_error("read_request.source", "is null");
    if (r.offset > r.source->size() || r.length > r.source->size() - r.offset)
        throw format_error(
            r.source->name(), r.offset,
            "read of " + std::to_string(r.length) + " bytes goes past the end of the file (size " + std::to_string(r.source->size()) + ")");
}

}  // namespace detail
}  // namespace feedline
