// feedline/pipeline/detail/ring_consumer.hpp: the trainer's side of the pipeline's staging ring. It
// holds the ring, each slot's resume state (written by the worker that fills the slot, taken over when
// the trainer receives that batch), the count of batches delivered, the autotuner fed from the ring's
// clocks, the trainer's CPU placement and the JSON-lines stats log. Used by pipeline/pipeline.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <feedline/device/make_ring.hpp>
#include <feedline/device/nvml.hpp>
#include <feedline/exec/trainer_cpu.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/detail/autotuner.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/transform/collate.hpp>

namespace feedline::detail {

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
    const sampler_state& state() const noexcept { return state_; }
    void set_state(const sampler_state& s) { state_ = s; }
    // Where a restore continues once the batch of `step` is returned. Written by the slot's producer
    // after it acquired the slot and before it publishes (the ring's publish/next orders the two).
    void set_slot_state(std::uint64_t step, const sampler_state& s) { slot_states_[step % slot_states_.size()] = s; }

    // Makes the ring (pinned on a GPU, else host: the device choice and its reason) at the plan's
    // depth, and the autotuner for what the config left to it (workers = 0: `tune_workers`; prefetch
    // = 0). `producers`: the threads that fill slots, which placement() keeps off the trainer's CPU
    // when the process has CPUs to spare, within `producer_cpus` when given. On the trainer's thread.
    void start(const pipeline_config& c, const memory_plan& m, const batch_layout& layout, bool tune_workers, unsigned producers,
               const std::vector<int>& producer_cpus = {}) {
        placement_.start(producers, c.avoid_trainer_cpu, producer_cpus);
        start_time_ = std::chrono::steady_clock::now();
        auto chosen = make_ring({.slots = m.slots, .slot_bytes = layout.bytes, .first_sequence = state_.step, .coalesce_wakeups = defaults::coalesce_wakeups},
                                c.device);
        ring_ = std::move(chosen.ring);
        device_reason_ = std::move(chosen.reason);
        slot_states_.assign(m.slots, state_);
        ring_->set_depth(m.depth);
        if (wait_check_) ring_->set_wait_check(wait_check_, wait_check_every_);
        // The GPU's utilization and memory for the log's lines (doctor diagnose reads them): sampled
        // on a side thread, only where there is a log and batches go to a GPU.
        if (log_ && ring_->on_device()) {
            gpu_sampler_ = gpu_sampler::for_gpu(gpu_pci_bus_id(c.device.index), &gpu_telemetry_);
            if (gpu_sampler_) gpu_telemetry_ = "nvml";
        }
        tuner_ = autotuner({.tune_workers = tune_workers, .tune_depth = c.prefetch == 0 && m.depth < m.slots, .max_workers = m.workers, .max_depth = m.slots},
                           start_time_);
    }

    // See pipeline::set_wait_check. Kept for a ring made later by start().
    void set_wait_check(std::function<bool()> check, std::chrono::milliseconds every) {
        wait_check_ = std::move(check);
        wait_check_every_ = every;
        if (ring_) ring_->set_wait_check(wait_check_, wait_check_every_);
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
        } catch (const wait_interrupted&) {
            throw;  // the consumer's own check: the pipeline runs on, and next() may be called again
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
            busy_s_ += (outside - busy_s_) / defaults::placement_average_batches;
            waiting_s_ += (inside - waiting_s_) / defaults::placement_average_batches;
            if (busy_s_ > defaults::busy_trainer_ratio * waiting_s_) placement_.note();
        }
        returned_ = left;
        if (!h) {
            if (!final_logged_) log(snapshot), final_logged_ = true;
            return std::nullopt;
        }
        state_ = slot_states_[h->slot()];
        ++delivered_;
        if (delivered_ % c.stats_every == 0) log(snapshot);
        return h;
    }

    // After each batch: every autotuner::every batches, the tuner's verdict on the last interval. The
    // ring's depth is applied here; the workers to run are returned for the pipeline to apply.
    unsigned tune(unsigned workers) {
        if (!tuner_.enabled() || delivered_ % autotuner::every != 0) return workers;
        const auto k = tuner_.after_batch(delivered_, ring_->stats(), {.workers = workers, .depth = ring_->depth()}, workers);
        if (k.depth != ring_->depth()) ring_->set_depth(k.depth);
        return k.workers;
    }

    // The counters the ring and the consumer keep: batches, tokens, time, the ring's waits and
    // occupancy, memory, depth, device and placement.
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
        fill_memory_telemetry(s);
        if (gpu_interval_) {
            s.gpu_utilization = gpu_interval_->utilization;  // may be empty (MIG): then absent
            s.gpu_memory_used_bytes = gpu_interval_->memory_used;
            s.gpu_memory_total_bytes = gpu_interval_->memory_total;
        }
        s.gpu_telemetry = gpu_telemetry_;
        s.pinned_bytes = ring_ && ring_->pinned() ? m.slots * m.slot_bytes : 0;
        s.memory_budget = m.budget;
        s.planned_bytes = m.total();
        s.prefetch_depth = prefetch_depth(m);
        s.device = device_reason_;
        s.worker_placement = started() ? placement_.describe() : "";
        s.stats_log_error = log_error_;
        s.trainer_cpu = placement_.trainer();
    }

    // Producers call placement().keep_off(own) once per batch (exec/trainer_cpu.hpp).
    trainer_cpu& placement() noexcept { return placement_; }

    // Producers see the end (or the failure) and return; batches not taken are dropped. Idempotent.
    void close() noexcept {
        if (ring_) ring_->close();
    }

private:
    // A log that cannot be written (a full disk) stops logging, with the reason in stats; it never
    // costs the trainer its batch.
    template <class Snapshot>
    void log(Snapshot&& snapshot) {
        if (!log_) return;
        if (gpu_sampler_)
            if (auto g = gpu_sampler_->take()) gpu_interval_ = g;
        try {
            log_->write(snapshot());
        } catch (const std::exception& e) {
            log_error_ = e.what();
            log_.reset();
        }
    }

    std::unique_ptr<staging_ring> ring_;
    std::function<bool()> wait_check_;
    std::chrono::milliseconds wait_check_every_{100};
    std::string device_reason_;
    trainer_cpu placement_;
    std::vector<sampler_state> slot_states_;
    sampler_state state_{};
    autotuner tuner_;
    std::uint64_t delivered_ = 0;
    std::chrono::steady_clock::time_point start_time_, returned_;  // returned_: when next() last returned
    double busy_s_ = 0, waiting_s_ = 0;  // moving averages of the trainer's time outside and inside next()
    std::unique_ptr<stats_jsonl_log> log_;
    std::string log_error_;
    std::unique_ptr<gpu_sampler> gpu_sampler_;
    std::optional<gpu_interval> gpu_interval_;  // the mean over the interval before the last log line
    std::string gpu_telemetry_;                  // "nvml", or why the GPU is not sampled
    bool final_logged_ = false;
};

}  // namespace feedline::detail
