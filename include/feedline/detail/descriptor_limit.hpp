// feedline/detail/descriptor_limit.hpp: room for a dataset's file descriptors. A dataset keeps one
// descriptor per shard open for its life (a Megatron .idx is mapped and closed), so 10,000 shards need
// 10,000 of them; the default soft limit (often 1024) is far below the hard one (often 524288). Like
// Go's runtime, feedline raises the soft limit toward the hard one when it needs to, and refuses with
// the numbers when even the hard limit is too low, instead of failing at some later open with EMFILE.
#pragma once

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include <feedline/error.hpp>

namespace feedline::detail {

// Descriptors this process has open now (/proc/self/fd; 0 when it cannot be listed).
inline std::uint64_t open_descriptors() {
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return 0;
    std::uint64_t n = 0;
    while (const dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') ++n;
    ::closedir(d);
    return n > 0 ? n - 1 : 0;  // the directory's own
}

// Makes sure `more` descriptors can still be opened (with room for the process's others: sockets,
// io_uring rings, logs, the one a Megatron .idx holds while it is mapped). Raises the soft RLIMIT_NOFILE up to the hard one when needed. Throws
// resource_error naming `what`, the numbers and what to change when the hard limit is too low.
inline void reserve_descriptors(std::uint64_t more, const std::string& what) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    if (lim.rlim_cur == RLIM_INFINITY) return;
    // Room for the process's other descriptors: 256, or a quarter of a small hard limit (under
    // `ulimit -n 256`, which sets both limits, a reserve of 256 refused even a one-shard dataset).
    const std::uint64_t headroom =
        lim.rlim_max == RLIM_INFINITY ? 256 : std::min<std::uint64_t>(256, static_cast<std::uint64_t>(lim.rlim_max) / 4);
    // Listing /proc/self/fd costs O(descriptors open), and it was done for every dataset opened:
    // 10,000 small datasets (a mixture's domains) took 16 s. So within a burst of opens (the last
    // listing under 100 ms old), the count listed then plus what was reserved since bounds what is
    // open now (datasets opened since hold at most what they reserved, and the headroom covers the
    // few other descriptors a burst opens); past that, or near the limit, the directory is listed again.
    static std::mutex guard;
    static std::uint64_t listed = 0, reserved_since = 0;
    static std::chrono::steady_clock::time_point listed_at{};
    const std::lock_guard<std::mutex> lock(guard);
    const auto now = std::chrono::steady_clock::now();
    if (listed_at != std::chrono::steady_clock::time_point{} && now - listed_at < std::chrono::milliseconds(100) &&
        listed + reserved_since + more + headroom <= lim.rlim_cur) {
        reserved_since += more;
        return;
    }
    const std::uint64_t open = open_descriptors();
    listed = open;
    reserved_since = more;
    listed_at = now;
    const std::uint64_t need = open + more + headroom;
    if (need <= lim.rlim_cur) return;
    if (lim.rlim_max != RLIM_INFINITY && need > lim.rlim_max)
        throw resource_error(what + " needs " + std::to_string(more) + " file descriptors (one per shard) and this process may open " +
                             std::to_string(lim.rlim_max) + " in all (RLIMIT_NOFILE, hard), " + std::to_string(need - more) +
                             " of them in use or kept in reserve: raise the limit (ulimit -Hn, LimitNOFILE=) or merge shards");
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? need : std::min<rlim_t>(lim.rlim_max, std::max<rlim_t>(need, lim.rlim_cur * 2));
    if (::setrlimit(RLIMIT_NOFILE, &raised) != 0)
        throw resource_error(what + " needs " + std::to_string(more) + " file descriptors (one per shard); the soft RLIMIT_NOFILE of " +
                             std::to_string(lim.rlim_cur) + " could not be raised (" + std::to_string(errno) + "): raise it (ulimit -n)");
}

}  // namespace feedline::detail
