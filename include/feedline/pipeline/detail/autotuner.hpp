// feedline/pipeline/detail/autotuner.hpp: how many workers run and how far they may run ahead, decided
// from the staging ring's measured waits (the consumer's stall, the producers' wait for a free slot)
// over intervals of a few batches (thresholds in pipeline/defaults.hpp). The pipeline applies its
// decisions (park/wake workers, ring depth), which change only timing, never which batch holds what.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <feedline/device/staging_ring.hpp>
#include <feedline/pipeline/defaults.hpp>

namespace feedline::detail {

class autotuner {
public:
    // What the run is now and what it may become.
    struct knobs {
        unsigned workers = 1;   // running now
        std::size_t depth = 2;  // batches the producers may run ahead now
    };
    struct limits {
        bool tune_workers = false;  // workers = 0 in the config
        bool tune_depth = false;    // prefetch = 0 in the config
        unsigned max_workers = 1;   // threads started
        std::size_t max_depth = 2;  // ring slots allocated
    };

    static constexpr std::uint64_t every = defaults::autotune_every;  // batches per judged interval

    autotuner() = default;
    autotuner(limits l, std::chrono::steady_clock::time_point start) : limits_(l), last_(start) {}

    bool enabled() const noexcept { return limits_.tune_workers || limits_.tune_depth; }

    // Called by the consumer after its `delivered`-th batch with the ring's counters; every `every`
    // batches it judges the interval since the last judgement and returns the knobs to use from now.
    // `producer_threads`: the threads that wait for the ring's free slots (the running workers: each
    // fills its slots itself).
    //
    // - the trainer waited (> 1%) although the producers also sat waiting for room (> 10% each): the
    //   ring is too shallow for the trainer's bursts (gradient accumulation, evaluation pauses), so
    //   the depth grows by half (at least one), up to the slots the budget allocated: geometric, so a
    //   ring of 8 slots per worker is reached in a few intervals and a stall that depth does not
    //   cure reaches the worker rule soon after;
    // - the trainer waited > 5% and the producers were busy: the data side is short, one more worker;
    // - the trainer barely waited (< 0.5%) and each producer spent over half the interval waiting for
    //   room: one worker is parked (its core goes back to the trainer).
    // The first interval holds the start-up (readers opening, the first fill) and is not judged.
    knobs after_batch(std::uint64_t delivered, const ring_stats& r, knobs now, unsigned producer_threads,
                      std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now()) {
        if (!enabled() || delivered % every != 0) return now;
        const double interval = std::chrono::duration<double, std::nano>(t - last_).count();
        const double stalled = static_cast<double>(r.consumer_wait_ns - consumer_wait_);
        const double producers_waited = static_cast<double>(r.producer_wait_ns - producer_wait_);
        last_ = t;
        consumer_wait_ = r.consumer_wait_ns;
        producer_wait_ = r.producer_wait_ns;
        if (interval <= 0 || delivered == every) return now;
        const double each = interval * producer_threads;
        if (limits_.tune_depth && stalled > defaults::deepen_when_stalled * interval &&
            producers_waited > defaults::deepen_when_producers_wait * each && now.depth < limits_.max_depth)
            now.depth = std::min(limits_.max_depth, now.depth + std::max<std::size_t>(1, now.depth / 2));
        else if (limits_.tune_workers && stalled > defaults::add_worker_when_stalled * interval && now.workers < limits_.max_workers)
            ++now.workers;
        else if (limits_.tune_workers && stalled < defaults::park_when_stalled_below * interval &&
                 producers_waited > defaults::park_when_producers_wait * each && now.workers > 1)
            --now.workers;
        return now;
    }

private:
    limits limits_;
    std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
    std::uint64_t consumer_wait_ = 0, producer_wait_ = 0;
};

}  // namespace feedline::detail
