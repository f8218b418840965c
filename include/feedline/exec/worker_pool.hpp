// feedline/exec/worker_pool.hpp: N threads computing numbered work items, results handed out in order.
// Each worker builds its own state on its own thread (a tokenizer, scratch buffers: allocated after the
// thread is pinned, so first touch places them on the worker's NUMA node), claims the next sequence
// number, waits for room in the reorder window, computes and stores. The consumer's next() returns item
// 0, 1, 2, ... whatever the number of workers or their timing. A worker's exception reaches the
// consumer's next() with its type; stop() and the destructor join every thread even when the consumer
// stopped consuming. Fed by the sampler (sequence -> work); feeds the stager.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <feedline/detail/futex.hpp>
#include <feedline/detail/thread_name.hpp>
#include <feedline/error.hpp>
#include <feedline/exec/reorder.hpp>

namespace feedline {

struct pool_options {
    unsigned workers = 1;
    // Results that may be finished ahead of the consumer (memory bound). 0: 2 x workers.
    std::size_t window = 0;
    // CPUs for each worker: one entry per worker, or a single entry shared by all; empty: no pinning.
    std::vector<std::vector<int>> cpu_sets;
    // Number of items (sequence numbers [first_sequence, first_sequence + count)); nullopt: unbounded.
    std::optional<std::uint64_t> count;
    std::uint64_t first_sequence = 0;
    // Workers are named name_prefix + their index (e.g. "feedline-tok0"); empty: left unnamed.
    std::string name_prefix;
};

template <class Result>
class ordered_pool {
public:
    // Starts the workers. make_state(worker_index) runs on the worker's thread and returns its state;
    // work(state, sequence) returns the Result for that sequence number and must be a pure function of
    // the sequence (that is what makes the output independent of the number of workers).
    // Throws config_error for 0 workers or mismatched cpu_sets; nothing is started then.
    template <class MakeState, class Work>
    ordered_pool(pool_options options, MakeState make_state, Work work)
        : options_(std::move(options)),
          window_(options_.window ? options_.window : 2 * std::size_t(std::max(1u, options_.workers)), options_.first_sequence),
          next_ticket_(options_.first_sequence),
          active_(options_.workers),
          // Runs of up to 8, small enough that every worker has a run inside the window.
          claim_(std::clamp<std::uint64_t>(window_.capacity() / (2 * std::max(1u, options_.workers)), 1, 8)) {
        if (options_.workers == 0) throw config_error("workers", "must be at least 1");
        if (!options_.cpu_sets.empty() && options_.cpu_sets.size() != 1 && options_.cpu_sets.size() != options_.workers)
            throw config_error("cpu_sets", "give one CPU set per worker (" + std::to_string(options_.workers) + ") or one for all, got " +
                                               std::to_string(options_.cpu_sets.size()));
        threads_.reserve(options_.workers);
        try {
            for (unsigned w = 0; w < options_.workers; ++w)
                threads_.emplace_back([this, w, make_state, work]() mutable { run_worker(w, make_state, work); });
        } catch (...) {
            stop();
            throw;
        }
    }
    ordered_pool(const ordered_pool&) = delete;
    ordered_pool& operator=(const ordered_pool&) = delete;
    ~ordered_pool() { stop(); }

    // The next result in sequence order. Blocks until it is ready. nullopt after the last item (when
    // `count` was given) or after stop(). Rethrows the first exception any worker threw, with its type;
    // the pool is stopped by then. One consumer thread at a time.
    std::optional<Result> next() {
        rethrow_if_failed();
        if (options_.count && window_.next_sequence() >= options_.first_sequence + *options_.count) return std::nullopt;
        auto r = window_.pop();
        if (!r) rethrow_if_failed();
        return r;
    }

    // Stops every worker and joins them. Bounded by the longest single work() call in progress; never
    // waits for the consumer. Idempotent; thread-safe with next() (which then returns nullopt).
    void stop() noexcept {
        stopping_.store(true);
        window_.close();
        active_changed_.notify();
        for (auto& t : threads_)
            if (t.joinable()) t.join();
    }

    // Parks workers with index >= n (at least 1) after their current item, or wakes parked ones. Only
    // timing changes: which item is computed never depends on which worker computes it.
    void set_active_workers(unsigned n) noexcept {
        active_.store(std::clamp(n, 1u, options_.workers));
        active_changed_.notify();
    }
    unsigned active_workers() const noexcept { return active_.load(); }
    unsigned workers() const noexcept { return options_.workers; }
    const reorder_window<Result>& window() const noexcept { return window_; }
    // Human-readable problems met while pinning threads (empty when none).
    std::vector<std::string> pinning_warnings() const {
        std::lock_guard lock(mutex_);
        return pin_warnings_;
    }

private:
    template <class MakeState, class Work>
    void run_worker(unsigned index, MakeState& make_state, Work& work) {
        try {
            if (!options_.name_prefix.empty()) detail::name_this_thread(options_.name_prefix + std::to_string(index));
            pin(index);
            auto state = make_state(index);
            for (;;) {
                if (stopping_.load()) return;
                if (index >= active_.load()) {
                    active_changed_.wait([&] { return stopping_.load() || index < active_.load(); });
                    continue;
                }
                // Claim a short run of sequence numbers at once: one contended increment per run
                // instead of per item. Order is unaffected (the window sorts), and progress is
                // guaranteed: the lowest unfinished number always fits in the window, and its worker
                // processes its run in order.
                const std::uint64_t first = next_ticket_.fetch_add(claim_);
                for (std::uint64_t seq = first; seq < first + claim_; ++seq) {
                    if (options_.count && seq >= options_.first_sequence + *options_.count) return;
                    if (!window_.wait_for_room(seq)) return;
                    window_.put(seq, work(state, seq));
                }
            }
        } catch (...) {
            {
                std::lock_guard lock(mutex_);
                if (!failure_) failure_ = std::current_exception();
            }
            failed_.store(true);
            stopping_.store(true);
            window_.close();
            active_changed_.notify();
        }
    }

    void pin(unsigned index) {
        if (options_.cpu_sets.empty()) return;
        const auto& cpus = options_.cpu_sets.size() == 1 ? options_.cpu_sets[0] : options_.cpu_sets[index];
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : cpus)
            if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
        if (int rc = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set); rc != 0) {
            std::lock_guard lock(mutex_);
            pin_warnings_.push_back("worker " + std::to_string(index) + ": cannot pin (" + std::to_string(rc) + "); running unpinned");
        }
    }

    void rethrow_if_failed() {
        if (!failed_.load()) return;
        std::exception_ptr e;
        {
            std::lock_guard lock(mutex_);
            e = failure_;
        }
        stop();
        std::rethrow_exception(e);
    }

    pool_options options_;
    reorder_window<Result> window_;
    alignas(64) std::atomic<std::uint64_t> next_ticket_;
    std::atomic<unsigned> active_;
    std::uint64_t claim_;
    std::atomic<bool> stopping_{false};
    std::atomic<bool> failed_{false};
    detail::wait_point active_changed_;
    mutable std::mutex mutex_;  // guards failure_ and pin_warnings_: touched only on error paths
    std::exception_ptr failure_;
    std::vector<std::string> pin_warnings_;
    std::vector<std::thread> threads_;
};

}  // namespace feedline
