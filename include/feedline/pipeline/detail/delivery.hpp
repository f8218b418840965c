// feedline/pipeline/detail/delivery.hpp: the hand-off of batches to the trainer. It holds the staging
// ring, each slot's resume state (written by the worker that fills the slot, taken over when the
// trainer receives that batch), the count of batches delivered, the autotuner fed from the ring's
// clocks and the trainer's CPU placement. It knows nothing of logs or of how the pipeline stops: a
// producer's error is rethrown to the pipeline, which stops itself (pipeline/pipeline.hpp). Stats are
// filled here for what delivery measures; the log is pipeline/detail/telemetry.hpp's.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <feedline/device/make_ring.hpp>
#include <feedline/exec/trainer_cpu.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/detail/autotuner.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/transform/collate.hpp>

namespace feedline::detail {

// Whether a trainer waiting in next() spins before it sleeps (staging_ring::set_consumer_spins), with
// `producers` threads filling the ring on the `cpus` CPUs the process may use (0: unknown). It stops
// only when no CPU is left to it and the host is large enough for that to pay
// (defaults::min_cpus_for_sleeping_trainer).
inline bool trainer_spins_while_waiting(int cpus, unsigned producers) noexcept {
    return cpus <= 0 || static_cast<unsigned>(cpus) > producers || static_cast<unsigned>(cpus) < defaults::min_cpus_for_sleeping_trainer;
}

// How long that trainer polls for its batch before it sleeps (staging_ring::set_consumer_poll): while
// the producers leave it a CPU of its own, defaults::trainer_poll_with_a_spare_cpu; else 0.
inline std::chrono::microseconds trainer_poll_while_waiting(int cpus, unsigned producers) noexcept {
    return cpus > 0 && static_cast<unsigned>(cpus) > producers ? defaults::trainer_poll_with_a_spare_cpu : std::chrono::microseconds(0);
}

class delivery {
public:
    bool started() const noexcept { return ring_ != nullptr; }
    staging_ring& ring() noexcept { return *ring_; }
    std::size_t prefetch_depth(const memory_plan& m) const noexcept { return ring_ ? ring_->depth() : m.depth; }
    std::uint64_t delivered() const noexcept { return delivered_; }
    bool on_device() const noexcept { return ring_ && ring_->on_device(); }

    // Where the trainer is: the state after the last batch returned (or the restored one).
    const sampler_state& state() const noexcept { return state_; }
    void set_state(const sampler_state& s) { state_ = s; }
    // Weights set for a later step (pipeline::set_mixture_weights): in the trainer's state at once,
    // taken by the delta of that step when its batch is returned.
    void add_weights_change(mixture_weights_change c) { state_.add_weights_change(std::move(c)); }
    // Where a restore continues once the batch of `step` is returned: what the step changes in the
    // state before it (batches are returned in step order). Written by the slot's producer after it
    // acquired the slot and before it publishes (the ring's publish/next orders the two). Copy-assigned:
    // the slot's storage is reused.
    void set_slot_state(std::uint64_t step, const sampler_step_delta& d) { slot_states_[step % slot_states_.size()] = d; }

    // Makes the ring (pinned on a GPU, else host: the device choice and its reason) at the plan's
    // depth, and the autotuner for what the config left to it (workers = 0: `tune_workers`; prefetch
    // = 0). `producers`: the threads that fill slots, which placement() keeps off the trainer's CPU
    // when the process has CPUs to spare, within `producer_cpus` when given. On the trainer's thread.
    void start(const pipeline_config& c, const memory_plan& m, const batch_layout& layout, bool tune_workers, unsigned producers,
               const std::vector<int>& producer_cpus = {}) {
        placement_.start(producers, c.avoid_trainer_cpu, producer_cpus);
        start_time_ = std::chrono::steady_clock::now();
        auto chosen = make_ring(
            {.slots = m.slots, .slot_bytes = layout.bytes, .first_sequence = state_.step, .coalesce_wakeups = defaults::coalesce_wakeups},
            c.device);
        ring_ = std::move(chosen.ring);
        device_reason_ = std::move(chosen.reason);
        slot_states_.assign(m.slots, sampler_step_delta{});
        ring_->set_depth(m.depth);
        ring_->set_consumer_spins(trainer_spins_while_waiting(placement_.cpus(), producers));
        ring_->set_consumer_poll(trainer_poll_while_waiting(placement_.cpus(), producers));
        if (wait_check_) ring_->set_wait_check(wait_check_, wait_check_every_);
        tuner_ = autotuner({.tune_workers = tune_workers,
                            .tune_depth = c.prefetch == 0 && m.depth < m.slots,
                            .max_workers = m.workers,
                            .max_depth = m.slots},
                           start_time_);
    }

    // See pipeline::set_wait_check. Kept for a ring made later by start().
    void set_wait_check(std::function<bool()> check, std::chrono::milliseconds every) {
        wait_check_ = std::move(check);
        wait_check_every_ = every;
        if (ring_) ring_->set_wait_check(wait_check_, wait_check_every_);
    }

    // The next batch, in step order, or empty at the end. A producer's error is rethrown as it was
    // thrown (the caller stops the producers); wait_interrupted leaves everything running.
    std::optional<batch_handle> next() {
        const auto entered = std::chrono::steady_clock::now();
        std::optional<batch_handle> h = ring_->next();
        // The trainer's CPU counts when the trainer keeps it busy: on average (over ~8 batches) at
        // least a quarter as long outside next() (its step) as inside (waiting). A data-bound trainer
        // that does nothing between batches mostly sleeps in next() and is woken by a producer, often
        // onto that producer's CPU (exec/trainer_cpu.hpp); noting that CPU would send the producer
        // away from a trainer about to sleep again. An average, because right after a wake-up the
        // batches of a burst are ready at once; a quarter, not a half, because a busy trainer that
        // shares its CPU with a producer waits about as long as it works (the stall to be removed).
        const auto left = std::chrono::steady_clock::now();
        if (returned_ != std::chrono::steady_clock::time_point{}) {
            const auto outside = std::chrono::duration<double>(entered - returned_).count(),
                       inside = std::chrono::duration<double>(left - entered).count();
            busy_s_ += (outside - busy_s_) / defaults::placement_average_batches;
            waiting_s_ += (inside - waiting_s_) / defaults::placement_average_batches;
            if (busy_s_ > defaults::busy_trainer_ratio * waiting_s_) placement_.note();
        }
        returned_ = left;
        if (!h) return std::nullopt;
        slot_states_[h->slot()].apply_to(state_);
        ++delivered_;
        return h;
    }

    // After each batch: every autotuner::every batches, the tuner's verdict on the last interval. The
    // ring's depth is applied here; the workers to run are returned for the pipeline to apply.
    unsigned tune(unsigned workers) {
        if (!tuner_.enabled() || delivered_ % autotuner::every != 0) return workers;
        const auto k = tuner_.after_batch(delivered_, ring_->stats(), {.workers = workers, .depth = ring_->depth()}, workers);
        if (k.depth != ring_->depth()) ring_->set_depth(k.depth);
        if (k.workers != workers) {
            ring_->set_consumer_spins(trainer_spins_while_waiting(placement_.cpus(), k.workers));
            ring_->set_consumer_poll(trainer_poll_while_waiting(placement_.cpus(), k.workers));
        }
        return k.workers;
    }

    // What delivery counts: batches, tokens, time, the ring's waits and occupancy, memory, depth,
    // device and placement.
    void fill(pipeline_stats& s, const pipeline_config& c, const memory_plan& m) const {
        s.batches = delivered_;
        s.tokens = delivered_ * c.batch_size * c.seq_len;
        s.seconds = ring_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() : 0;
        s.tokens_per_s = s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0;
        if (ring_) {
            const auto r = ring_->stats();
            s.slot_wait_s = static_cast<double>(r.producer_wait_ns) * 1e-9;
            s.stall_s = static_cast<double>(r.consumer_wait_ns) * 1e-9;
            s.ready_batches = r.ready;
            s.consumer_sleeps = r.consumer_sleeps;
        }
        s.stall_fraction = s.seconds > 0 ? std::min(1.0, s.stall_s / s.seconds) : 0;
        s.slots = m.slots;
        s.workers = m.workers;
        s.pinned_bytes = ring_ && ring_->pinned() ? m.slots * m.slot_bytes : 0;
        s.memory_budget = m.budget;
        s.planned_bytes = m.total();
        s.prefetch_depth = prefetch_depth(m);
        s.device = device_reason_;
        s.worker_placement = started() ? placement_.describe() : "";
        if (started() && !ring_->consumer_spins())
            s.worker_placement += "; next() sleeps at once while it waits (no CPU to spare for spinning)";
        else if (started() && ring_->consumer_poll().count() > 0)
            s.worker_placement += "; next() polls up to " + std::to_string(ring_->consumer_poll().count()) +
                                  " us for its batch before it sleeps (a CPU to spare)";
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
    std::function<bool()> wait_check_;
    std::chrono::milliseconds wait_check_every_{100};
    std::string device_reason_;
    trainer_cpu placement_;
    std::vector<sampler_step_delta> slot_states_;
    sampler_state state_{};
    autotuner tuner_;
    std::uint64_t delivered_ = 0;
    std::chrono::steady_clock::time_point start_time_, returned_;  // returned_: when next() last returned
    double busy_s_ = 0, waiting_s_ = 0;                            // moving averages of the trainer's time outside and inside next()
};

}  // namespace feedline::detail
