// feedline/pipeline/detail/fetch_ahead_thread.hpp: the thread that fetches the ranges of steps the
// workers have not reached yet, for data in remote storage (storage/fetch_ahead.hpp keeps them for the
// workers). It plans with a sampler of its own, started where the pipeline starts, so its steps are
// the workers' steps exactly; a range it fetches is one a worker will ask for.
//
// How far ahead, and how many requests at once, follow what it measures: a fetch of the next steps
// takes `latency` seconds and the workers take `rate` steps a second, so it keeps about
// 2 x latency x rate steps requested ahead (at least 2; at most what the byte budget holds), and
// each fetch has all of its ranges in flight together. It starts 2 steps ahead, so start-up sends no
// storm of requests, and grows as the measurements come in. It is only ever a head start: a worker
// that gets to a step first reads it itself, and a failed fetch ahead is left to the worker's read.
// Used by pipeline/pipeline.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <feedline/detail/thread_name.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/remote_counters.hpp>

namespace feedline::detail {

// How far ahead to fetch, from the measured fetch time and the rate the workers take steps (EWMAs).
class fetch_pacing {
public:
    static constexpr std::uint64_t first_steps = 2;
    void fetched(double seconds) noexcept { latency_s_ = latency_s_ == 0 ? seconds : 0.7 * latency_s_ + 0.3 * seconds; }
    // The workers' next step at time `now_s`; a rate is taken over at least 20 ms.
    void claimed(std::uint64_t step, double now_s) noexcept {
        if (last_s_ < 0) {
            last_s_ = now_s, last_step_ = step;
            return;
        }
        if (now_s - last_s_ < 0.02) return;
        const double rate = static_cast<double>(step - last_step_) / (now_s - last_s_);
        steps_per_s_ = steps_per_s_ == 0 ? rate : 0.7 * steps_per_s_ + 0.3 * rate;
        last_s_ = now_s, last_step_ = step;
    }
    // Steps to keep requested ahead of the workers, at most `most`.
    std::uint64_t steps(std::uint64_t most) const noexcept {
        const double want = std::ceil(2 * latency_s_ * steps_per_s_) + 1;
        const auto n = want >= static_cast<double>(most) ? most : static_cast<std::uint64_t>(want);
        return std::clamp<std::uint64_t>(n, std::min(first_steps, most), most);
    }
    double latency_s() const noexcept { return latency_s_; }
    double steps_per_s() const noexcept { return steps_per_s_; }

private:
    double latency_s_ = 0, steps_per_s_ = 0, last_s_ = -1;
    std::uint64_t last_step_ = 0;
};

class fetch_ahead_thread {
public:
    struct options {
        std::vector<const batch_source*> sources;       // the pipeline's, in its order (a plan's dataset ids)
        source_context context;                         // as the workers' sources see the run
        std::uint64_t fixed_steps = 0;                  // steps ahead as set (shards.fetch_ahead); 0: paced by measurement
        std::uint64_t end_step = 0;                     // the step the run ends before; 0: none
        std::function<std::uint64_t()> next_unclaimed;  // the next step a worker will take
        std::function<bool()> stopped;                  // the pipeline is closed, or every step was planned
    };

    // `planner`: a sampler set to the step the workers start at.
    fetch_ahead_thread(std::unique_ptr<sampler> planner, options o, fetch_ahead& store)
            : planner_(std::move(planner)), o_(std::move(o)), store_(store), thread_([this] { run(); }) {}
    ~fetch_ahead_thread() { join(); }
    fetch_ahead_thread(const fetch_ahead_thread&) = delete;
    fetch_ahead_thread& operator=(const fetch_ahead_thread&) = delete;

    // Returns within ~100 ms of stopped() turning true (a fetch gives up then, as a worker's does).
    void join() {
        if (thread_.joinable()) thread_.join();
    }

private:
    void run() noexcept {
        const auto start = std::chrono::steady_clock::now();
        const auto now_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
        try {
            name_this_thread("feedline-fetch");
            const scoped_io_cancel cancel(o_.stopped);
            fetch_pacing pacing;
            std::vector<std::vector<std::uint32_t>> rows_of(o_.sources.size());
            std::vector<read_request> ranges;
            std::vector<fetch_ahead::planned> group;
            std::uint64_t step_bytes = 0;                 // the last planned step's, for the budget's step count
            std::uint64_t next = planner_->state().step;  // the first step not fetched (or found at hand) yet
            std::uint64_t idle = 0;                       // steps in a row with nothing to fetch (a warm cache)
            while (!o_.stopped()) {
                const std::uint64_t claimed = o_.next_unclaimed();
                pacing.claimed(claimed, now_s());
                const std::uint64_t most = step_bytes ? std::max<std::uint64_t>(1, store_.budget_bytes() / step_bytes) : 1;
                const std::uint64_t ahead = o_.fixed_steps ? std::min(o_.fixed_steps, most) : pacing.steps(most);
                std::uint64_t target = claimed + ahead;
                if (o_.end_step) target = std::min(target, o_.end_step);
                next = std::max(next, claimed);  // a worker has the steps before
                if (idle >= dormant_after) {
                    // Everything was at hand for a while: look at the farthest step only, now and then,
                    // rather than spend a core checking each step the workers serve from the cache.
                    std::this_thread::sleep_for(std::chrono::milliseconds(dormant_sleep_ms));
                    next = std::max(next, target > 0 ? target - 1 : 0);
                }
                group.clear();
                const std::uint64_t room = store_.room();
                std::uint64_t bytes = 0;
                // At most max_in_flight ranges a fetch: what is in flight at once, and a bound on what a
                // read through the block cache downloads at once (whole blocks).
                while (next < target && group.size() < max_in_flight && !o_.stopped()) {
                    const batch_plan& plan = plan_of(next);
                    ranges.clear();
                    ranges_of(plan, rows_of, ranges);
                    if (ranges.empty()) {
                        ++idle, ++next;
                        continue;
                    }
                    std::uint64_t b = 0;
                    for (const auto& r : ranges) b += r.length;
                    step_bytes = b;
                    if (bytes + b > room || (!group.empty() && group.size() + ranges.size() > max_in_flight)) break;  // next time
                    for (const auto& r : ranges) group.push_back({next, r});
                    bytes += b;
                    idle = 0, ++next;
                }
                if (group.empty()) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // until the workers move on, or room frees
                    continue;
                }
                // Every range of the group in flight at once: the group is as many steps as the latency
                // and the rate call for, so this is the concurrency they call for.
                remote_requests_in_flight = static_cast<unsigned>(std::min<std::size_t>(group.size(), max_in_flight));
                store_.note_depth(ahead, remote_requests_in_flight);
                const double t0 = now_s();
                store_.fetch(group);
                pacing.fetched(now_s() - t0);
            }
        } catch (...) {
            // Planning failed (it would fail the workers' planning too, which reports it): stop fetching.
        }
    }

    // The plan of `step` (at or after the last one asked for): straight to it where the sampler has
    // random access (one dataset's windows), else walking its steps in order.
    const batch_plan& plan_of(std::uint64_t step) {
        if (planned_ && plan_.step == step) return plan_;
        if (o_.sources.size() == 1 && o_.context.mode == sample_mode::windows) {
            planner_->plan_at(step, plan_, after_);
        } else {
            while (planner_->state().step <= step) planner_->next(plan_);
        }
        planned_ = true;
        return plan_;
    }

    void ranges_of(const batch_plan& plan, std::vector<std::vector<std::uint32_t>>& rows_of, std::vector<read_request>& out) const {
        for (auto& rows : rows_of) rows.clear();
        for (std::uint32_t r = 0; r < plan.samples.size(); ++r) rows_of[plan.samples[r].dataset].push_back(r);
        for (std::size_t i = 0; i < o_.sources.size(); ++i)
            if (!rows_of[i].empty() && o_.sources[i]->reads_remote_ranges())
                o_.sources[i]->remote_ranges(o_.context, plan, rows_of[i], out);
        std::erase_if(out, [](const read_request& r) { return r.source->at_hand(r.offset, r.length); });  // a warm cache serves it
    }

    static constexpr std::size_t max_in_flight = 256;
    static constexpr std::uint64_t dormant_after = 64;  // steps in a row with nothing to fetch
    static constexpr int dormant_sleep_ms = 20;
    std::unique_ptr<sampler> planner_;
    batch_plan plan_;
    sampler_state after_;
    bool planned_ = false;
    options o_;
    fetch_ahead& store_;
    std::thread thread_;  // last: started once the rest is set
};

}  // namespace feedline::detail
