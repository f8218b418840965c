// feedline/storage/remote_counters.hpp: what remote reads cost this process, counted where requests are
// made (remote/s3_client.hpp) and read by the pipeline's stats (pipeline/stats.hpp) as the difference
// between two snapshots, so a pipeline reports its own requests. Process-wide: byte sources are shared
// by pipelines, and a request serves whoever asked. Also where a long remote read learns that the
// thread that waits on it gave up (io_cancel). Needs no HTTP client.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <utility>

namespace feedline {

// A snapshot: requests answered (any status), bytes of bodies received, attempts retried, requests
// that failed for good, and the latency of successful requests in power-of-two buckets of
// microseconds (bucket i: [2^i, 2^(i+1)) us).
struct remote_reads {
    std::uint64_t requests = 0, bytes = 0, retries = 0, failures = 0;
    std::uint64_t cache_hits = 0, cache_misses = 0;  // blocks found in the local cache, and fetched for it
    std::array<std::uint64_t, 32> latency_buckets{};

    // The latency under which `fraction` of the requests finished (the upper edge of the bucket that
    // holds it), in seconds; 0 without requests.
    double latency_quantile(double fraction) const noexcept {
        std::uint64_t total = 0;
        for (const auto n : latency_buckets) total += n;
        if (total == 0) return 0;
        const auto rank = static_cast<std::uint64_t>(fraction * static_cast<double>(total - 1));
        std::uint64_t seen = 0;
        for (std::size_t i = 0; i < latency_buckets.size(); ++i) {
            seen += latency_buckets[i];
            if (seen > rank) return static_cast<double>(std::uint64_t(2) << i) * 1e-6;
        }
        return static_cast<double>(std::uint64_t(1) << 32) * 1e-6;
    }
    // What happened between `before` and this snapshot.
    remote_reads since(const remote_reads& before) const noexcept {
        remote_reads d;
        d.requests = requests - before.requests;
        d.bytes = bytes - before.bytes;
        d.retries = retries - before.retries;
        d.failures = failures - before.failures;
        d.cache_hits = cache_hits - before.cache_hits;
        d.cache_misses = cache_misses - before.cache_misses;
        for (std::size_t i = 0; i < latency_buckets.size(); ++i) d.latency_buckets[i] = latency_buckets[i] - before.latency_buckets[i];
        return d;
    }
};

namespace detail {

// The process's counters. Relaxed atomics: a snapshot is a set of counts, not a consistent cut.
class remote_counters {
public:
    static remote_counters& instance() noexcept {
        static remote_counters c;
        return c;
    }
    void answered(std::uint64_t bytes, std::uint64_t microseconds) noexcept {
        add(requests, 1);
        add(body_bytes, bytes);
        const unsigned bucket = microseconds == 0 ? 0 : std::min<unsigned>(31, static_cast<unsigned>(std::bit_width(microseconds)) - 1);
        add(first_latency_bucket + bucket, 1);
    }
    void retried() noexcept { add(retries, 1); }
    void failed() noexcept { add(failures, 1); }
    void cached(std::uint64_t hits, std::uint64_t misses) noexcept {
        add(cache_hit_blocks, hits);
        add(cache_miss_blocks, misses);
    }
    remote_reads snapshot() const noexcept {
        std::array<std::uint64_t, count> v{};
        for (std::size_t i = 0; i < count; ++i) v[i] = counts_[i].load(std::memory_order_relaxed);
        remote_reads r{v[requests], v[body_bytes], v[retries], v[failures], v[cache_hit_blocks], v[cache_miss_blocks], {}};
        std::copy(v.begin() + first_latency_bucket, v.end(), r.latency_buckets.begin());
        return r;
    }

private:
    enum : std::size_t {
        requests,
        body_bytes,
        retries,
        failures,
        cache_hit_blocks,
        cache_miss_blocks,
        first_latency_bucket,
        count = first_latency_bucket + 32
    };
    void add(std::size_t which, std::uint64_t n) noexcept { counts_[which].fetch_add(n, std::memory_order_relaxed); }
    std::array<std::atomic<std::uint64_t>, count> counts_{};
};

// Whether the thread that waits on a long read (a remote fetch that retries) has given up: the
// pipeline's workers set it to "the pipeline stopped", so stop() and a destructor are not held up by
// a slow bucket. Checked between waits of at most 100 ms; unset: never.
inline thread_local std::function<bool()> io_cancel;

// Whether this thread's remote reads bypass the local cache (feedline-doctor check measures the store,
// not the disk).
inline thread_local bool remote_cache_bypass = false;

// Requests this thread's remote reads may keep in flight at once; 0: the storage's own setting. The
// pipeline's fetch-ahead thread sets it from the measured latency and rate
// (pipeline/detail/fetch_ahead_thread.hpp); a setting the user gave (FEEDLINE_S3_MAX_REQUESTS) wins.
inline thread_local unsigned remote_requests_in_flight = 0;

// Sets io_cancel for this thread while it lives.
class scoped_io_cancel {
public:
    explicit scoped_io_cancel(std::function<bool()> cancelled) : previous_(std::exchange(io_cancel, std::move(cancelled))) {}
    ~scoped_io_cancel() { io_cancel = std::move(previous_); }
    scoped_io_cancel(const scoped_io_cancel&) = delete;
    scoped_io_cancel& operator=(const scoped_io_cancel&) = delete;

private:
    std::function<bool()> previous_;
};

}  // namespace detail
}  // namespace feedline
