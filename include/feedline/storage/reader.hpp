// feedline/storage/reader.hpp: choosing a storage backend, and a reader that holds whichever was chosen.
// `auto` picks mmap for cached-size data read through the page cache, io_uring for everything else
// when it was built and the kernel allows it, else mmap (or pread for O_DIRECT), and records why, so a slow run can be explained ("io_uring denied by seccomp: using mmap").
// Fed by the pipeline configuration; feeds datasets and workers.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include <feedline/exec/host_memory.hpp>
#include <feedline/names.hpp>
#include <feedline/storage/mmap_reader.hpp>
#include <feedline/storage/pread_reader.hpp>
#include <feedline/storage/read_request.hpp>
#include <feedline/storage/uring_reader.hpp>

namespace feedline {

enum class io_backend { automatic, io_uring, mmap, pread };

template <>
struct enum_names<io_backend> {
    static constexpr std::array values{named(io_backend::automatic, "auto"), named(io_backend::io_uring, "io_uring"),
                                       named(io_backend::mmap, "mmap"), named(io_backend::pread, "pread"),
                                       named(io_backend::io_uring, "uring")};
};

inline std::string_view to_string(io_backend b) noexcept { return name_of(b); }

struct reader_options {
    io_backend backend = io_backend::automatic;
    access_pattern pattern = access_pattern::random;
    // io_uring settings; `direct` also steers `auto` away from mmap, which cannot bypass the cache.
    unsigned queue_depth = 32;
    bool direct = false;
    bool register_buffers = false;
    // Bytes the reader will be asked for over its life (the dataset size), 0 when unknown. With it,
    // `auto` picks mmap for buffered reads of data that fits in the page cache: on cached data a
    // memcpy out of the mapping beats any read syscall ~2x for 2 KiB windows (docs/benchmarks.md).
    std::uint64_t dataset_bytes = 0;
};

// Why io_uring is not usable here, or nullopt when it is. Never throws.
inline std::optional<std::string> io_uring_unavailable_reason() {
#if FEEDLINE_HAS_URING
    std::string why = uring_reader::unavailable_reason();
    if (why.empty()) return std::nullopt;
    return why;
#else
    return std::string("io_uring support not built (liburing was not found when feedline was configured)");
#endif
}

// A reader holding one concrete backend. Dispatch happens once per batch of requests, so the variant
// costs nothing measurable next to the copies. Not thread-safe: one per worker thread.
class any_reader {
public:
    using variant_type = std::variant<
#if FEEDLINE_HAS_URING
        uring_reader,
#endif
        mmap_reader, pread_reader>;

    // Fills every request (see the reader concept for the failure contract).
    void read(std::span<const read_request> requests) {
        std::visit([&](auto& r) { r.read(requests); }, *impl_);
    }
    std::string_view name() const noexcept {
        return std::visit([](const auto& r) { return r.name(); }, *impl_);
    }
    io_backend backend() const noexcept { return backend_; }
    // One line: which backend and why (e.g. "mmap: io_uring denied (EPERM) ...").
    const std::string& reason() const noexcept { return reason_; }

    template <class R>
    R* get_if() noexcept {
        return std::get_if<R>(impl_.get());
    }

private:
    friend any_reader make_reader(const reader_options&);
    any_reader(std::unique_ptr<variant_type> impl, io_backend b, std::string reason)
            : impl_(std::move(impl)), backend_(b), reason_(std::move(reason)) {}
    std::unique_ptr<variant_type> impl_;  // heap: readers are not movable (the ring's address is fixed)
    io_backend backend_;
    std::string reason_;
};

static_assert(reader<any_reader>);

// Builds the requested backend. An explicitly named backend that cannot work throws (config_error when
// it was not built, io_error when the kernel refuses it); `automatic` falls back and says why.
inline any_reader make_reader(const reader_options& options = {}) {
    using V = any_reader::variant_type;
    auto fallback = [&](std::string why) {
        if (options.direct) return any_reader(std::make_unique<V>(std::in_place_type<pread_reader>), io_backend::pread, "pread: " + why);
        return any_reader(std::make_unique<V>(std::in_place_type<mmap_reader>, options.pattern), io_backend::mmap, "mmap: " + why);
    };
    switch (options.backend) {
        case io_backend::mmap:
            return any_reader(std::make_unique<V>(std::in_place_type<mmap_reader>, options.pattern), io_backend::mmap, "mmap: requested");
        case io_backend::pread:
            return any_reader(std::make_unique<V>(std::in_place_type<pread_reader>), io_backend::pread, "pread: requested");
        case io_backend::io_uring:
        case io_backend::automatic: {
            if (options.backend == io_backend::automatic && !options.direct && options.dataset_bytes > 0) {
                const std::uint64_t available = read_host_memory().available.value_or(0);
                if (options.dataset_bytes <= available / 2)
                    return any_reader(std::make_unique<V>(std::in_place_type<mmap_reader>, options.pattern), io_backend::mmap,
                                      "mmap: the dataset (" + std::to_string(options.dataset_bytes >> 20) +
                                          " MiB) fits in the page cache (" + std::to_string(available >> 20) +
                                          " MiB available), where mmap copies without a syscall per read");
            }
#if FEEDLINE_HAS_URING
            if (auto why = io_uring_unavailable_reason()) {
                if (options.backend == io_backend::io_uring) throw io_error("io_uring", EPERM, *why);
                return fallback(*why);
            }
            uring_options uo{.queue_depth = options.queue_depth, .direct = options.direct, .register_buffers = options.register_buffers};
            return any_reader(std::make_unique<V>(std::in_place_type<uring_reader>, uo), io_backend::io_uring,
                              options.backend == io_backend::io_uring ? "io_uring: requested" : "io_uring: available");
#else
            if (options.backend == io_backend::io_uring) throw config_error("io_backend", *io_uring_unavailable_reason());
            return fallback(*io_uring_unavailable_reason());
#endif
        }
    }
    throw config_error("io_backend", "invalid value");
}

}  // namespace feedline
