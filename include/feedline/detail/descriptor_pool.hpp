// feedline/detail/descriptor_pool.hpp: keeps the descriptors of the files feedline opens within
// RLIMIT_NOFILE. A dataset of 10,000 shards (a mixture of 10,000 small domains) would hold 10,000
// descriptors for its life; under `ulimit -n 256` it could not open at all. Instead every local file
// (storage/file.hpp) registers its descriptor here while it is open, and once the open ones reach the
// budget, the least recently used one that nobody holds (a clock sweep, as the kernel's page
// reclaim) is closed; its file opens it again on next use and checks that it is still the file it
// opened. A mapping needs no descriptor (mmap outlives the close), so a mixture read through mmap,
// the default for data in the page cache, keeps only the descriptors it is mapping at the moment.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include <feedline/detail/spin_lock.hpp>

namespace feedline::detail {

// One file's descriptor as the pool sees it. On the heap, so it stays put when its file is moved.
// 16 bytes: a mixture has a file per domain, thousands of them.
struct pooled_descriptor {
    static constexpr std::uint32_t unlisted = ~std::uint32_t{0};
    // Guards fd and users (held by whoever opens, leases or closes it). One byte, not a std::mutex's
    // 40 (detail/spin_lock.hpp).
    spin_lock mutex;
    std::atomic<bool> recent{false};  // leased since the clock last passed it
    int fd = -1;
    unsigned users = 0;               // leases held now: never closed while > 0
    std::uint32_t slot = unlisted;    // its place in the pool's list while open (the pool's mutex)
};

class descriptor_pool {
public:
    // Never destroyed: files in static storage may close after every other static is gone.
    static descriptor_pool& instance() {
        static auto* const pool = new descriptor_pool;
        return *pool;
    }

    // The descriptors the files may hold open together: the soft RLIMIT_NOFILE less room for the
    // process's others (sockets, io_uring rings, logs, pipes), at least 8.
    static std::size_t budget() {
        rlimit lim{};
        if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return std::size_t{1} << 20;
        const auto soft = static_cast<std::uint64_t>(lim.rlim_cur);
        const std::uint64_t room = std::min<std::uint64_t>(256, soft / 4);
        return static_cast<std::size_t>(std::max<std::uint64_t>(8, soft - room));
    }

    // `d` (its mutex held by the caller) has just opened its descriptor: listed, and while more than
    // the budget are open, idle ones of other files are closed.
    // Throws std::bad_alloc (nothing listed then).
    void opened(pooled_descriptor& d) {
        int idle[close_batch];
        std::size_t n = 0;
        {
            const std::lock_guard lock(mutex_);
            open_.push_back(&d);
            d.slot = static_cast<std::uint32_t>(open_.size() - 1);
            d.recent.store(true, std::memory_order_relaxed);
            const std::size_t limit = budget();
            while (open_.size() > limit && n < close_batch) {
                const int fd = take_one_idle(&d);
                if (fd < 0) break;  // every other one in use: over the budget for now
                idle[n++] = fd;
            }
        }
        close_all(idle, n);  // outside the lock: a close can be a round trip (NFS)
    }

    // `d` (its mutex held by the caller) is about to close its descriptor.
    void closing(pooled_descriptor& d) {
        const std::lock_guard lock(mutex_);
        unlist(d);
    }

    // An open failed with EMFILE: closes idle descriptors (half of those open, at least one) other
    // than `self`'s. Returns how many were closed.
    std::size_t make_room(const pooled_descriptor* self) {
        std::vector<int> idle;
        {
            const std::lock_guard lock(mutex_);
            for (const std::size_t want = std::max<std::size_t>(1, open_.size() / 2); idle.size() < want;) {
                const int fd = take_one_idle(self);
                if (fd < 0) break;
                idle.push_back(fd);
            }
        }
        close_all(idle.data(), idle.size());
        return idle.size();
    }

    // Descriptors open now through the pool.
    std::size_t open_count() {
        const std::lock_guard lock(mutex_);
        return open_.size();
    }

private:
    void unlist(pooled_descriptor& d) {
        if (d.slot == pooled_descriptor::unlisted) return;
        open_[d.slot] = open_.back();
        open_[d.slot]->slot = d.slot;
        open_.pop_back();
        d.slot = pooled_descriptor::unlisted;
        if (hand_ >= open_.size()) hand_ = 0;
    }

    static void close_all(const int* fds, std::size_t n) noexcept {
        for (std::size_t i = 0; i < n; ++i) ::close(fds[i]);
    }

    // The clock: from the hand, a descriptor used since the hand last passed gets another round; the
    // first one not used since and not leased now (its mutex free: try_lock, since the lock order is a
    // file's mutex then the pool's) is taken from its file, which opens another when used again.
    // Returns it for the caller to close (-1: none idle). Two rounds at most. Caller holds mutex_.
    int take_one_idle(const pooled_descriptor* keep) {
        for (std::size_t looked = 0, n = open_.size(); looked < 2 * n && !open_.empty(); ++looked) {
            if (hand_ >= open_.size()) hand_ = 0;
            pooled_descriptor* c = open_[hand_];
            if (c == keep || c->recent.exchange(false, std::memory_order_relaxed)) {
                ++hand_;
                continue;
            }
            std::unique_lock held(c->mutex, std::try_to_lock);
            if (!held.owns_lock() || c->users > 0) {
                ++hand_;
                continue;
            }
            unlist(*c);  // the hand now points at the descriptor moved into c's place
            return std::exchange(c->fd, -1);
        }
        return -1;
    }

    static constexpr std::size_t close_batch = 16;  // descriptors one open closes at most

    std::mutex mutex_;
    std::vector<pooled_descriptor*> open_;  // the descriptors open now, each at its slot
    std::size_t hand_ = 0;
};

}  // namespace feedline::detail
