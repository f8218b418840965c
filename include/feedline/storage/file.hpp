// feedline/storage/file.hpp: a read-only local file with its size, owned by RAII: the local byte
// source (storage/byte_source.hpp). Reader backends take byte sources and use a local file's
// descriptor directly (mmap, io_uring, pread) through a lease; datasets open one per shard at
// construction so a missing file fails early with its name, never mid-epoch, and the descriptor pool
// keeps their descriptors within RLIMIT_NOFILE (detail/descriptor_pool.hpp).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <feedline/detail/descriptor_pool.hpp>
#include <feedline/error.hpp>
#include <feedline/storage/byte_source.hpp>
#include <feedline/storage/file_mapping.hpp>

namespace feedline {

namespace detail {

// Direct I/O needs buffers, offsets and lengths aligned to the device's logical block size. 4096
// covers every NVMe and virtio disk seen in practice (512-byte devices accept 4096 too).
inline constexpr std::uint64_t direct_io_alignment = 4096;

}  // namespace detail

// A read-only local file: its path, its size when opened, and a descriptor that is open while it is
// used. Every descriptor is in the process's descriptor pool (detail/descriptor_pool.hpp), which
// closes idle ones when the files' descriptors reach RLIMIT_NOFILE's budget; a file opens its own
// again on its next lease and checks it is still the file it opened (the same device and inode, not
// shorter): a file replaced or truncated under the job is an io_error naming it, never another file's
// bytes. Move-only. Thread-safe for concurrent reads (pread/mmap/io_uring never use the shared file
// position).
class file final : public byte_source {
public:
    file() = default;

    // Opens `path` read-only. Throws io_error naming the path when it cannot be opened or stat'ed, or
    // is not a regular file: opened non-blocking, so a FIFO or device where data belongs is refused
    // at once instead of blocking the open forever (a directory is refused the same way).
    explicit file(std::string path, bool direct = false)
            : path_(std::move(path)), state_(std::make_unique<shared_state>()) {
        state_->direct = direct;
        struct stat st {};
        const std::lock_guard lock(state_->mutex);
        const int fd = open_checked(st);
        size_ = static_cast<std::uint64_t>(st.st_size);
        device_ = st.st_dev;
        inode_ = st.st_ino;
        state_->modified = modified_ns(st);
        listed(fd);
    }

    file(file&& o) noexcept
            : byte_source(),
              size_(o.size_),
              path_(std::move(o.path_)),
              device_(o.device_),
              inode_(o.inode_),
              state_(std::move(o.state_)) {}
    file& operator=(file&& o) noexcept {
        if (this != &o) {
            close();
            size_ = o.size_;
            path_ = std::move(o.path_);
            device_ = o.device_;
            inode_ = o.inode_;
            state_ = std::move(o.state_);
        }
        return *this;
    }
    file(const file&) = delete;
    file& operator=(const file&) = delete;
    ~file() override { close(); }

    // The file's descriptor, held open while the lease lives (the pool closes none that is leased).
    class lease {
    public:
        lease() = default;
        lease(lease&& o) noexcept : state_(std::exchange(o.state_, nullptr)), fd_(std::exchange(o.fd_, -1)) {}
        lease& operator=(lease&& o) noexcept {
            if (this != &o) {
                release();
                state_ = std::exchange(o.state_, nullptr);
                fd_ = std::exchange(o.fd_, -1);
            }
            return *this;
        }
        lease(const lease&) = delete;
        lease& operator=(const lease&) = delete;
        ~lease() { release(); }
        int fd() const noexcept { return fd_; }

    private:
        friend class file;
        lease(detail::pooled_descriptor* s, int fd) : state_(s), fd_(fd) {}
        void release() noexcept {
            if (state_ == nullptr) return;
            const std::lock_guard lock(state_->mutex);
            --state_->users;
            state_ = nullptr;
        }
        detail::pooled_descriptor* state_ = nullptr;
        int fd_ = -1;
    };

    // The descriptor, opened again if the pool closed it. Throws io_error naming the file when it
    // cannot be opened, or is no longer the file opened first (replaced, or shorter).
    lease use() const {
        if (!state_) throw io_error(path_.empty() ? "(no file)" : path_, EBADF, "not open (moved from)");
        const std::lock_guard lock(state_->mutex);
        if (state_->fd < 0) {
            struct stat st {};
            const int fd = open_checked(st);
            // The inode alone does not tell: a file removed and another created may get its number
            // (ext4, XFS), so the modification time must match too.
            const bool same = st.st_dev == device_ && st.st_ino == inode_ && modified_ns(st) == state_->modified;
            if (!same || static_cast<std::uint64_t>(st.st_size) < size_) {
                ::close(fd);
                throw io_error(path_, ESTALE,
                               static_cast<std::uint64_t>(st.st_size) < size_
                                   ? "is shorter than when it was opened (" + std::to_string(st.st_size) + " bytes, was " +
                                         std::to_string(size_) + "): truncated under the job"
                                   : "was replaced or modified since it was opened (its descriptor had been closed to stay within "
                                     "RLIMIT_NOFILE; another file's bytes are not read in its place)");
            }
            listed(fd);
        }
        ++state_->users;
        state_->recent.store(true, std::memory_order_relaxed);
        return lease(state_.get(), state_->fd);
    }

    std::uint64_t size() const noexcept override { return size_; }
    const std::string& path() const noexcept { return path_; }
    // As a byte source: named by its path, read with pread.
    const std::string& name() const noexcept override { return path_; }
    void read_at(void* dest, std::uint64_t length, std::uint64_t offset) const override;
    // "<size> <mtime s>.<ns> <inode>" of the open file (fstat: the file read, even if renamed over since).
    std::string version() const override {
        const lease l = use();
        struct stat st {};
        if (::fstat(l.fd(), &st) != 0) throw io_error(path_, errno, "cannot stat");
        return std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec) + " " +
               std::to_string(st.st_ino);
    }
    // Whether `o` was opened from the same inode as this file.
    bool same_inode(const file& o) const noexcept { return state_ && o.state_ && device_ == o.device_ && inode_ == o.inode_; }
    // Whether `path` leads to this file now (same device and inode): a name renamed over since says no.
    bool still_at(const std::string& path) const {
        struct stat now {};
        return state_ && ::stat(path.c_str(), &now) == 0 && now.st_ino == inode_ && now.st_dev == device_;
    }
    const file* local_file() const noexcept override { return this; }
    bool is_open() const noexcept { return state_ != nullptr; }
    // Whether its descriptor is open now (the pool may have closed it; use() opens it again).
    bool holds_descriptor() const {
        if (!state_) return false;
        const std::lock_guard lock(state_->mutex);
        return state_->fd >= 0;
    }
    bool direct() const noexcept { return state_ && state_->direct; }

    // The one mapping of this file that every mmap reader shares, made on first use (with `pattern`'s
    // readahead hint). Shared because page-table entries belong to a mapping: per-reader mappings
    // would make every worker (and every new pipeline) take its own minor fault on every page it
    // touches. Held in the file's own state, not on the heap behind a count: 40 bytes and an
    // allocation a file fewer (a mixture maps a file per domain as it first reads it). It lives as
    // long as this file (it is never replaced). Null when the process's mapping budget had no room
    // for it (detail/mapping_budget.hpp): asked once, the file then stays unmapped, and its readers
    // read it with pread (read_at). Thread-safe. Throws io_error.
    const file_mapping* mapping(access_pattern pattern) const {
        if (!state_) throw io_error(path_.empty() ? "(no file)" : path_, EBADF, "not open (moved from)");
        if (const auto m = state_->mapped.load(std::memory_order_acquire); m != not_yet) return m == made ? &state_->mapping : nullptr;
        std::lock_guard lock(state_->mapping_mutex);
        if (state_->mapped.load(std::memory_order_relaxed) == not_yet) {
            state_->mapping = file_mapping(*this, pattern);
            state_->mapped.store(state_->mapping.refused() ? refused : made, std::memory_order_release);
        }
        return state_->mapped.load(std::memory_order_relaxed) == made ? &state_->mapping : nullptr;
    }
    // That mapping if it was made, without a lock: readers that look it up once per window (a
    // mixture's thousands of files) keep no table of their own. Null before the first mapping(), and
    // when it was refused.
    const file_mapping* mapping_if_made() const noexcept {
        return state_ && state_->mapped.load(std::memory_order_acquire) == made ? &state_->mapping : nullptr;
    }

private:
    // A file's modification time as one number: nanoseconds since the epoch, modulo 2^64 (unsigned, so
    // times past 2262 or before 1678, which touch -d can set, wrap instead of overflowing). Only ever
    // compared for equality.
    static std::uint64_t modified_ns(const struct stat& st) noexcept {
        return static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
    }

    // The descriptor and what the pool knows of it, with the shared mapping (a separate lock: mapping
    // takes a lease), and what the file was opened as (set by the constructor, then only read). 56
    // bytes, and the file 72: a mixture keeps a file per domain, and the two were 64 and 88 (the
    // allocator's 64- and 96-byte chunks; now 64 and 80).
    enum mapping_state : std::uint8_t { not_yet, made, refused };
    struct shared_state : detail::pooled_descriptor {
        detail::spin_lock mapping_mutex;             // held while the mapping is made (one mmap)
        std::atomic<mapping_state> mapped{not_yet};  // read without the lock
        bool direct = false;                         // opened (and opened again) with O_DIRECT
        std::uint64_t modified = 0;                  // st_mtim when opened (modified_ns): 8 bytes, not a timespec's 16
        file_mapping mapping;                        // made: the file's; refused: empty
    };

    // Records `fd` as state_'s open descriptor (state_->mutex held) and lists it with the pool; closes
    // it if the pool cannot list it (no memory).
    void listed(int fd) const {
        state_->fd = fd;
        try {
            detail::descriptor_pool::instance().opened(*state_);
        } catch (...) {
            state_->fd = -1;
            ::close(fd);
            throw;
        }
    }

    // Opens path_ (O_DIRECT if direct) and stats it, refusing what is not a regular file. On EMFILE,
    // asks the pool to close idle descriptors and tries once more.
    int open_checked(struct stat& st) const {
        const bool direct = state_->direct;
        const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (direct ? O_DIRECT : 0);
        int fd = ::open(path_.c_str(), flags);
        if (fd < 0 && errno == EMFILE && detail::descriptor_pool::instance().make_room(state_.get()) > 0) fd = ::open(path_.c_str(), flags);
        if (fd < 0) {
            const int err = errno;
            throw io_error(path_, err,
                           std::string(direct ? "cannot open with O_DIRECT" : "cannot open") +
                               (err == EMFILE ? " (every descriptor this process may open is in use: raise ulimit -n)" : ""));
        }
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            ::close(fd);
            throw io_error(path_, err, "cannot stat");
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(fd);
            throw io_error(path_, S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                           std::string("not a regular file (") +
                               (S_ISDIR(st.st_mode)    ? "a directory"
                                : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                       : "a device or socket") +
                               ")");
        }
        // Non-blocking only to get past open(): on a regular file the flag has no use, and io_uring on
        // older kernels (and FUSE) would treat reads of uncached pages as "would block".
        if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        return fd;
    }

    void close() noexcept {
        if (!state_) return;
        const std::lock_guard lock(state_->mutex);
        if (state_->fd < 0) return;
        detail::descriptor_pool::instance().closing(*state_);
        ::close(state_->fd);
        state_->fd = -1;
    }

    std::uint64_t size_ = 0;
    std::string path_;
    dev_t device_ = 0;
    ino_t inode_ = 0;
    std::unique_ptr<shared_state> state_;  // null: default-constructed or moved from
    static_assert(sizeof(void*) != 8 || sizeof(shared_state) == 56, "a mixture keeps a file per domain (bench_mixture)");
};
static_assert(sizeof(void*) != 8 || sizeof(file) == 72, "a mixture keeps a file per domain (bench_mixture)");

namespace detail {

// Reads exactly `length` bytes at `offset` with pread, retrying EINTR and short reads. Throws
// io_error on a system error and format_error when the file ends first (truncated data).
inline void pread_exact(int fd, const std::string& path, void* dest, std::uint64_t length, std::uint64_t offset) {
    auto* out = static_cast<char*>(dest);
    std::uint64_t done = 0;
    while (done < length) {
        ssize_t n = ::pread(fd, out + done, length - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            throw io_error(path, errno, "pread failed", offset + done);
        }
        if (n == 0)
            throw format_error(path, offset + done,
                               "file ends early: needed " + std::to_string(length) + " bytes at offset " + std::to_string(offset));
        done += static_cast<std::uint64_t>(n);
    }
}

}  // namespace detail

inline void file::read_at(void* dest, std::uint64_t length, std::uint64_t offset) const {
    const lease l = use();
    detail::pread_exact(l.fd(), path_, dest, length, offset);
}

// Throws io_error naming `path` unless it is (or links to) a regular file (by stat: nothing is opened).
inline void require_regular_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw io_error(path, errno, "cannot stat");
    if (S_ISDIR(st.st_mode)) throw io_error(path, EISDIR, "is a directory where a file belongs");
    if (!S_ISREG(st.st_mode))
        throw io_error(path, EINVAL, S_ISFIFO(st.st_mode) ? "is a FIFO, not a regular file" : "is a device or socket, not a regular file");
}

// The first `n` bytes (fewer when the file is shorter) of `path` when it is a regular file; nullopt when
// it is missing, unreadable, or not a regular file (a directory, FIFO or device). Opened non-blocking:
// never blocks. For telling a file's kind by its first bytes (the tokenizer kinds' recognizers).
inline std::optional<std::string> regular_file_head(const std::string& path, std::size_t n) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return std::nullopt;
    struct stat st {};
    std::optional<std::string> head;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        head.emplace(n, '\0');
        const ssize_t got = ::pread(fd, head->data(), n, 0);
        head->resize(got > 0 ? static_cast<std::size_t>(got) : 0);
    }
    ::close(fd);
    return head;
}

// The whole of a small file (a model, a config, a log), read through one descriptor that was checked to
// be a regular file: opened non-blocking, so a FIFO or device is refused at once instead of blocking
// the open or the read forever, and a directory is refused instead of read. Throws io_error naming the
// path, also when the file holds more than `max_bytes` (a reader's memory stays bounded).
inline std::string read_regular_file(const std::string& path, std::uint64_t max_bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw io_error(path, errno, "cannot open");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        const int err = errno;
        ::close(fd);
        if (st.st_mode == 0) throw io_error(path, err, "cannot stat");
        throw io_error(path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
                       S_ISDIR(st.st_mode)    ? "is a directory where a file belongs"
                       : S_ISFIFO(st.st_mode) ? "is a FIFO, not a regular file"
                                              : "is a device or socket, not a regular file");
    }
    if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
        ::close(fd);
        throw io_error(path, EFBIG,
                       std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) + " this file may hold");
    }
    std::string out(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            throw io_error(path, err, "read failed", done);
        }
        if (n == 0) break;
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    out.resize(done);  // shrank while read: what is there
    return out;
}

}  // namespace feedline
