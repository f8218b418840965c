// feedline/storage/byte_source.hpp: one object's bytes, wherever they live. The formats read headers,
// indexes and ranges through this interface, never through a file descriptor: a local file
// (storage/file.hpp) is its first implementation, an object in remote storage the next. Where the bytes
// of a location come from is a storage scheme (storage/storage_scheme.hpp); how many requests are in
// flight at once is a reader's business (storage/reader.hpp), which uses a local file's descriptor
// directly (mmap, io_uring, pread) and other sources through read_at().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace feedline {

class file;

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
};

// An object's bytes held in memory (a mapped file, or a downloaded object) and what keeps them alive.
struct byte_view {
    std::span<const std::byte> bytes;
    std::shared_ptr<const void> owner;
};

}  // namespace feedline
