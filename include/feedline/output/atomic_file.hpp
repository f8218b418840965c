// feedline/output/atomic_file.hpp: a buffered output file that appears under its final name only when
// complete. Writers of shards and caches (and tools: checkpoints, trained models) use it so an
// interrupted or failed write (signal, disk full) never leaves a file that passes validation: data goes
// to "<name>.tmp-<pid>-<random>", created with O_EXCL | O_NOFOLLOW (a name planted in a shared
// directory, or a symlink there, is never written through), is synced, renamed by commit(), and the
// directory is synced so the rename survives a crash.
#pragma once

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/error.hpp>

namespace feedline {

// 64 unpredictable bits as hex (getrandom), for temporary names another user cannot guess.
inline std::string unpredictable_suffix() {
    std::uint64_t bits = 0;
    if (::getrandom(&bits, sizeof bits, 0) != static_cast<ssize_t>(sizeof bits))
        bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(bits));
    return hex;
}

// fsync of the directory holding `path`, so a rename or unlink in it is on disk. Throws io_error.
inline void sync_parent_directory(const std::string& path) {
    std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw io_error(dir, errno, "cannot open the directory to sync it");
    const int rc = ::fsync(fd), err = errno;
    ::close(fd);
    if (rc != 0 && err != EINVAL) throw io_error(dir, err, "fsync of the directory failed");  // EINVAL: a filesystem without directory sync
}

// What tells a file a writer made from one that took its name since: its size and modification time
// to the nanosecond (a rename keeps both; rewriting or replacing it changes them; a copy made with
// `cp -a` or `rsync -a` keeps them, and is the same bytes). A shard set's manifest
// (detail/shard_manifest.hpp) records it for every file it vouches for.
struct file_identity {
    std::uint64_t bytes = 0;
    std::int64_t mtime_ns = 0;
    friend bool operator==(const file_identity&, const file_identity&) = default;
};

namespace detail {

// The identity of what is at `path` (not followed through a symlink); nullopt when nothing is there
// or it is not a regular file.
inline std::optional<file_identity> identity_of(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    return file_identity{static_cast<std::uint64_t>(st.st_size),
                         static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

}  // namespace detail

class atomic_file {
public:
    // Creates the temporary file. `tag` names it ("<final>.tmp-<tag>"): a writer holding an output
    // lock passes the lock's tag (output/output_lock.hpp), so a later writer can prove what a killed
    // one left; without one it is "<pid>-<64 random bits>". Throws io_error.
    explicit atomic_file(std::string final_path, std::size_t buffer_bytes = 1u << 20, const std::string& tag = {})
            : final_path_(std::move(final_path)),
              temp_path_(final_path_ + ".tmp-" + (tag.empty() ? std::to_string(::getpid()) + "-" + unpredictable_suffix() : tag)) {
        fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd_ < 0) throw io_error(final_path_, errno, "cannot create " + temp_path_);
        buffer_.reserve(buffer_bytes);
    }
    atomic_file(const atomic_file&) = delete;
    atomic_file& operator=(const atomic_file&) = delete;
    // Removes the temporary file unless commit() succeeded. Never throws.
    ~atomic_file() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(temp_path_.c_str());
    }

    // Appends bytes. Throws io_error naming the final path (ENOSPC: disk full, EFBIG: file size limit).
    void write(const void* data, std::size_t n) {
        const auto* p = static_cast<const char*>(data);
        if (buffer_.size() + n > buffer_.capacity()) flush();
        if (n >= buffer_.capacity()) return write_all(p, n);
        buffer_.insert(buffer_.end(), p, p + n);
        written_ += n;
    }
    std::uint64_t size() const noexcept { return written_; }
    const std::string& path() const noexcept { return final_path_; }

    // Overwrites bytes already written (e.g. a header whose counts are known only at the end).
    void write_at(std::uint64_t offset, const void* data, std::size_t n) {
        flush();
        if (::pwrite(fd_, data, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n))
            throw io_error(final_path_, errno, "pwrite failed", offset);
    }

    // Flushes, syncs and closes the temporary file without renaming it, so a writer of many shards
    // holds no descriptor per finished shard. Throws io_error.
    void close_pending() {
        if (fd_ < 0) return;
        flush();
        if (::fsync(fd_) != 0) throw io_error(final_path_, errno, "fsync failed");
        int rc = ::close(fd_);
        fd_ = -1;
        if (rc != 0) throw io_error(final_path_, errno, "close failed");
    }

    // Frees the write buffer (after close_pending(): a writer of many shards keeps no buffer per
    // finished shard). Never throws.
    void release_buffer() noexcept { std::vector<char>().swap(buffer_); }

    // Flushes, syncs, renames to the final name and syncs the directory. Throws io_error on any
    // failure (the temp file is then removed by the destructor).
    void commit() {
        close_pending();
        if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) throw io_error(final_path_, errno, "cannot rename " + temp_path_);
        committed_ = true;
        sync_parent_directory(final_path_);
    }
    const std::string& temp_path() const noexcept { return temp_path_; }
    // The identity the file will have under its final name (a rename keeps it), once close_pending()
    // or commit() ran. Throws io_error when the temporary file is gone.
    file_identity identity() const {
        auto id = detail::identity_of(committed_ ? final_path_ : temp_path_);
        if (!id) throw io_error(committed_ ? final_path_ : temp_path_, ENOENT, "the written file is gone");
        return *id;
    }

private:
    void flush() {
        write_all(buffer_.data(), buffer_.size(), /*count=*/false);
        buffer_.clear();
    }
    void write_all(const char* p, std::size_t n, bool count = true) {
        std::size_t done = 0;
        while (done < n) {
            ssize_t w = ::write(fd_, p + done, n - done);
            if (w < 0) {
                if (errno == EINTR) continue;
                throw io_error(final_path_, errno, "write failed", flushed_ + done);
            }
            done += static_cast<std::size_t>(w);
        }
        flushed_ += n;
        if (count) written_ += n;
    }

    std::string final_path_;
    std::string temp_path_;
    int fd_ = -1;
    std::vector<char> buffer_;
    std::uint64_t written_ = 0;
    std::uint64_t flushed_ = 0;
    bool committed_ = false;
};

}  // namespace feedline
