// feedline/pipeline/ring_consumer.hpp: the trainer's side of a pipeline's staging ring, the same for
// the token and the text pipelines. It holds the ring, each slot's resume state (written by whichever
// thread fills the slot, taken over when the trainer receives that batch), the count of batches
// delivered, the autotuner fed from the ring's clocks and the JSON-lines stats log. The pipelines
// keep what differs: who fills slots, what a state is, which workers the autotuner parks.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <feedline/device/make_ring.hpp>
#include <feedline/exec/trainer_cpu.hpp>
#include <feedline/pipeline/autotuner.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/stats.hpp>

namespace feedline {

template <class State>  // sampler_state or text_state: anything with the next `step`
class ring_consumer {
public:
    // Opens the stats log the config names, if any. Throws config_error (no interval) or io_error.
    void open_log(const pipeline_config& c) {
        if (c.stats_jsonl.empty()) return;
        if (c.stats_every == 0) throw config_error("stats_every", "must be at least 1 when stats_jsonl is set");
        log_ = std::make_unique<stats_jsonl_log>(c.stats_jsonl);
    }

    bool started() const noexcept { return ring_ != nullptr; }
    staging_ring& ring() noexcept { return *ring_; }
    std::size_t prefetch_depth(const memory_plan& m) const noexcept { return ring_ ? ring_->depth() : m.depth; }

    // Where the trainer is: the state after the last batch returned (or the restored one).
    const State& state() const noexcept { return state_; }
    void set_state(const State& s) { state_ = s; }
    // Where a restore continues once the batch in `slot` is returned. Written by the slot's producer
    // before it publishes (the ring's publish/next orders the two).
    void set_slot_state(std::uint64_t step, const State& s) { slot_states_[step % slot_states_.size()] = s; }

    // Makes the ring (pinned on a GPU, else host: the device choice and its reason), at the plan's
    // depth, and the autotuner for what the config left to it (workers = 0: `tune_workers`; prefetch = 0).
    // `producers`: the threads that fill slots, which placement() keeps off the trainer's CPU when the
    // process has CPUs to spare. Call on the trainer's thread.
    void start(const pipeline_config& c, const memory_plan& m, const batch_layout& layout, device_choice device, bool tune_workers,
               unsigned producers) {
        placement_.start(producers, c.avoid_trainer_cpu);
        start_time_ = std::chrono::steady_clock::now();
        auto chosen = make_ring({.slots = m.slots, .slot_bytes = layout.bytes, .first_sequence = state_.step,
                                 .coalesce_wakeups = std::chrono::milliseconds(1)},
                                device);
        ring_ = std::move(chosen.ring);
        device_reason_ = std::move(chosen.reason);
        slot_states_.assign(m.slots, state_);
        ring_->set_depth(m.depth);
        tuner_ = autotuner({.tune_workers = tune_workers, .tune_depth = c.prefetch == 0 && m.depth < m.slots, .max_workers = m.workers, .max_depth = m.slots},
                           start_time_);
    }

    // The next batch, in step order, or empty at the end (then the log gets its last line). A
    // producer's error is rethrown after `stop` (the pipeline's shutdown) ran. `snapshot` gives the
    // pipeline's stats for the log.
    template <class Stop, class Snapshot>
    std::optional<batch_handle> next(const pipeline_config& c, Stop&& stop, Snapshot&& snapshot) {
        const auto entered = std::chrono::steady_clock::now();
        std::optional<batch_handle> h;
        try {
            h = ring_->next();
        } catch (...) {
            stop();
            throw;
        }
        // The trainer's CPU counts when the trainer keeps it busy: on average (over ~8 batches) at
        // least a quarter as long outside next() (its step) as inside (waiting). A data-bound trainer
        // that does nothing between batches mostly sleeps in next() and is woken by a producer, often
        // onto that producer's CPU (exec/trainer_cpu.hpp); noting that CPU would send the producer
        // away from a trainer about to sleep again. An average, because right after a wake-up the
        // batches of a burst are ready at once; a quarter, not a half, because a busy trainer that
        // shares its CPU with a producer waits about as long as it works (the stall to be removed).
        const auto left = std::chrono::steady_clock::now();
        if (returned_ != std::chrono::steady_clock::time_point{}) {
            const auto outside = std::chrono::duration<double>(entered - returned_).count(), inside = std::chrono::duration<double>(left - entered).count();
            busy_s_ += (outside - busy_s_) / 8;
            waiting_s_ += (inside - waiting_s_) / 8;
            if (4 * busy_s_ > waiting_s_) placement_.note();
        }
        returned_ = left;
        if (!h) {
            if (log_ && !final_logged_) log_->write(snapshot()), final_logged_ = true;
            return std::nullopt;
        }
        state_ = slot_states_[h->slot()];
        ++delivered_;
        if (log_ && delivered_ % c.stats_every == 0) log_->write(snapshot());
        return h;
    }

    // After each batch: every autotuner::every batches, the tuner's verdict on the last interval. The
    // ring's depth is applied here; the workers to run are returned for the pipeline to apply.
    // `producer_threads`: the threads that wait for the ring's free slots.
    unsigned tune(unsigned workers, unsigned producer_threads) {
        if (!tuner_.enabled() || delivered_ % autotuner::every != 0) return workers;
        const auto k = tuner_.after_batch(delivered_, ring_->stats(), {.workers = workers, .depth = ring_->depth()}, producer_threads);
        if (k.depth != ring_->depth()) ring_->set_depth(k.depth);
        return k.workers;
    }

    // The counters every pipeline reports the same way: batches, tokens, time, the ring's waits and
    // occupancy, memory, depth and device.
    void fill(pipeline_stats& s, const pipeline_config& c, const memory_plan& m) const {
        s.batches = delivered_;
        s.tokens = delivered_ * c.batch_size * c.seq_len;
        s.seconds = ring_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() : 0;
        s.tokens_per_s = s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0;
        add_ring_and_memory(s, ring_.get(), m);
        s.prefetch_depth = prefetch_depth(m);
        s.device = device_reason_;
        s.worker_placement = started() ? placement_.describe() : "";
        s.trainer_cpu = placement_.trainer();
    }

    // Producers call placement().keep_off(own) once per batch (exec/trainer_cpu.hpp).
    trainer_cpu& placement() noexcept { return placement_; }

    // Producers see the end (or the failure) and return; batches not taken are dropped. Idempotent.
    void close() noexcept {
        if (ring_) ring_->close();
    }

private:
    std::unique_ptr<staging_ring> ring_;
    std::string device_reason_;
    trainer_cpu placement_;
    std::vector<State> slot_states_;
    State state_{};
    autotuner tuner_;
    std::uint64_t delivered_ = 0;
    std::chrono::steady_clock::time_point start_time_, returned_;  // returned_: when next() last returned
    double busy_s_ = 0, waiting_s_ = 0;  // moving averages of the trainer's time outside and inside next()
    std::unique_ptr<stats_jsonl_log> log_;
    bool final_logged_ = false;
};

}  // namespace feedline
