// feedline/error.hpp: the exception types every stage throws.
// Storage, formats and configuration report failures here; the pipeline carries them from worker
// threads to the consumer's next() with their type intact (std::exception_ptr). Every error names
// what it was looking at (file, byte offset or field) and what it expected, so a user can act on it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace feedline {

// Base of every feedline error. what() is a complete sentence with the context folded in.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// On-disk data does not have the expected layout. Carries the file and the byte offset of the
// offending field so `xxd -s OFFSET FILE` shows it.
class format_error : public error {
public:
    format_error(std::string file, std::uint64_t offset, const std::string& message)
            : error(file + " @ byte " + std::to_string(offset) + ": " + message), file_(std::move(file)), offset_(offset) {}
    const std::string& file() const noexcept { return file_; }
    std::uint64_t offset() const noexcept { return offset_; }

private:
    std::string file_;
    std::uint64_t offset_;
};

// A system call on a file failed (open, read, write, mmap, io_uring). Keeps errno.
class io_error : public error {
public:
    io_error(std::string file, int errno_value, const std::string& message, std::optional<std::uint64_t> offset = std::nullopt)
            : error(compose(file, errno_value, message, offset)), file_(std::move(file)), errno_(errno_value), offset_(offset) {}
    const std::string& file() const noexcept { return file_; }
    int error_code() const noexcept { return errno_; }
    std::optional<std::uint64_t> offset() const noexcept { return offset_; }

private:
    static std::string compose(const std::string& file, int err, const std::string& message, std::optional<std::uint64_t> offset);
    std::string file_;
    int errno_;
    std::optional<std::uint64_t> offset_;
};

// A configuration value is invalid or two values contradict each other. Names the field.
class config_error : public error {
public:
    config_error(std::string field, const std::string& message) : error("config " + field + ": " + message), field_(std::move(field)) {}
    const std::string& field() const noexcept { return field_; }

private:
    std::string field_;
};

// A system resource ran out where feedline asked for it: memory (an address-space or cgroup limit),
// threads (a process or pids limit), file descriptors. Says which, how much, and what to change.
class resource_error : public error {
public:
    using error::error;
};

// next() stopped waiting for a batch because the consumer's wait check asked it to (see
// pipeline::set_wait_check): nothing was taken, and next() may be called again.
class wait_interrupted : public error {
public:
    wait_interrupted() : error("the wait for the next batch was interrupted") {}
};

// A CUDA runtime or library call failed. Keeps the call text and the numeric status.
class cuda_error : public error {
public:
    cuda_error(std::string call, int status, const std::string& message)
            : error(call + " failed with status " + std::to_string(status) + ": " + message), call_(std::move(call)), status_(status) {}
    const std::string& call() const noexcept { return call_; }
    int status() const noexcept { return status_; }

private:
    std::string call_;
    int status_;
};

}  // namespace feedline

#include <system_error>

inline std::string feedline::io_error::compose(const std::string& file, int err, const std::string& message,
                                               std::optional<std::uint64_t> offset) {
    std::string s = file;
    if (offset) s += " @ byte " + std::to_string(*offset);
    s += ": " + message;
    if (err != 0) s += " (" + std::generic_category().message(err) + ")";
    return s;
}
