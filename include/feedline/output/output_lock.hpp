// feedline/output/output_lock.hpp: one writer at a time per output prefix, and the cleanup of what a
// killed writer left. A writer of shards (format/megatron.hpp, format/llmc.hpp, feedline-pack) holds
// an exclusive flock on "<prefix>.lock" while it writes: a second writer of the same prefix is refused
// at once, naming the holder's pid, instead of both publishing and leaving one dataset that mixes two.
// The lock file records the holder's pid and a 64-bit random token that also names every temporary
// file it creates ("<final>.tmp-<pid>-<token>"): a writer that finds the lock file of one that was
// killed (the file is there, nobody holds the lock) removes exactly the temporary files that token
// names, and nothing else. The file is removed when the writer is done.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/output/atomic_file.hpp>

namespace feedline {

namespace detail {
// "<final>.tmp-<pid>-<token>" -> true when `name` is a temporary name made with `tag` ("<pid>-<token>")
// for a final name starting with `stem` (a prefix's file name).
inline bool is_temporary_of(std::string_view name, std::string_view stem, std::string_view tag) {
    const std::string suffix = ".tmp-" + std::string(tag);
    return name.size() > stem.size() + suffix.size() && name.substr(0, stem.size()) == stem &&
           name.substr(name.size() - suffix.size()) == suffix;
}
}  // namespace detail

class output_lock {
public:
    // Takes the lock on `prefix` (creating "<prefix>.lock"). Throws io_error naming the lock file when
    // another process holds it (errno EBUSY, with its pid) or it cannot be created; a symlink or
    // anything but a regular file at that name is refused, never followed. When a killed writer's lock
    // file is found, the temporary files its token names are removed. Never blocks.
    explicit output_lock(std::string prefix) : prefix_(std::move(prefix)), path_(prefix_ + ".lock"), token_(unpredictable_suffix()) {
        for (int attempt = 0;; ++attempt) {
            fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
            if (fd_ < 0)
                throw io_error(path_, errno,
                               errno == ELOOP ? "is a symbolic link where the writer's lock file belongs; remove it"
                                              : "cannot create the writer's lock file");
            struct stat st {};
            if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
                close_fd();
                throw io_error(path_, EINVAL, "is not a regular file where the writer's lock file belongs; remove it");
            }
            if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
                const int err = errno;
                std::string holder = read_holder();
                holder = holder.substr(0, holder.find(" token"));  // "pid N"
                close_fd();
                if (err == EWOULDBLOCK)
                    throw io_error(path_, EBUSY,
                                   "another writer" + (holder.empty() ? std::string() : " (" + holder + ")") + " is writing " + prefix_ +
                                       "; wait for it to finish, or write elsewhere");
                throw io_error(path_, err, "cannot lock the writer's lock file");
            }
            // The holder we waited behind may have removed the file after we opened it: then the lock
            // is on a name nobody else will ever open. Lock again by name.
            struct stat now {};
            if (::stat(path_.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) break;
            close_fd();
            if (attempt == 16) throw io_error(path_, EBUSY, "the writer's lock file keeps being replaced");
        }
        stale_tag_ = parse_tag(read_holder());
        const std::string line = "feedline writer pid " + std::to_string(::getpid()) + " token " + token_ + "\n";
        if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) ||
            ::fsync(fd_) != 0) {
            const int err = errno;
            close_fd();
            throw io_error(path_, err, "cannot write the writer's lock file");
        }
        if (!stale_tag_.empty()) removed_ = remove_temporaries(stale_tag_);
    }
    output_lock(const output_lock&) = delete;
    output_lock& operator=(const output_lock&) = delete;
    // Removes the lock file, then releases the lock. Never throws.
    ~output_lock() {
        if (fd_ >= 0) ::unlink(path_.c_str());
        close_fd();
    }

    // What temporary names of this writer carry: "<pid>-<token>".
    std::string tag() const { return std::to_string(::getpid()) + "-" + token_; }
    const std::string& path() const noexcept { return path_; }
    // Temporary files of a killed writer that the constructor removed.
    const std::vector<std::string>& removed_temporaries() const noexcept { return removed_; }

private:
    void close_fd() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    std::string read_holder() const {
        char buf[128] = {};
        const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
        std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
        if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
        return s.rfind("feedline writer pid ", 0) == 0 ? s.substr(16) : std::string();
    }
    // "pid 123 token 0123456789abcdef" -> "123-0123456789abcdef"; empty unless well formed.
    static std::string parse_tag(const std::string& holder) {
        const auto t = holder.find(" token ");
        if (holder.rfind("pid ", 0) != 0 || t == std::string::npos) return {};
        const std::string pid = holder.substr(4, t - 4), token = holder.substr(t + 7);
        auto all = [](const std::string& s, const char* set) { return !s.empty() && s.find_first_not_of(set) == std::string::npos; };
        return all(pid, "0123456789") && token.size() == 16 && all(token, "0123456789abcdef") ? pid + "-" + token : std::string();
    }
    // Removes "<stem>*.tmp-<tag>" entries of the prefix's directory: only a writer holding this lock
    // made names with that token. Regular files only, never followed through a link.
    std::vector<std::string> remove_temporaries(const std::string& tag) const {
        namespace fs = std::filesystem;
        const fs::path p(prefix_);
        const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
        const std::string stem = p.filename().string();
        std::vector<std::string> removed;
        std::error_code ec;
        for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
            const std::string name = it->path().filename().string();
            if (!detail::is_temporary_of(name, stem, tag)) continue;
            struct stat st {};
            const std::string path = (fs::path(dir) / name).string();
            if (::lstat(path.c_str(), &st) != 0) continue;
            std::error_code ignored;
            if (S_ISREG(st.st_mode) ? ::unlink(path.c_str()) == 0 : S_ISDIR(st.st_mode) && fs::remove_all(path, ignored) > 0)
                removed.push_back(path);
        }
        if (!removed.empty()) sync_parent_directory(prefix_);
        return removed;
    }

    std::string prefix_, path_, token_, stale_tag_;
    int fd_ = -1;
    std::vector<std::string> removed_;
};

}  // namespace feedline
