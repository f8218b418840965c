// feedline/detail/output_file.hpp: a buffered output file that appears under its final name only when
// complete. Writers of shards use it so an interrupted or failed write (signal, disk full) never leaves
// a file that passes validation: data goes to "<name>.tmp-<pid>" and is renamed by commit().
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <feedline/error.hpp>

namespace feedline::detail {

class output_file {
public:
    explicit output_file(std::string final_path, std::size_t buffer_bytes = 1u << 20)
        : final_path_(std::move(final_path)),
          temp_path_(final_path_ + ".tmp-" + std::to_string(::getpid())) {
        fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) throw io_error(final_path_, errno, "cannot create " + temp_path_);
        buffer_.reserve(buffer_bytes);
    }
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;
    // Removes the temporary file unless commit() succeeded. Never throws.
    ~output_file() {
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

    // Flushes, syncs and renames to the final name. Throws io_error on any failure (the temp file is
    // then removed by the destructor).
    void commit() {
        close_pending();
        if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
            throw io_error(final_path_, errno, "cannot rename " + temp_path_);
        committed_ = true;
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

}  // namespace feedline::detail
