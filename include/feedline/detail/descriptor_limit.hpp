// feedline/detail/descriptor_limit.hpp: room for a dataset's file descriptors. A dataset opens one
// descriptor per shard (a Megatron .idx is mapped and closed), so 10,000 shards want 10,000 of them;
// the default soft limit (often 1024) is far below the hard one (often 524288). Like Go's runtime,
// feedline raises the soft limit toward the hard one when it needs to; where even the hard limit is
// lower, the descriptor pool (detail/descriptor_pool.hpp) keeps the open ones within it.
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

// Makes room for `more` descriptors where the limit allows: raises the soft RLIMIT_NOFILE toward the
// hard one when the process's open descriptors, `more` and room for its others (sockets, io_uring
// rings, logs) would pass it. Never fails: past the hard limit, the descriptor pool keeps the files'
// descriptors within it (detail/descriptor_pool.hpp), closing idle ones and opening them again when
// used, which costs an open per reuse but runs (a mixture of 10,000 domains under `ulimit -n 256`).
inline void raise_descriptor_limit(std::uint64_t more) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur == lim.rlim_max) return;
    // Room for the process's other descriptors: 256, or a quarter of a small hard limit.
    const std::uint64_t headroom =
        lim.rlim_max == RLIM_INFINITY ? 256 : std::min<std::uint64_t>(256, static_cast<std::uint64_t>(lim.rlim_max) / 4);
    // Listing /proc/self/fd costs O(descriptors open), and it was done for every dataset opened:
    // 10,000 small datasets (a mixture's domains) took 16 s. So within a burst of opens (the last
    // listing under 100 ms old), the count listed then plus what was asked for since bounds what is
    // open now; past that, or near the limit, the directory is listed again.
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
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? need : std::min<rlim_t>(lim.rlim_max, std::max<rlim_t>(need, lim.rlim_cur * 2));
    (void)::setrlimit(RLIMIT_NOFILE, &raised);  // refused: the pool keeps within the limit as it is
}

}  // namespace feedline::detail
