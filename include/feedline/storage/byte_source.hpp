// feedline/storage/byte_source.hpp: one object's bytes, wherever they live. The formats read headers,
// indexes and ranges through this interface, never through a file descriptor: a local file
// (storage/file.hpp) is its first implementation, an object in remote storage the next. Where the bytes
// of a location come from is a storage scheme (storage/storage_scheme.hpp); how many requests are in
// flight at once is a reader's business (storage/reader.hpp), which uses a local file's descriptor
// directly (mmap, io_uring, pread) and other sources through read_at().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace feedline {

class file;
class byte_source;

// One contiguous byte range of one source, to be copied into `dest` (which must hold `length` bytes).
struct read_request {
    const byte_source* source = nullptr;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    std::byte* dest = nullptr;
};

class byte_source {
public:
    virtual ~byte_source() = default;

    // What errors name: a path, or a URL.
    virtual const std::string& name() const noexcept = 0;
    // Bytes in the object (fixed once opened: a source reads the object as it was when opened).
    virtual std::uint64_t size() const noexcept = 0;
    // Exactly `length` bytes at `offset` into `dest`. Throws format_error naming the source and offset
    // when the object ends first (it shrank), io_error for the system's failures. Thread-safe.
    virtual void read_at(void* dest, std::uint64_t length, std::uint64_t offset) const = 0;
    // What tells these bytes from other bytes under the same name, for caches keyed by content (the
    // token-length index): a local file's size, modification time and inode; an object's ETag.
    virtual std::string version() const = 0;
    // The local file behind this source, or nullptr: readers with a faster path for local files (mmap,
    // io_uring) take it; everything else reads through read_at().
    virtual const file* local_file() const noexcept { return nullptr; }

    // Whether [offset, offset + length) is on this machine already (a remote object's blocks in the
    // local cache), so fetching it ahead gains nothing. Default: no.
    virtual bool at_hand(std::uint64_t /*offset*/, std::uint64_t /*length*/) const { return false; }

    // Where each request's bytes already sit in this process's memory or a mapping (a remote object's
    // blocks in the local cache), so they can be converted from there without a copy: views[i] for
    // requests[i] (all with this source's batch_key), empty where they must be read. A view stays valid
    // until this thread next reads through these sources or asks for views again; a mapped one is read
    // under a SIGBUS guard.
    // Default: none.
    virtual void cached_views(std::span<const read_request> requests, std::span<std::span<const std::byte>> views) const {
        (void)requests;
        for (auto& v : views) v = {};
    }

    // Sources that can serve many ranges at once (a remote client's objects: concurrent requests)
    // share a key; read_batch is called with requests whose sources all have this source's key.
    virtual const void* batch_key() const noexcept { return this; }
    // Reads every request (same contract as read_at). Default: one after the other.
    virtual void read_batch(std::span<const read_request> requests) const {
        for (const read_request& r : requests) r.source->read_at(r.dest, r.length, r.offset);
    }
};

namespace detail {

// Reads requests through their sources, each group of sources that read together in one read_batch:
// what the readers do with every request that is not for a local file.
inline void read_through_sources(std::span<const read_request> requests) {
    if (requests.empty()) return;
    const void* key = requests.front().source->batch_key();
    if (std::all_of(requests.begin(), requests.end(), [&](const read_request& r) { return r.source->batch_key() == key; })) {
        requests.front().source->read_batch(requests);
        return;
    }
    std::vector<read_request> sorted(requests.begin(), requests.end());
    std::stable_sort(sorted.begin(), sorted.end(), [](const read_request& a, const read_request& b) {
        return std::less<const void*>()(a.source->batch_key(), b.source->batch_key());
    });
    for (std::size_t first = 0; first < sorted.size();) {
        std::size_t last = first + 1;
        while (last < sorted.size() && sorted[last].source->batch_key() == sorted[first].source->batch_key()) ++last;
        sorted[first].source->read_batch(std::span<const read_request>(sorted.data() + first, last - first));
        first = last;
    }
}

// byte_source::cached_views for requests of any sources (a local file's: none; they are mapped by
// the readers), one call per run of requests that share a batch key.
inline void cached_views(std::span<const read_request> requests, std::span<std::span<const std::byte>> views) {
    for (std::size_t first = 0; first < requests.size();) {
        const void* key = requests[first].source->batch_key();
        std::size_t last = first + 1;
        while (last < requests.size() && requests[last].source->batch_key() == key) ++last;
        requests[first].source->cached_views(requests.subspan(first, last - first), views.subspan(first, last - first));
        first = last;
    }
}

}  // namespace detail

}  // namespace feedline
