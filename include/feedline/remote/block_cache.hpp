// feedline/remote/block_cache.hpp: blocks of remote objects kept on local disk under a hard byte budget,
// shared by every process of a node that names the same directory (the ranks of a job, the next run).
// A block is one immutable file, published whole by rename and checked (a trailer with its index,
// length, object identity and CRC-32C) the first time a process maps it, so a killed writer or a torn
// disk never serves wrong bytes: a file that does not check out is a miss. A process maps the blocks
// it reads; another process evicting one (unlink) leaves that mapping valid. Space is reserved before a
// block is written, under a lock held only for the accounting (never across a download), and the
// least recently used blocks are evicted to make room, so the files never exceed the budget. Only files
// this cache writes are ever deleted: names of its own pattern, inside its own marked directory.
// Used by the S3 object (remote/s3_scheme.hpp); needs no HTTP client.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/crc.hpp>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/storage/guarded_copy.hpp>
#include <feedline/storage/mmap_reader.hpp>

namespace feedline {

// A block's bytes in memory, and what keeps them there (a mapping of its file, or the buffer it was
// fetched into).
struct cached_block {
    std::span<const std::byte> bytes;
    std::shared_ptr<const void> owner;
};

namespace detail {

// 128 bits of FNV-1a (two 64-bit lanes with different offsets) as 32 hex digits: a stable name for an
// object's identity across builds and processes (std::hash is neither).
inline std::string identity_hash(std::string_view text) {
    std::uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
    for (const char c : text) {
        a = (a ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
        b = (b ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
        b ^= b >> 29;
    }
    char out[33];
    std::snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
    return out;
}

// The trailer after a block's bytes: what the file is, checked before any byte of it is served.
struct block_trailer {
    char magic[8] = {'F', 'L', 'B', 'L', 'O', 'C', 'K', '1'};
    std::uint64_t index = 0, length = 0;
    char identity[32] = {};
    std::uint32_t crc = 0, reserved = 0;
};
static_assert(sizeof(block_trailer) == 64, "the trailer's layout is part of the cache's format");

// CRC-32C (Castagnoli) of the bytes: the SSE4.2 instruction where the CPU has it (about 8 bytes a
// cycle, so checking a 1 MiB block costs ~0.1 ms), else boost's table-driven code. Both give the
// same value (tested against the standard check value of "123456789", 0xE3069283).
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_sse42(const std::byte* p, std::size_t n) noexcept {
    std::uint64_t c = 0xFFFFFFFFu;
    for (; n >= 8; p += 8, n -= 8) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
    }
    auto c32 = static_cast<std::uint32_t>(c);
    for (; n > 0; ++p, --n) c32 = __builtin_ia32_crc32qi(c32, static_cast<unsigned char>(*p));
    return ~c32;
}
#endif

inline std::uint32_t crc32c_portable(std::span<const std::byte> bytes) noexcept {
    boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
    crc.process_bytes(bytes.data(), bytes.size());
    return crc.checksum();
}

inline std::uint32_t crc32c_of(std::span<const std::byte> bytes) noexcept {
#if defined(__x86_64__)
    static const bool sse42 = __builtin_cpu_supports("sse4.2");
    if (sse42) return crc32c_sse42(bytes.data(), bytes.size());
#endif
    return crc32c_portable(bytes);
}

}  // namespace detail

class block_cache {
public:
    struct options {
        std::string directory;           // the cache's own directory (made, and marked, if missing)
        std::uint64_t budget_bytes = 0;  // the files never hold more
        std::uint64_t block_bytes = 1 << 20;
    };
    // What this cache did, for stats.
    struct counts {
        std::uint64_t hits = 0, misses = 0, inserted = 0, refused = 0, evicted = 0, invalid = 0;
    };

    // Makes the directory (and its marker) when missing. Throws io_error naming it when it cannot be
    // made or holds a file named like the marker that is not one (not feedline's directory).
    explicit block_cache(options o) : o_(std::move(o)) {
        if (o_.block_bytes < 4096 || (o_.block_bytes & (o_.block_bytes - 1)) != 0)
            throw config_error("FEEDLINE_S3_CACHE_BLOCK_BYTES",
                               "must be a power of two of at least 4096, got " + std::to_string(o_.block_bytes));
        std::error_code ec;
        std::filesystem::create_directories(o_.directory + "/blocks", ec);
        if (ec) throw io_error(o_.directory, ec.value(), "cannot make the remote cache's directory");
        const std::string marker = o_.directory + "/" + std::string(marker_name);
        const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            const bool ok = ::write(fd, marker_text.data(), marker_text.size()) == static_cast<ssize_t>(marker_text.size());
            ::close(fd);
            if (!ok) throw io_error(marker, errno, "cannot write the remote cache's marker");
        } else if (errno != EEXIST || read_regular_file(marker, 4096) != marker_text) {
            throw io_error(marker, errno == EEXIST ? EEXIST : errno,
                           "is not feedline's remote cache marker: the directory is not feedline's (choose another FEEDLINE_CACHE_DIR)");
        }
        ledger_fd_ = ::open((o_.directory + "/ledger").c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (ledger_fd_ < 0) throw io_error(o_.directory + "/ledger", errno, "cannot open the remote cache's ledger");
    }
    ~block_cache() { ::close(ledger_fd_); }
    block_cache(const block_cache&) = delete;
    block_cache& operator=(const block_cache&) = delete;

    std::uint64_t block_bytes() const noexcept { return o_.block_bytes; }
    std::uint64_t budget_bytes() const noexcept { return o_.budget_bytes; }
    const std::string& directory() const noexcept { return o_.directory; }
    counts snapshot() const {
        std::lock_guard lock(mutex_);
        return counts_;
    }

    // Block `index` (of `length` bytes) of the object whose identity hashes to `object`, from this
    // process's mappings or its file (checked the first time); nullopt when absent or not valid.
    // Thread-safe.
    std::optional<cached_block> find(const std::string& object, std::uint64_t index, std::uint64_t length) {
        const block_key name = key_of(object, index);  // no allocation on a hit: this runs once per window
        {
            std::lock_guard lock(mutex_);
            if (auto it = mapped_.find(name); it != mapped_.end()) {
                recent_.splice(recent_.begin(), recent_, it->second.position);
                ++counts_.hits;
                return it->second.block;
            }
        }
        auto block = map_file(path_of(object, index), object, index, length);
        std::lock_guard lock(mutex_);
        if (!block) {
            ++counts_.misses;
            return std::nullopt;
        }
        ++counts_.hits;
        remember(name, *block);
        return block;
    }

    // Publishes block `index` of `object` (its bytes just fetched): space reserved under the budget
    // (evicting the least recently used blocks), written to a temporary file, renamed into place.
    // False when it cannot be kept (the budget is taken by blocks being written, or the disk refused):
    // the caller serves the bytes it has. Thread-safe; never throws for a disk problem.
    bool insert(const std::string& object, std::uint64_t index, std::span<const std::byte> bytes) {
        const std::string final_path = path_of(object, index);
        const std::uint64_t size = bytes.size() + sizeof(detail::block_trailer);
        if (size > o_.budget_bytes) return refuse();
        std::error_code ec;
        std::filesystem::create_directories(final_path.substr(0, final_path.rfind('/')), ec);
        const std::string temp = final_path + ".tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
        int fd = -1;
        {
            ledger_lock held(*this);
            if (!held) return refuse();
            struct stat st {};
            if (::stat(final_path.c_str(), &st) == 0) return true;  // another process published it meanwhile
            std::uint64_t used = read_ledger();
            if (used + size > o_.budget_bytes) used = evict(o_.budget_bytes - size - (o_.budget_bytes - size) / 5);
            if (used + size > o_.budget_bytes) return refuse();
            fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
            // The space is taken now, under the lock: what the directory holds is what the ledger says.
            if (fd < 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(size)) != 0) {
                if (fd >= 0) ::close(fd), ::unlink(temp.c_str());
                return refuse();
            }
            write_ledger(used + size);
        }
        detail::block_trailer t;
        t.index = index;
        t.length = bytes.size();
        std::memcpy(t.identity, object.data(), std::min(object.size(), sizeof t.identity));
        t.crc = detail::crc32c_of(bytes);
        const bool written = write_all(fd, bytes.data(), bytes.size(), 0) && write_all(fd, &t, sizeof t, bytes.size());
        ::close(fd);
        // Published without replacing: when another thread or process published the block meanwhile,
        // its copy stays and this one's reservation is given back, so the ledger stays exact. Renamed
        // or removed under the lock, as the reservation was: a scan of the directory (evict) running
        // meanwhile could otherwise miss the file in both names, or count it after its reservation was
        // given back, and set the ledger below what the files hold; later inserts would then exceed the
        // budget by that much.
        int published = -1;
        bool someone_else = false;
        {
            ledger_lock held(*this);
            if (written) published = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str(), RENAME_NOREPLACE);
            if (published != 0 && written && errno == EINVAL) published = ::rename(temp.c_str(), final_path.c_str());  // no NOREPLACE here
            if (published != 0) {
                someone_else = written && errno == EEXIST;
                ::unlink(temp.c_str());
                if (held) {
                    const std::uint64_t used = read_ledger();
                    write_ledger(used > size ? used - size : 0);
                }
            }
        }
        if (published != 0) return someone_else || refuse();
        std::lock_guard lock(mutex_);
        ++counts_.inserted;
        return true;
    }

    // The bytes the cache's files hold, as the ledger says.
    std::uint64_t used_bytes() {
        ledger_lock held(*this);
        return read_ledger();
    }

    // The ledger against the directory, read under the lock (no publish or eviction meanwhile): the
    // bytes the ledger says and the bytes the block files and live writers' temporary files hold. They
    // are equal unless something outside the cache changed the directory (or an old kernel's rename
    // replaced a block published twice, which leaves the ledger above the files). Deletes nothing.
    struct ledger_audit {
        std::uint64_t ledger_bytes = 0, file_bytes = 0;
    };
    ledger_audit audit() {
        ledger_lock held(*this);
        ledger_audit a{.ledger_bytes = read_ledger()};
        for_each_entry([&](const std::string&, const std::string& name, const struct stat& st) {
            if (is_block_name(name) || temp_writer(name) > 0) a.file_bytes += static_cast<std::uint64_t>(st.st_size);
        });
        return a;
    }

    // Every block file, checked: how many there are and how many do not check out (for tests and
    // `feedline-doctor`). Does not map them for reading.
    std::pair<std::size_t, std::size_t> verify_all() {
        std::size_t files = 0, bad = 0;
        for_each_entry([&](const std::string& path, const std::string& name, const struct stat&) {
            if (!is_block_name(name)) return;
            ++files;
            const std::string object = name.substr(0, 32);
            const std::uint64_t index = std::stoull(name.substr(33, name.size() - 33 - 4));
            if (!map_file(path, object, index, std::nullopt)) ++bad;
        });
        return {files, bad};
    }

    static constexpr std::string_view marker_name = "FEEDLINE-REMOTE-CACHE";

    // A block by its object's 128-bit identity (two halves of the hash) and its index: a name for
    // immutable bytes, so a table of blocks keyed by it is never stale.
    struct block_key {
        std::uint64_t high = 0, low = 0, index = 0;
        friend bool operator==(const block_key&, const block_key&) = default;
    };
    struct block_key_hash {
        std::size_t operator()(const block_key& k) const noexcept { return k.low ^ (k.index * 0x9E3779B97F4A7C15ull); }
    };
    static block_key key_of(const std::string& object, std::uint64_t index) noexcept {
        auto half = [&](std::size_t from) {
            std::uint64_t v = 0;
            for (std::size_t i = from; i < from + 16 && i < object.size(); ++i) {
                const char c = object[i];
                v = v << 4 | static_cast<std::uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
            }
            return v;
        };
        return {half(0), half(16), index};
    }

private:
    static constexpr std::string_view marker_text = "feedline remote block cache, format 1: blocks/<2>/<object>.<index>.blk\n";
    static constexpr std::size_t max_mapped = 8192;  // blocks mapped at once (vm.max_map_count is 65530)

    struct mapped_entry {
        cached_block block;
        std::list<block_key>::iterator position;
    };

    // The ledger's lock while it lives: flock for the other processes sharing the directory, and a
    // mutex for this process's other threads (flock does not exclude threads that share the
    // descriptor: two would both "hold" it and lose each other's updates).
    class ledger_lock {
    public:
        explicit ledger_lock(const block_cache& c) : threads_(c.ledger_mutex_), fd_(c.ledger_fd_) {
            while ((ok_ = ::flock(fd_, LOCK_EX) == 0) == false && errno == EINTR) {
            }
        }
        ~ledger_lock() {
            if (ok_) ::flock(fd_, LOCK_UN);
        }
        explicit operator bool() const noexcept { return ok_; }

    private:
        std::lock_guard<std::mutex> threads_;
        int fd_;
        bool ok_ = false;
    };

    bool refuse() {
        std::lock_guard lock(mutex_);
        ++counts_.refused;
        return false;
    }
    static std::string random_suffix() {
        thread_local std::mt19937_64 r(std::random_device{}());
        char s[17];
        std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(r()));
        return s;
    }
    std::string path_of(const std::string& object, std::uint64_t index) const {
        return o_.directory + "/blocks/" + object.substr(0, 2) + "/" + object + "." + std::to_string(index) + ".blk";
    }
    // "<32 hex>.<index>.blk": the only names of finished blocks.
    static bool is_block_name(const std::string& n) {
        if (n.size() < 32 + 1 + 1 + 4 || n.compare(n.size() - 4, 4, ".blk") != 0 || n[32] != '.') return false;
        const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
        const auto digit = [](char c) { return c >= '0' && c <= '9'; };
        return std::all_of(n.begin(), n.begin() + 32, hex) && std::all_of(n.begin() + 33, n.end() - 4, digit);
    }
    // "<block name>.tmp-<pid>-<16 hex>": a block being written; the pid, or 0 when the name is not one.
    static pid_t temp_writer(const std::string& n) {
        const std::size_t at = n.find(".blk.tmp-");
        if (at == std::string::npos || !is_block_name(n.substr(0, at + 4))) return 0;
        const std::string rest = n.substr(at + 9);
        const std::size_t dash = rest.find('-');
        if (dash == std::string::npos || dash == 0 || rest.size() - dash - 1 != 16) return 0;
        for (std::size_t i = 0; i < dash; ++i)
            if (rest[i] < '0' || rest[i] > '9') return 0;
        return static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    }

    // With the ledger locked: what it says, or, when it says nothing (new, or damaged by hand), what
    // the directory holds (a scan that deletes nothing but dead writers' files).
    std::uint64_t read_ledger() {
        std::uint64_t v = 0;
        if (::pread(ledger_fd_, &v, sizeof v, 0) == sizeof v) return v;
        return evict(UINT64_MAX);
    }
    void write_ledger(std::uint64_t v) const { (void)!::pwrite(ledger_fd_, &v, sizeof v, 0); }
    static bool write_all(int fd, const void* p, std::size_t n, std::uint64_t at) {
        const auto* c = static_cast<const char*>(p);
        while (n > 0) {
            const ssize_t k = ::pwrite(fd, c, n, static_cast<off_t>(at));
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) return false;
            c += k, n -= static_cast<std::size_t>(k), at += static_cast<std::uint64_t>(k);
        }
        return true;
    }

    // Calls f(path, name, stat) for every regular file in blocks/<2 hex>/ (not following links).
    template <class F>
    void for_each_entry(F&& f) const {
        const std::string root = o_.directory + "/blocks";
        DIR* top = ::opendir(root.c_str());
        if (top == nullptr) return;
        while (const dirent* d = ::readdir(top)) {
            const std::string sub = d->d_name;
            if (sub.size() != 2) continue;
            DIR* inner = ::opendir((root + "/" + sub).c_str());
            if (inner == nullptr) continue;
            while (const dirent* e = ::readdir(inner)) {
                const std::string name = e->d_name, path = root + "/" + sub + "/" + name;
                struct stat st {};
                if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) f(path, name, st);
            }
            ::closedir(inner);
        }
        ::closedir(top);
    }

    // With the ledger locked: deletes the least recently used blocks (by modification time, which a
    // process refreshes when it first maps a block) until the files hold at most `target` bytes, and
    // the temporary files of writers that died. Returns what the files hold then (the ledger is set to
    // it: the directory is the truth).
    std::uint64_t evict(std::uint64_t target) {
        struct entry {
            std::string path;
            std::int64_t mtime_ns;
            std::uint64_t size;
        };
        std::vector<entry> blocks;
        std::uint64_t used = 0;
        for_each_entry([&](const std::string& path, const std::string& name, const struct stat& st) {
            const auto size = static_cast<std::uint64_t>(st.st_size);
            if (is_block_name(name)) {
                blocks.push_back({path, static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, size});
                used += size;
            } else if (const pid_t writer = temp_writer(name); writer > 0) {
                if (writer != ::getpid() && ::kill(writer, 0) != 0 && errno == ESRCH) {
                    ::unlink(path.c_str());  // a writer that died: its reservation goes with it
                } else {
                    used += size;
                }
            }  // anything else is not this cache's: never touched
        });
        std::sort(blocks.begin(), blocks.end(), [](const entry& a, const entry& b) { return a.mtime_ns < b.mtime_ns; });
        std::uint64_t evicted = 0;
        for (const entry& b : blocks) {
            if (used <= target) break;
            if (::unlink(b.path.c_str()) == 0) used -= b.size, ++evicted;
        }
        write_ledger(used);
        std::lock_guard lock(mutex_);
        counts_.evicted += evicted;
        return used;
    }

    // Maps a block file and checks its trailer (and its length, when known). nullopt when it is
    // missing or does not check out.
    std::optional<cached_block> map_file(const std::string& path, const std::string& object, std::uint64_t index,
                                         std::optional<std::uint64_t> length) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) return std::nullopt;
        struct stat st {};
        const bool regular =
            ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) > sizeof(detail::block_trailer);
        void* p = regular ? ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        ::close(fd);
        if (p == MAP_FAILED) return std::nullopt;
        const auto size = static_cast<std::size_t>(st.st_size);
        std::shared_ptr<const void> owner(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
        const std::span<const std::byte> all(static_cast<const std::byte*>(p), size);
        detail::block_trailer t;
        const std::span<const std::byte> data = all.first(size - sizeof t);
        std::uint32_t computed = 0;
        // Guarded: a file truncated by hand while mapped is a miss, not a SIGBUS.
        const bool whole = detail::guarded_copy(&t, all.data() + data.size(), sizeof t) &&
                           std::memcmp(t.magic, detail::block_trailer{}.magic, sizeof t.magic) == 0 && t.index == index &&
                           t.length == data.size() && (!length || *length == t.length) &&
                           std::memcmp(t.identity, object.data(), std::min(object.size(), sizeof t.identity)) == 0 &&
                           detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept {
                               guard.covering(data.data(), data.size());
                               computed = detail::crc32c_of(data);
                           }) &&
                           computed == t.crc;
        if (!whole) {
            std::lock_guard lock(mutex_);
            ++counts_.invalid;
            return std::nullopt;
        }
        ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recently used: evicted last
        return cached_block{data, std::move(owner)};
    }

    // With mutex_ held: keeps the mapping for later reads (the least recently used one goes).
    void remember(const block_key& name, const cached_block& block) {
        if (mapped_.count(name) != 0) return;
        recent_.push_front(name);
        mapped_.emplace(name, mapped_entry{block, recent_.begin()});
        if (mapped_.size() > max_mapped) {
            mapped_.erase(recent_.back());
            recent_.pop_back();
        }
    }

    options o_;
    int ledger_fd_ = -1;
    mutable std::mutex ledger_mutex_;  // taken before the ledger's flock, never with mutex_ held
    mutable std::mutex mutex_;
    std::unordered_map<block_key, mapped_entry, block_key_hash> mapped_;
    std::list<block_key> recent_;
    counts counts_;
};

}  // namespace feedline
