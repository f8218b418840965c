// feedline/storage/storage_scheme.hpp: where the bytes of a location come from. A scheme opens a
// location as a byte source (storage/byte_source.hpp) and answers what the dataset resolvers ask of a
// place: does it exist, is it a directory, what is in it, what a glob matches. Local paths are the
// built-in scheme; other schemes ("s3://...") register themselves (one header and its #include line in
// storage/schemes.hpp, docs/architecture.md "Adding a byte source"). Used by the formats
// (format/megatron.hpp, format/llmc.hpp, format/dataset.hpp, format/text.hpp), the spec resolver and
// the doctor's measurements (doctor/measure.hpp).
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/detail/paths.hpp>
#include <feedline/detail/registry.hpp>
#include <feedline/error.hpp>
#include <feedline/storage/byte_source.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/storage/mmap_reader.hpp>

namespace feedline {

struct storage_scheme {
    std::string name;                                     // "file", "s3"
    std::function<bool(std::string_view location)> owns;  // e.g. starts with "s3://"
    // Opens a location (an object, a file) for reading. Throws io_error naming it.
    std::function<std::unique_ptr<byte_source>(const std::string& location)> open;
    std::function<bool(const std::string& location)> exists;        // something readable is there
    std::function<bool(const std::string& location)> is_directory;  // a directory (or a prefix ending in '/')
    // What is directly in a directory, sorted; what a glob (*, ?, [...]) matches, sorted (empty: none).
    // Both throw io_error naming the place when it cannot be listed.
    std::function<std::vector<std::string>(const std::string& location)> list_directory;
    std::function<std::vector<std::string>(const std::string& pattern)> glob;
};

// Local paths: files through the kernel (storage/file.hpp), listed with glob(3) and readdir.
inline const storage_scheme& local_storage() {
    static const storage_scheme s{
        .name = "file",
        .owns = [](std::string_view) { return true; },
        .open = [](const std::string& path) -> std::unique_ptr<byte_source> { return std::make_unique<file>(path); },
        .exists = [](const std::string& path) { return detail::path_exists(path); },
        .is_directory = [](const std::string& path) { return detail::is_directory(path); },
        .list_directory = [](const std::string& path) { return detail::regular_files_in(path); },
        .glob = [](const std::string& pattern) { return detail::glob_paths(pattern); }};
    return s;
}

// The schemes registered besides local paths (detail/registry.hpp).
using storage_registry = detail::registry<storage_scheme>;

// The scheme that owns `location`: the first registered one that does, else local paths. The reference
// stays valid for the process's life.
inline const storage_scheme& scheme_for(std::string_view location) {
    for (const auto& s : storage_registry::entries())
        if (s->owns(location)) return *s;
    return local_storage();
}

// Opens `location` through its scheme. Throws io_error naming it.
inline std::unique_ptr<byte_source> open_byte_source(const std::string& location) { return scheme_for(location).open(location); }

// What a location names, listed once through its scheme: a glob's matches, a directory's entries (one
// level), or the location alone. The one expansion every resolver uses (token shards, text, blends,
// feedline-doctor check's reads).
struct expanded_location {
    enum class form { glob, directory, single } kind = form::single;
    std::vector<std::string> entries;  // sorted; `single`: the location itself, whether it exists or not
};

// Throws io_error naming the place when a glob matches nothing or a directory cannot be listed.
inline expanded_location expand_location(const std::string& location) {
    const storage_scheme& scheme = scheme_for(location);
    if (detail::has_glob_chars(location)) {
        auto matches = scheme.glob(location);
        if (matches.empty()) throw io_error(location, ENOENT, "pattern matches no file");
        return {expanded_location::form::glob, std::move(matches)};
    }
    if (scheme.is_directory(location)) return {expanded_location::form::directory, scheme.list_directory(location)};
    return {expanded_location::form::single, {location}};
}

// A whole object in memory, for what is read all over (an index), held by value: a local file's own
// mapping (with the pattern's readahead hint; it outlives the file's descriptor), or a copy of another
// source's object, or of a file the mapping budget has no room for (detail/mapping_budget.hpp), read
// once. By value rather than behind a shared owner: a control block and a second span were 56 bytes
// on the heap, and a mixture keeps an index per domain. Move-only; the bytes do not move with it.
class whole_object {
public:
    // Throws io_error naming the source when it cannot be read.
    static whole_object load(const byte_source& source, access_pattern pattern = access_pattern::sequential) {
        whole_object w;
        if (const file* f = source.local_file()) {
            file_mapping mapped(*f, pattern);
            if (!mapped.refused()) {
                w.bytes_ = mapped.take();
                w.mapped_ = true;
                return w;
            }
        }
        auto copy = std::make_unique_for_overwrite<std::byte[]>(source.size());
        source.read_at(copy.get(), source.size(), 0);
        w.bytes_ = {copy.release(), source.size()};
        return w;
    }
    whole_object(whole_object&& o) noexcept : bytes_(std::exchange(o.bytes_, {})), mapped_(std::exchange(o.mapped_, false)) {}
    whole_object& operator=(whole_object&& o) noexcept {
        if (this != &o) {
            free_taken(bytes_, mapped_);
            bytes_ = std::exchange(o.bytes_, {});
            mapped_ = std::exchange(o.mapped_, false);
        }
        return *this;
    }
    ~whole_object() { free_taken(bytes_, mapped_); }

    std::span<const std::byte> bytes() const noexcept { return bytes_; }
    bool mapped() const noexcept { return mapped_; }
    // Hands the bytes over (this is left empty): the caller frees them with free_taken(bytes,
    // mapped()). For a holder that keeps their span anyway (a Megatron pair's index view): 24 bytes
    // a pair fewer.
    std::span<const std::byte> take() noexcept {
        mapped_ = false;
        return std::exchange(bytes_, {});
    }
    static void free_taken(std::span<const std::byte> bytes, bool mapped) noexcept {
        if (mapped)
            file_mapping::unmap_taken(bytes);
        else
            delete[] bytes.data();
    }

private:
    whole_object() = default;
    std::span<const std::byte> bytes_;  // a copy's: from new[] (null for none)
    bool mapped_ = false;
};

}  // namespace feedline
