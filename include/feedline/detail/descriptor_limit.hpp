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
#include <cstdint>
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
    constexpr std::uint64_t headroom = 256;
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    const std::uint64_t need = open_descriptors() + more + headroom;
    if (lim.rlim_cur == RLIM_INFINITY || need <= lim.rlim_cur) return;
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
