// feedline/storage/fetch_ahead.hpp: ranges of remote objects fetched before a worker asks for them.
// The pipeline knows every future window (the sampler's plan), so for data in remote storage its
// fetch-ahead thread (pipeline/pipeline.hpp) requests the ranges of the steps after the ones being
// read, inside a byte budget that is part of the memory plan. Workers take their ranges from here,
// waiting for one in flight rather than requesting it twice, and read what is not here as before.
// The bytes are those a direct read gives: the same source, offset and length through the same
// read_batch (pinned to the object's ETag, through the block cache when it is on). A fetch ahead that
// fails is forgotten; the worker's own read then retries it and reports the error, naming the object.
// Sources with a local file never come here (storage/reader.hpp reads them directly).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include <feedline/storage/byte_source.hpp>
#include <feedline/storage/remote_counters.hpp>

namespace feedline {

// What a fetch-ahead did over a run (for stats): ranges and bytes workers took from it, bytes fetched
// that no worker took (read directly before they arrived), and how far ahead it was fetching.
struct fetch_ahead_counts {
    std::uint64_t taken_ranges = 0, taken_bytes = 0, fetched_bytes = 0, unused_bytes = 0;
    std::uint64_t steps_ahead = 0, requests_in_flight = 0;
};

class fetch_ahead {
public:
    // `first_unclaimed`: the first step no worker has taken yet (a pipeline's claim counter). Ranges of
    // steps before it are not kept: their worker may have written the step already.
    explicit fetch_ahead(std::uint64_t budget_bytes, std::function<std::uint64_t()> first_unclaimed = {})
            : budget_(budget_bytes), first_unclaimed_(std::move(first_unclaimed)) {}
    fetch_ahead(const fetch_ahead&) = delete;
    fetch_ahead& operator=(const fetch_ahead&) = delete;

    std::uint64_t budget_bytes() const noexcept { return budget_; }
    // Bytes that may be fetched ahead now.
    std::uint64_t room() const {
        std::lock_guard lock(mutex_);
        return budget_ - std::min(budget_, held_);
    }

    // The fetch-ahead thread: reads `ranges` (their dest is ignored), the ranges of `step` onwards, all
    // at once, and keeps them for the workers. Blocks for the fetch. The caller keeps within room().
    struct planned {
        std::uint64_t step;
        read_request range;
    };
    void fetch(std::span<const planned> ranges) {
        if (ranges.empty()) return;
        // Entries and buffers made before the lock, so linking them cannot fail half-way (a worker
        // would wait on an entry nobody fetches).
        std::vector<std::shared_ptr<entry>> made;
        made.reserve(ranges.size());
        for (const planned& p : ranges) {
            auto e = std::make_shared<entry>();
            e->step = p.step;
            e->range = p.range;
            e->bytes.reset(new std::byte[p.range.length]);
            e->range.dest = e->bytes.get();
            made.push_back(std::move(e));
        }
        std::vector<std::shared_ptr<entry>> fetching;
        std::vector<read_request> requests;
        fetching.reserve(made.size());
        requests.reserve(made.size());
        {
            std::lock_guard lock(mutex_);
            // Read under the lock: a worker claims a step before its step_done() takes the lock, so a
            // step done already is seen as claimed here, and one done later drops what is linked now.
            const std::uint64_t first = first_unclaimed_ ? first_unclaimed_() : 0;
            try {
                for (auto& e : made) {
                    if (e->step < first) continue;
                    entries_.emplace(key_of(e->range), e);
                    fetching.push_back(e);
                    held_ += e->range.length;
                    by_step_[e->step].push_back(e);
                    requests.push_back(e->range);
                }
            } catch (...) {  // out of memory linking: undo, so nobody waits for these
                for (const auto& e : fetching) drop(e);
                sync_sizes();
                throw;
            }
            sync_sizes();
        }
        bool ok = true;
        try {
            detail::read_through_sources(requests);
        } catch (...) {
            ok = false;  // forgotten: each worker reads its own ranges and reports what fails
        }
        // Ranges the read left in a local cache (whole blocks were fetched for them) are served from
        // there: keeping a copy too would only hold budget.
        std::vector<char> local(fetching.size(), 0);
        if (ok)
            for (std::size_t i = 0; i < fetching.size(); ++i) {
                const read_request& r = fetching[i]->range;
                try {
                    local[i] = r.source->at_hand(r.offset, r.length) ? 1 : 0;
                } catch (...) {
                }
            }
        std::lock_guard lock(mutex_);
        for (std::size_t i = 0; i < fetching.size(); ++i) {
            const auto& e = fetching[i];
            e->state = ok ? phase::ready : phase::failed;
            if (ok) fetched_bytes_ += e->range.length;
            if (local[i]) {
                e->state = phase::failed;  // dropped without counting as unused: the cache serves it
                drop(e);
            } else if (!ok || e->orphan) {
                drop(e);
            }
        }
        sync_sizes();
        changed_.notify_all();
    }

    // A worker: copies every request found here into its dest (waiting for those still in flight);
    // the others are appended to `rest`, to be read directly.
    void take(std::span<const read_request> requests, std::vector<read_request>& rest) {
        if (entries_held_.load(std::memory_order_acquire) == 0) {  // nothing fetched ahead (a warm cache): no lock per window
            rest.insert(rest.end(), requests.begin(), requests.end());
            return;
        }
        for (const read_request& r : requests) {
            std::shared_ptr<entry> e;
            {
                std::unique_lock lock(mutex_);
                for (;;) {
                    e = find(r);
                    if (!e || e->state != phase::in_flight) break;
                    if (detail::io_cancel && detail::io_cancel()) {  // the pipeline stopped: read directly, which gives up too
                        e.reset();
                        break;
                    }
                    changed_.wait_for(lock, std::chrono::milliseconds(100));
                }
                if (e) {
                    unlink(e);
                    ++taken_ranges_;
                    taken_bytes_ += r.length;
                }
            }
            if (!e) {
                rest.push_back(r);
                continue;
            }
            std::memcpy(r.dest, e->bytes.get(), r.length);  // unlinked: nothing frees it meanwhile
        }
    }

    // Step `step` was written: what was fetched for it and not taken (its worker read it directly
    // first) is dropped.
    void step_done(std::uint64_t step) {
        if (steps_held_.load(std::memory_order_acquire) == 0) return;
        std::lock_guard lock(mutex_);
        const auto it = by_step_.find(step);
        if (it == by_step_.end()) return;
        for (const auto& weak : it->second)
            if (auto e = weak.lock(); e && e->linked) {
                if (e->state == phase::in_flight)
                    e->orphan = true;  // dropped when its fetch ends
                else
                    drop(e);
            }
        by_step_.erase(it);
        sync_sizes();
        changed_.notify_all();
    }

    // How far ahead the thread fetches, for stats.
    void note_depth(std::uint64_t steps, std::uint64_t in_flight) {
        std::lock_guard lock(mutex_);
        steps_ahead_ = steps;
        requests_in_flight_ = in_flight;
    }
    fetch_ahead_counts counts() const {
        std::lock_guard lock(mutex_);
        return {taken_ranges_, taken_bytes_, fetched_bytes_, unused_bytes_, steps_ahead_, requests_in_flight_};
    }

private:
    enum class phase { in_flight, ready, failed };
    struct entry {
        std::uint64_t step = 0;
        read_request range;
        std::unique_ptr<std::byte[]> bytes;
        phase state = phase::in_flight;
        bool linked = true;  // still in entries_
        bool orphan = false;
    };
    struct range_key {
        const byte_source* source;
        std::uint64_t offset, length;
        bool operator==(const range_key&) const = default;
    };
    struct range_key_hash {
        std::size_t operator()(const range_key& k) const noexcept {
            std::uint64_t h = reinterpret_cast<std::uintptr_t>(k.source) * 0x9E3779B97F4A7C15ull;
            h ^= (k.offset + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2));
            h ^= (k.length + 0x8CB92BA72F3D8DD7ull + (h << 6) + (h >> 2));
            return static_cast<std::size_t>(h);
        }
    };
    static range_key key_of(const read_request& r) noexcept { return {r.source, r.offset, r.length}; }

    // With mutex_ held. The entry for `r` that has not failed (the same range may be planned for
    // several steps: any of them serves, the bytes are the same).
    std::shared_ptr<entry> find(const read_request& r) {
        auto [first, last] = entries_.equal_range(key_of(r));
        for (auto it = first; it != last; ++it)
            if (it->second->state != phase::failed) return it->second;
        return nullptr;
    }
    void unlink(const std::shared_ptr<entry>& e) {
        auto [first, last] = entries_.equal_range(key_of(e->range));
        for (auto it = first; it != last; ++it)
            if (it->second == e) {
                entries_.erase(it);
                break;
            }
        entries_held_.store(entries_.size(), std::memory_order_release);
        e->linked = false;
        held_ -= e->range.length;
    }
    void drop(const std::shared_ptr<entry>& e) {
        if (!e->linked) return;
        unlink(e);
        if (e->state == phase::ready) unused_bytes_ += e->range.length;
        e->bytes.reset();
    }
    void sync_sizes() {
        entries_held_.store(entries_.size(), std::memory_order_release);
        steps_held_.store(by_step_.size(), std::memory_order_release);
    }

    const std::uint64_t budget_;
    const std::function<std::uint64_t()> first_unclaimed_;
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::unordered_multimap<range_key, std::shared_ptr<entry>, range_key_hash> entries_;
    std::map<std::uint64_t, std::vector<std::weak_ptr<entry>>> by_step_;
    std::uint64_t held_ = 0;
    // Sizes of entries_ and by_step_, written under mutex_: a worker that finds nothing fetched ahead
    // takes no lock. An entry is counted before fetch() reads it, so a take() that sees 0 misses
    // nothing it could wait for.
    std::atomic<std::size_t> entries_held_{0}, steps_held_{0};
    std::uint64_t taken_ranges_ = 0, taken_bytes_ = 0, fetched_bytes_ = 0, unused_bytes_ = 0, steps_ahead_ = 0, requests_in_flight_ = 0;
};

namespace detail {

// The fetch-ahead this thread's reads take from first (a pipeline's worker sets it), or nullptr.
inline thread_local fetch_ahead* current_fetch_ahead = nullptr;

// Reads requests of sources without a local file: from this thread's fetch-ahead what it holds, the
// rest through their sources (read_through_sources). What the readers call for them.
inline void read_remote(std::span<const read_request> requests) {
    if (current_fetch_ahead == nullptr || requests.empty()) {
        read_through_sources(requests);
        return;
    }
    thread_local std::vector<read_request> rest;
    rest.clear();
    current_fetch_ahead->take(requests, rest);
    read_through_sources(rest);
}

class scoped_fetch_ahead {
public:
    explicit scoped_fetch_ahead(fetch_ahead* f) : previous_(std::exchange(current_fetch_ahead, f)) {}
    ~scoped_fetch_ahead() { current_fetch_ahead = previous_; }
    scoped_fetch_ahead(const scoped_fetch_ahead&) = delete;
    scoped_fetch_ahead& operator=(const scoped_fetch_ahead&) = delete;

private:
    fetch_ahead* previous_;
};

}  // namespace detail

}  // namespace feedline
