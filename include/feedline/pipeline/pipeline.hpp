// feedline/pipeline/pipeline.hpp: feedline::pipeline, the one engine. It takes a spec (one dataset, or
// a weighted blend of any mix of token shards and JSONL/text corpora), opens each as a source
// (pipeline/shard_source.hpp, pipeline/text_source.hpp), and owns everything around them, the same for
// every kind of data: config checks, rank and world size (config or launcher), the worker count
// (recommend_workers), the memory plan, one sampler over all sources (sampling/sampler.hpp: shuffles,
// windows or packed rows, tails, rank slices, blending, resume), the worker threads, the staging ring
// (pinned on a GPU, host memory otherwise), autotuning, parking, stats and the stats log, state().
//
// One batch's way: a worker takes the next step number and plans it (its own copy of the sampler in
// windows mode with one small dataset, else the shared sampler under a lock), waits for the step's
// ring slot, has each source write its samples' tokens into the slot (transform/collate.hpp), adds a
// packed batch's boundaries, records the sampler state after the step beside the slot, and publishes
// the slot (an async H2D copy with the pinned ring). The trainer's next() takes slots in step order
// whatever the number of workers; the data of step k is a pure function of the config, so resume is
// exact with any worker count. Threads start at the first next(), so restore() can come first.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <feedline/detail/futex.hpp>
#include <feedline/detail/prefetch.hpp>
#include <feedline/detail/spin_then_lock.hpp>
#include <feedline/detail/thread_name.hpp>
#include <feedline/exec/host_memory.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/data_spec.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/detail/delivery.hpp>
#include <feedline/pipeline/detail/fetch_ahead_thread.hpp>
#include <feedline/pipeline/detail/telemetry.hpp>
#include <feedline/pipeline/options.hpp>
#include <feedline/pipeline/shard_source.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/pipeline/state.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/pipeline/text_source.hpp>
#include <feedline/sampling/sampler.hpp>

namespace feedline {

namespace detail {

// How many workers a pipeline starts, and whether the autotuner may park some. config.workers when
// given (fixed); config.max_workers when given (autotuned below it); otherwise recommend_workers for
// the trainers on this node (one per local rank, when every process may use every CPU) and the cores
// this process may use, at most defaults::max_auto_workers. The autotuner then parks what the
// trainer does not need.
struct worker_choice {
    unsigned workers = 1;
    bool autotune = false;
    std::string reason;
};

inline worker_choice choose_workers(const pipeline_config& c, const topology& t, const launch_info& env) {
    if (c.workers) {
        std::string reason = "workers = " + std::to_string(c.workers) + " (fixed)";
        // Batches come in step order, so a worker that loses its CPU to the trainer holds up the
        // batches after its own: on a 16-CPU host 15 workers delivered more than 16 (docs/benchmarks.md).
        // Not said below defaults::min_cpus_for_sleeping_trainer: on 2 vCPUs 2 workers beat 1.
        if (const std::size_t cpus = t.allowed_cpus.size(); cpus >= defaults::min_cpus_for_sleeping_trainer && c.workers >= cpus)
            reason += "; as many workers as CPUs (" + std::to_string(cpus) + ") leave none to the trainer: one fewer is usually faster";
        return {c.workers, false, reason};
    }
    const bool shared_cpus = t.allowed_cpus.size() >= t.online_cpus.size();
    const unsigned trainers = shared_cpus ? static_cast<unsigned>(env.local_world_size) : 1u;
    // recommend_workers counts GPUs; 0 stands for one trainer on the CPU (what it then says in its line).
    const worker_plan plan = recommend_workers(t, trainers == 1 && c.device.kind == device_kind::cpu ? 0u : trainers);
    if (c.max_workers) return {c.max_workers, c.max_workers > 1, "max_workers = " + std::to_string(c.max_workers) + " started, autotuned"};
    const unsigned n = std::clamp(plan.workers_per_gpu, 1u, defaults::max_auto_workers);
    return {n, n > 1, plan.explanation + "; " + std::to_string(n) + " started, autotuned"};
}

}  // namespace detail

// Opens what a spec names: token shards, or JSONL/text tokenized with config.text. Throws io_error /
// format_error naming the file, config_error for text without a tokenizer (or none built).
inline std::shared_ptr<batch_source> open_source(const std::string& spec, const pipeline_config& config) {
    return detail::source_type_of(spec).open(spec, config);
}

namespace detail {

// Opens a blend's or a mixture's sources, freeing each spec's text once its source is open: the next
// sources' objects reuse that memory instead of being laid out around 10,000 paths that are all freed
// after the last one opens (at 10,000 domains, one 64-byte hole per domain in the allocator's arena for
// the whole run). Takes the specs by value for that; a caller that keeps its own passes a copy.
// A directory is listed once for all of them (detail/paths.hpp: thousands of domains' globs in one
// directory read it once, not twice each).
inline std::vector<weighted_source> open_sources(std::vector<weighted_spec> specs, const pipeline_config& config) {
    glob_listings listings;  // not const: globs fill it
    std::vector<weighted_source> out;
    out.reserve(specs.size());
    for (std::size_t i = 0; i < specs.size(); ++i) {
        check_weight(specs[i].weight, i + 1);
        out.push_back({specs[i].weight, open_source(specs[i].spec, config)});
        std::string().swap(specs[i].spec);
    }
    return out;
}

// The same for a mixture's domains (weight 1: the schedule weighs them), each one spec or a list of
// them opened together as one source of one kind (its type's open_list). Throws config_error naming
// the domain and where it was declared for a list of two kinds, or of a kind that takes one spec.
// Frees m's specs as it goes (as open_sources does), then their table (m holds no domains after);
// the rest of `m` stays.
inline std::vector<weighted_source> open_domains(mixture_spec& m, const pipeline_config& config) {
    glob_listings listings;  // not const: globs fill it
    std::vector<weighted_source> out;
    out.reserve(m.domains());
    for (std::size_t d = 0; d < m.domains(); ++d) {
        const std::span<std::string> data = m.data(d);
        if (data.size() == 1) {
            out.push_back({1.0, open_source(data[0], config)});
        } else {
            const source_type type = source_type_of(data[0]);
            const auto fail = [&](const std::string& why) {
                throw config_error("domains[" + std::to_string(d) + "].data",
                                   m.declared_at(d) + ": domain '" + m.schedule->names()[d] + "' lists " + why);
            };
            for (std::size_t k = 1; k < data.size(); ++k)
                if (const source_kind other = source_type_of(data[k]).kind; other != type.kind)
                    fail("data of two kinds ('" + data[0] + "' is " + std::string(to_string(type.kind)) + ", '" + data[k] + "' " +
                         std::string(to_string(other)) + "): a domain is one kind of data; make two domains");
            if (!type.open_list) fail(std::string(to_string(type.kind)) + ", a kind that opens one spec a source: give one");
            out.push_back({1.0, type.open_list(std::vector<std::string>(data.begin(), data.end()), config)});
        }
        for (std::string& spec : data) std::string().swap(spec);
    }
    // And the table of them (10,000 domains: 320 KB), before the sampler's streams are laid out: freed
    // after them, it stayed a hole in the heap (bench_mixture: 32 bytes a domain).
    std::vector<std::string>().swap(m.specs);
    std::vector<std::uint32_t>{0}.swap(m.first);
    return out;
}

}  // namespace detail

class pipeline {
public:
    // `spec`: one dataset (a Megatron prefix, llm.c shards, JSONL/text files: a file, directory or glob)
    // or a blend in Megatron's --data-path form ("0.7 data/web 0.3 code/*.jsonl"). Throws config_error,
    // io_error, format_error before any thread starts.
    pipeline(const std::string& spec, pipeline_config config) : pipeline(parse_data_spec(spec), std::move(config)) {}
    // A blend: {{0.7, "data/web"}, {0.3, "code/*.jsonl"}}. The config's shape is checked before any
    // source is opened (opening text may mean a tokenizing pass).
    pipeline(const std::vector<weighted_spec>& blend, const pipeline_config& config)
            : pipeline(detail::remote_counters::instance().snapshot(), blend, config) {}
    // Sources opened before (shared by a training and an evaluation pipeline, say).
    pipeline(std::shared_ptr<batch_source> source, pipeline_config config)
            : pipeline(std::vector<weighted_source>{{1.0, std::move(source)}}, std::move(config)) {}
    pipeline(std::shared_ptr<const token_dataset> shards, pipeline_config config)
            : pipeline(std::make_shared<shard_source>(std::move(shards)), std::move(config)) {}
    // Sources mixed by a schedule of weights over the steps (sampling/mixture_schedule.hpp), one domain
    // per source in order; each source's weight is unused. A data spec naming a mixture file opens its
    // domains this way.
    pipeline(std::vector<weighted_source> sources, std::shared_ptr<const mixture_schedule> schedule, pipeline_config config)
            : sources_(std::move(sources)), config_(std::move(config)), mixture_(std::move(schedule)) {
        if (!mixture_) throw config_error("mixture", "no schedule given");
        construct();
    }
    pipeline(std::vector<weighted_source> sources, pipeline_config config) : sources_(std::move(sources)), config_(std::move(config)) {
        construct();
    }

    pipeline(const pipeline&) = delete;
    pipeline& operator=(const pipeline&) = delete;
    ~pipeline() { stop(); }

private:
    void construct() {
        check_shape(config_, sources_.size());
        check_sources();
        device_ = config_.device;
        layout_ = batch_layout::make(config_.batch_size, config_.seq_len, config_.mode == sample_mode::packed);
        const launch_info env = launch_from_environment();
        const int world = config_.world_size >= 0 ? config_.world_size : env.world_size;
        if (world < 1) throw config_error("world_size", "must be at least 1");
        if (config_.batch_size > sampler::max_step / static_cast<std::uint64_t>(world))
            throw config_error("batch_size",
                               std::to_string(config_.batch_size) + " x " + std::to_string(world) + " ranks: too large a global batch");
        if (config_.max_steps > sampler::max_step / (config_.batch_size * static_cast<std::uint64_t>(world)))
            throw config_error(
                "max_steps", std::to_string(config_.max_steps) + " steps: past what a run can reach (a state holds steps x global batch)");
        weights_.reserve(sources_.size());
        for (const auto& s : sources_) weights_.push_back(s.weight);
        sampler_config sc{.seq_len = config_.seq_len,
                          .global_batch = config_.batch_size * static_cast<std::uint64_t>(world),
                          .seed = config_.seed,
                          .mode = config_.mode,
                          .shuffle = config_.shuffle,
                          .tail = config_.tail,
                          .rank = config_.rank >= 0 ? config_.rank : env.rank,
                          .world_size = world};
        sampler_ = make_sampler(sc);
        end_step_ = run_end_step_ = planned_end_step_ = end_of_run(sc.global_batch);
        // Windows of one small dataset: every worker plans with a sampler of its own (plan_at), so
        // planning runs in parallel instead of behind planner_ (with 2 workers, waiting for the lock
        // cost each worker as much as planning itself). Packed mode plans sequentially (plan_at would
        // lay out every epoch before the step's), and blends draw sequentially (one walk decides every
        // dataset), then plan their samples' segments beside each other (plan_next).
        const std::uint64_t sampler_bytes = sampler_->stream(0).memory_bytes();
        own_planners_ = sources_.size() == 1 && config_.mode == sample_mode::windows && sampler_bytes <= defaults::own_planner_max_bytes;

        const topology topo = read_topology();
        const detail::worker_choice workers = detail::choose_workers(config_, topo, env);
        autotune_ = workers.autotune;
        workers_reason_ = workers.reason;
        const std::uint64_t available = read_host_memory().available.value_or(0);
        const std::uint64_t process =
            topo.cgroup_memory_max ? (available ? std::min(available, *topo.cgroup_memory_max) : *topo.cgroup_memory_max) : available;
        const std::uint64_t budget = config_.memory_budget ? config_.memory_budget : process / defaults::budget_divisor;
        // Remote data: a fetch-ahead thread with a sampler of its own, its ranges inside the budget.
        std::uint64_t remote_step_bytes = 0;
        for (const auto& s : sources_)
            if (s.source->reads_remote_ranges()) remote_step_bytes += s.source->worker_bytes(source_context::of(config_));
        std::uint64_t all_samplers_bytes = 0;
        for (std::size_t i = 0; i < sources_.size(); ++i) all_samplers_bytes += sampler_->stream(i).memory_bytes();
        std::uint64_t worker_bytes = 0, index_bytes = all_samplers_bytes + (own_planners_ ? sampler_bytes * workers.workers : 0);
        std::map<const void*, std::uint64_t> scratch_groups;  // per group, its largest worker's bytes
        for (const auto& s : sources_) {
            auto& group = scratch_groups[s.source->worker_scratch_group()];
            group = std::max(group, s.source->worker_bytes(source_context::of(config_)));
            index_bytes += s.source->index_bytes(source_context::of(config_));
        }
        for (const auto& [group, bytes] : scratch_groups) worker_bytes += bytes;
        memory_ = plan_memory(budget, workers.workers, layout_.bytes, worker_bytes, index_bytes, remote_step_bytes, all_samplers_bytes);
        all_rows_.resize(config_.batch_size);
        for (std::uint32_t r = 0; r < all_rows_.size(); ++r) all_rows_[r] = r;
        counters_ = std::make_unique<worker_counters[]>(memory_.workers);
        delivery_.set_state(sampler_->state());
        telemetry_.open(config_);
    }

public:
    const pipeline_config& config() const noexcept { return config_; }
    // Where batches go: config().device with "auto"/"cuda" resolved to a device number once the first
    // batch was asked for (resolve_device); config().device before that.
    const device_choice& device() const noexcept { return device_; }
    const memory_plan& memory() const noexcept { return memory_; }
    // The step the iteration ends before (max_steps, or the end of `epochs` passes, whichever comes
    // first); 0: it runs on. Python's len() of a finite pipeline.
    std::uint64_t end_step() const noexcept { return end_step_; }
    int rank() const noexcept { return sampler_->rank(); }
    int world_size() const noexcept { return sampler_->world_size(); }
    const std::vector<weighted_source>& sources() const noexcept { return sources_; }

    // One line for logs: the data, or each blended source with its weight.
    std::string describe() const {
        if (mixture_)
            return "a mixture of " + std::to_string(sources_.size()) + " domains" +
                   (mixture_path_.empty() ? "" : " (" + mixture_path_ + ")") + ", " + std::to_string(mixture_->stages()) + " stage(s)";
        if (sources_.size() == 1) return sources_[0].source->describe();
        std::string out = "a blend of " + std::to_string(sources_.size()) + ":";
        for (const auto& s : sources_) out += " " + std::to_string(s.weight) + " x (" + s.source->describe() + ");";
        out.pop_back();
        return out;
    }

    // The next step's batch, in order; empty after max_steps. Rethrows a worker's error (a corrupt
    // shard or a bad JSONL line found mid-epoch arrives here as the format_error naming file and
    // offset), after which the pipeline is stopped.
    std::optional<batch> next() {
        if (!delivery_.started()) start();
        std::optional<batch_handle> h;
        try {
            h = delivery_.next();
        } catch (const wait_interrupted&) {
            throw;  // the consumer's own check: the pipeline runs on, and next() may be called again
        } catch (...) {
            stop();  // a producer failed: the others stop, then its error reaches the trainer
            throw;
        }
        if (!h) {
            if (telemetry_.end_due()) log_line(/*final=*/true);
            return std::nullopt;
        }
        if (telemetry_.due(delivery_.delivered())) log_line(/*final=*/false);
        const unsigned n = active_workers();
        if (const unsigned want = delivery_.tune(n); want != n) {
            target_workers_.store(want, std::memory_order_relaxed);
            parked_.notify();
        }
        return batch(std::move(*h), &layout_);
    }

    // While next() sleeps for a batch, `check` runs on the caller's thread every `every`; when it
    // returns true, next() throws wait_interrupted, takes nothing, and the pipeline runs on. For a
    // consumer that must stay responsive while the data is late: the Python binding checks for
    // Ctrl-C this way. Call before the first next().
    void set_wait_check(std::function<bool()> check, std::chrono::milliseconds every = std::chrono::milliseconds(100)) {
        delivery_.set_wait_check(std::move(check), every);
    }

    // Workers running now (the autotuner parks and wakes them; fixed when config.workers was given).
    unsigned active_workers() const noexcept {
        return delivery_.started() ? target_workers_.load(std::memory_order_relaxed) : memory_.workers;
    }
    // Batches the workers may run ahead of the trainer now (raised by the autotuner when prefetch = 0).
    std::size_t prefetch_depth() const noexcept { return delivery_.prefetch_depth(memory_); }

    // Where the trainer is: restoring this continues with the batch after the last one returned.
    const pipeline_state& state() const noexcept { return delivery_.state(); }

    // Continues from a saved state (any worker count; any world size with the same global batch).
    // Only before the first next(). Throws config_error when the state does not belong here.
    // A state saved with another global batch (batch_size x world size) is refused, unless
    // `change` is global_batch_change::from_same_sample: the run then goes on from the sample the
    // saved one would have drawn next (with_global_batch, sampling/sampler.hpp), steps keep their
    // numbers, and `epochs` ends the run where the epoch it names begins from there. Tell the user:
    // the batches from there match neither a run with the old batch nor one with the new.
    void restore(const pipeline_state& s, global_batch_change change = global_batch_change::refuse) {
        restore(s, change, mixture_change::refuse);
    }
    // A mixture (a data spec naming a mixture file): a state saved with another schedule (or a blend's
    // fixed weights) is refused, unless `change` is mixture_change::from_step: the run then goes on
    // with this pipeline's schedule from the saved step, its targets counted from the saved counts
    // (sampler::with_mixture_from_step); the schedule's stages keep their step numbers.
    void restore(const pipeline_state& s, mixture_change change) { restore(s, global_batch_change::refuse, change); }
    void restore(const pipeline_state& s, global_batch_change change, mixture_change mixing) {
        if (delivery_.started()) throw config_error("restore", "call restore() before the first next()");
        if (mixing == mixture_change::from_step) {
            if (!mixture_) throw config_error("restore", "mixture_change::from_step is for a pipeline mixed by a schedule");
            if (change != global_batch_change::refuse)
                throw config_error("restore", "a mixture goes on with its global batch: give mixture_change::from_step alone");
            sampler_->restore(sampler_->with_mixture_from_step(s));
            delivery_.set_state(sampler_->state());
            return;
        }
        const std::uint64_t global = sampler_->config().global_batch;
        const bool rebase = change == global_batch_change::from_same_sample && s.global_batch != global;
        if (rebase) {  // the saved position is checked against its own batch before it is carried over
            sampler_config saved = sampler_->config();
            saved.global_batch = s.global_batch;
            saved.rank = 0;
            saved.world_size = 1;
            make_sampler(saved)->restore(s);
        }
        sampler_->restore(rebase ? with_global_batch(s, global) : s);
        if (sampler_->state().rebased() && config_.epochs && sources_.size() == 1) {
            const std::uint64_t end = sampler_->first_step_of_epoch(config_.epochs);
            end_step_ = run_end_step_ = config_.max_steps ? std::min(config_.max_steps, end) : end;
            end_rebased_ = true;
        } else if (end_rebased_) {  // an earlier restore() of this kind set the end
            end_step_ = run_end_step_ = planned_end_step_;
            end_rebased_ = false;
        }
        delivery_.set_state(sampler_->state());
    }

    // A mixture: new weights (one per domain, in the mixture file's order; finite, at least 0, not all
    // 0) from `step` on, e.g. from per-domain losses (DoReMi, online data mixing). From that step each
    // domain's target grows by its share of these; what was drawn before stays. Recorded in state()
    // at once, so a state saved before `step` is reached resumes with them, and the stream is the
    // same whenever the call was made: a deterministic trainer that sets the same weights at the
    // same step after a resume gets the uninterrupted run's batches. Workers plan ahead, so `step`
    // must not be planned yet: state().step + planning_horizon() never is. Throws config_error for a
    // pipeline without a schedule, bad weights, a step planned already (naming the first free one),
    // or a step before one set earlier.
    void set_mixture_weights(const std::vector<double>& weights, std::uint64_t step) {
        if (!mixture_) throw config_error("mixture", "weights during the run are for a pipeline mixed by a schedule (a mixture file)");
        const std::lock_guard lock(planner_);
        if (const std::uint64_t free = sampler_->state().step; step < free)
            throw config_error("step", "step " + std::to_string(step) + " is planned already; the first step new weights can take is " +
                                           std::to_string(free) + " (state().step + planning_horizon() always can)");
        sampler_->set_mixture_weights(weights, step);  // checks the weights and the order of steps
        delivery_.add_weights_change({step, weights});
    }
    // The same from the first step not planned yet, which is returned (recorded in state() like the
    // above). When that is depends on how far the workers ran ahead: for a stream that does not
    // depend on timing, name the step.
    std::uint64_t set_mixture_weights(const std::vector<double>& weights) {
        if (!mixture_) throw config_error("mixture", "weights during the run are for a pipeline mixed by a schedule (a mixture file)");
        const std::lock_guard lock(planner_);
        const std::uint64_t step = sampler_->state().step;
        sampler_->set_mixture_weights(weights, step);
        delivery_.add_weights_change({step, weights});
        return step;
    }
    // A mixture's domain names, in its file's order (empty for other pipelines).
    std::vector<std::string> domain_names() const { return mixture_ ? mixture_->names() : std::vector<std::string>{}; }
    // How many steps past state().step the workers may have planned: a batch in every ring slot, one
    // more being filled by each worker. Weights set for state().step + planning_horizon() or later are
    // always accepted.
    std::uint64_t planning_horizon() const noexcept { return memory_.slots + memory_.workers + 1; }

    // One dataset: the run starts at the first step of `epoch` (0-based), as if the epochs before had
    // been read: the batches and states a run from the start gives from there. max_steps and epochs
    // still end it at the step they would. With `only_that_epoch` it also ends after that epoch's last
    // step (what a DataLoader's set_epoch means: the next pass is that epoch). Only before the first
    // next(). Throws config_error (after next(); a blend, whose datasets each walk their own epochs).
    void set_epoch(std::uint64_t epoch, bool only_that_epoch = false) {
        if (delivery_.started()) throw config_error("set_epoch", "call set_epoch() before the first batch");
        const sampler_state start = sampler_->state_at_epoch(epoch);  // a walk from step 0 with this batch
        if (end_rebased_) {  // an earlier restore() with another global batch set the end: no longer
            run_end_step_ = planned_end_step_;
            end_rebased_ = false;
        }
        end_step_ = run_end_step_;
        if (only_that_epoch) {
            const std::uint64_t next = sampler_->state_at_epoch(epoch + 1).step;
            end_step_ = end_step_ ? std::min(end_step_, next) : next;
        }
        sampler_->restore(start);
        delivery_.set_state(sampler_->state());
    }

    // Workers stop and join. Batches already published can still be taken with next(); nothing new is
    // made. Idempotent.
    void stop() noexcept {
        delivery_.close();
        parked_.notify();
        for (auto& t : threads_)
            if (t.joinable()) t.join();
        if (fetcher_) fetcher_->join();
    }

    // A snapshot of the counters. Call from the consumer's thread (the one calling next()).
    pipeline_stats stats() const {
        pipeline_stats s;
        delivery_.fill(s, config_, memory_);
        telemetry_.fill(s);
        detail::fill_remote_reads(s, remote_start_);
        if (sources_.size() > 1) {  // per dataset: what the trainer received from each, where it is, its share now
            const sampler_state& st = delivery_.state();
            std::vector<double> shares = sampler_->mixture_shares(st);
            if (shares.empty()) {
                double total = 0;
                for (double w : weights_) total += w;
                for (double w : weights_) shares.push_back(w / total);
            }
            for (std::size_t i = 0; i < sources_.size(); ++i)
                s.datasets.push_back({mixture_ ? mixture_->names()[i] : std::to_string(i + 1) + ": " + sources_[i].source->describe(),
                                      st.taken[i], st.taken[i] * config_.seq_len, st.epoch[i], shares[i]});
            s.next_step = st.step;
            if (st.mixed()) {
                s.mixture_from_step = st.mixture_step;
                s.mixture_weights_set = st.mixture == 2 ? 1 : 0;
            }
        }
        if (fetch_ahead_) {
            const fetch_ahead_counts f = fetch_ahead_->counts();
            s.remote_fetch_ahead_bytes = f.taken_bytes;
            s.remote_fetch_ahead_unused_bytes = f.unused_bytes;
            s.remote_fetch_ahead_steps = f.steps_ahead;
            s.remote_fetch_ahead_requests = f.requests_in_flight;
        }
        for (unsigned w = 0; w < memory_.workers; ++w) {
            const source_counters& c = counters_[w];
            s.bytes_read += c.bytes_read.load(std::memory_order_relaxed);
            s.read_s += c.read_ns.load(std::memory_order_relaxed) * 1e-9;
            s.tokenize_s += c.tokenize_ns.load(std::memory_order_relaxed) * 1e-9;
            s.assemble_s += c.assemble_ns.load(std::memory_order_relaxed) * 1e-9;
        }
        s.assemble_s += collate_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.plan_s = plan_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.padding_tokens = padding_.load(std::memory_order_relaxed);
        s.workers_active = active_workers();
        s.io_backend = io_reason_;
        s.workers_reason = workers_reason_;
        return s;
    }

    // Range-for over batches: for (auto& b : pipeline) { ... }. Ends after max_steps (or never).
    using iterator = batch_iterator<pipeline>;
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

private:
    // The shape and the numbers, before any source is opened: throws config_error naming the field.
    static void check_shape(const pipeline_config& c, std::size_t datasets) {
        if (c.batch_size == 0 || c.batch_size > INT32_MAX)
            throw config_error("batch_size", "must be in [1, 2^31 - 1]");  // rows are int32 in a slot
        if (c.seq_len == 0 || c.seq_len > (1u << 30)) throw config_error("seq_len", "must be in [1, 2^30]");
        (void)batch_layout::make(c.batch_size, c.seq_len, c.mode == sample_mode::packed);  // the slot's size fits
        if (c.prefetch == 1) throw config_error("prefetch", "needs at least 2 batches (one in use, one being filled)");
        constexpr unsigned max_workers = 1024;  // scratch and threads are per worker: a typo must not size memory
        if (c.workers > max_workers)
            throw config_error("workers", std::to_string(c.workers) + " is more than " + std::to_string(max_workers));
        if (c.max_workers > max_workers)
            throw config_error("max_workers", std::to_string(c.max_workers) + " is more than " + std::to_string(max_workers));
        if (c.workers && c.max_workers) throw config_error("max_workers", "bounds the autotuner, which runs only with workers = 0");
        if (c.rank < -1) throw config_error("rank", "must be -1 (from the launcher) or a rank");
        if (c.world_size < -1 || c.world_size == 0) throw config_error("world_size", "must be -1 (from the launcher) or at least 1");
        if (datasets == 0) throw config_error("dataset", "no dataset given");
        if (datasets > 1 && c.tail != tail_policy::drop)
            throw config_error("tail", "a blend has no epoch end to pad (each dataset cycles through its own epochs)");
        if (datasets > 1 && c.epochs)
            throw config_error("epochs", "a blend has no epochs (each dataset cycles through its own); end it with max_steps");
    }

    // What only the opened sources tell: weights, and options for a kind of data that is not there.
    void check_sources() {
        for (std::size_t i = 0; i < sources_.size(); ++i) {
            if (!sources_[i].source) throw config_error("dataset", "source " + std::to_string(i + 1) + " is null");
            detail::check_weight(sources_[i].weight, i + 1);
        }
        auto has = [&](source_kind k) {
            return std::any_of(sources_.begin(), sources_.end(), [&](const weighted_source& s) { return s.source->kind() == k; });
        };
        // Set explicitly (a command line, JSON, Python) or, in C++, to other than the default.
        if (!has(source_kind::tokens))
            if (const auto set = detail::options_set_for(config_, data_scope::tokens); !set.empty())
                throw config_error(set.front(), "set, but the data has no token shards (text is read with pread)");
        if (!has(source_kind::text))
            if (const auto set = detail::options_set_for(config_, data_scope::text); !set.empty())
                throw config_error(set.front(), "set, but the data has no JSONL/text (shards are tokenized already)");
        for (const auto& s : sources_)
            if (const auto* t = dynamic_cast<const text_source*>(s.source.get());
                t && config_.text != text_config{} && config_.text != t->config())
                throw config_error("text", "differs from the options the text source was opened with");
    }

    // Picks the number of slots within the budget (the config's prefetch if given). Throws config_error
    // when even two slots do not fit.
    // Remote data (`remote_step_bytes`: a step's ranges) gets a fetch-ahead share of what is left after
    // the slots the ring needs and the fetch thread's own sampler (`planner_bytes`), charged only when
    // it runs.
    memory_plan plan_memory(std::uint64_t budget, unsigned workers, std::size_t slot_bytes, std::uint64_t worker_bytes,
                            std::uint64_t index_bytes, std::uint64_t remote_step_bytes, std::uint64_t planner_bytes) const {
        memory_plan p{
            .budget = budget, .slot_bytes = slot_bytes, .worker_bytes = worker_bytes, .index_bytes = index_bytes, .workers = workers};
        std::uint64_t fixed = workers * worker_bytes + index_bytes;
        if (remote_step_bytes && config_.shards.fetch_ahead != 0) {
            const std::uint64_t needed = fixed + std::max<std::uint64_t>(2, config_.prefetch) * slot_bytes + planner_bytes;
            const std::uint64_t share = budget > needed ? (budget - needed) / defaults::fetch_ahead_budget_divisor : 0;
            if (config_.shards.fetch_ahead > 0) {  // asked for: it fits, or the error says what would
                p.fetch_ahead_bytes = static_cast<std::uint64_t>(config_.shards.fetch_ahead) * remote_step_bytes;
                if (p.fetch_ahead_bytes > share)
                    throw config_error("fetch_ahead", std::to_string(config_.shards.fetch_ahead) + " steps of " +
                                                          std::to_string(remote_step_bytes) + " bytes exceed the " + std::to_string(share) +
                                                          " bytes the memory budget leaves for fetching ahead (" + std::to_string(budget) +
                                                          "): raise memory_budget or fetch fewer steps ahead");
            } else {
                const std::uint64_t bytes = std::min(share, defaults::fetch_ahead_max_steps * remote_step_bytes);
                p.fetch_ahead_bytes = bytes >= 2 * remote_step_bytes ? bytes : 0;
            }
            if (p.fetch_ahead_bytes) {
                p.index_bytes += planner_bytes;
                fixed += p.fetch_ahead_bytes + planner_bytes;
            }
        }
        const std::size_t start = std::max<std::size_t>(2, defaults::start_depth_per_worker * std::size_t(workers));
        std::size_t wanted = config_.prefetch ? config_.prefetch : start + std::max<std::size_t>(defaults::min_depth_headroom, start);
        if (!config_.prefetch)  // small batches: deeper, while the ring stays small (defaults.hpp)
            wanted =
                std::max<std::size_t>(wanted, std::min<std::uint64_t>(defaults::max_depth_per_worker * std::uint64_t(workers),
                                                                      defaults::deep_ring_bytes / std::max<std::size_t>(1, slot_bytes)));
        const std::uint64_t fits = budget > fixed ? (budget - fixed) / std::max<std::size_t>(1, slot_bytes) : 0;
        if (fits < 2)
            throw config_error("memory_budget", std::to_string(budget) + " bytes cannot hold 2 batches of " + std::to_string(slot_bytes) +
                                                    " bytes plus " + std::to_string(fixed) + " bytes of worker scratch and index (" +
                                                    std::to_string(workers) + " workers): raise it or shrink batch_size x seq_len");
        if (config_.prefetch && config_.prefetch > fits)
            throw config_error("prefetch", std::to_string(config_.prefetch) + " batches of " + std::to_string(slot_bytes) +
                                               " bytes exceed the memory budget of " + std::to_string(budget) + " bytes (" +
                                               std::to_string(fits) + " fit)");
        p.slots = static_cast<std::size_t>(std::min<std::uint64_t>(wanted, fits));
        p.depth = config_.prefetch ? p.slots : std::min(start, p.slots);
        return p;
    }

    // One stats line: the GPU's figures since the last line, then the snapshot.
    void log_line(bool final) {
        telemetry_.sample_gpu();
        telemetry_.write(stats(), final);
    }

    void start() {
        // What can throw comes before the ring exists: once started() is true, next() waits on producers.
        std::string reasons;
        {
            host_memory_memo memory_once;  // every source's reader chosen against one reading (it fills it: not const)
            for (const auto& s : sources_) {
                const std::string r = s.source->prepare(source_context::of(config_));
                if (reasons.find(r) == std::string::npos) reasons += (reasons.empty() ? "" : "; ") + r;
            }
        }
        io_reason_ = std::move(reasons);
        std::vector<std::unique_ptr<sampler>> planners;
        if (own_planners_)
            for (unsigned w = 0; w < memory_.workers; ++w) {
                planners.push_back(std::make_unique<sampler>(sampling_datasets(), std::vector<double>{1.0}, sampler_->config()));
                planners.back()->restore(sampler_->state());
            }
        planners_ = std::move(planners);
        worker_cpus_ = {};
        // "auto" and "cuda" name no device: the current one of the thread taking the first batch (the
        // trainer's, after its cudaSetDevice). Here and not at construction, which touches no driver.
        pipeline_config c = config_;
        c.device = device_ = resolve_device(config_.device);
        if (c.device.kind != device_kind::cpu && gpu_probe())
            worker_cpus_ = worker_cpus_for_gpu(read_topology(), gpu_pci_bus_id(c.device.index));
        try {
            delivery_.start(c, memory_, layout_, autotune_, memory_.workers, worker_cpus_);
            telemetry_.start(delivery_.on_device(), c.device.index);
        } catch (const std::bad_alloc&) {
            throw resource_error("the staging ring (" + std::to_string(memory_.slots) + " slots of " + std::to_string(layout_.bytes) +
                                 " bytes) could not be allocated: a memory limit (ulimit -v, a cgroup) was reached; lower memory_budget, "
                                 "batch_size or seq_len, or raise the limit");
        }
        active_.store(memory_.workers);
        target_workers_.store(memory_.workers);
        next_step_.store(sampler_->state().step);
        // Where the workers start, for the fetch-ahead's own sampler (they advance sampler_ at once). Only
        // copied for it, and not kept: a mixture's state holds seven numbers per domain, and a copy made
        // and freed here stays in the allocator's memory for the whole run.
        std::optional<sampler_state> start;
        if (memory_.fetch_ahead_bytes) start = sampler_->state();
        if (memory_.fetch_ahead_bytes)
            fetch_ahead_ =
                std::make_unique<fetch_ahead>(memory_.fetch_ahead_bytes, [this] { return next_step_.load(std::memory_order_relaxed); });
        try {
            for (unsigned w = 0; w < memory_.workers; ++w) threads_.emplace_back([this, w] { work(w); });
            if (start) start_fetch_ahead(*start);
        } catch (const std::system_error& e) {  // no thread for a worker (a pids limit): the ring is failed, so next() reports it
            const auto failure = std::make_exception_ptr(resource_error(
                "worker thread " + std::to_string(threads_.size() + 1) + " of " + std::to_string(memory_.workers) +
                " could not be started (" + e.what() +
                "): a process or thread limit (ulimit -u, a container's pids limit) was reached; use fewer workers or raise the limit"));
            delivery_.ring().fail(failure);
            stop();
            std::rethrow_exception(failure);
        } catch (...) {
            delivery_.ring().fail(std::current_exception());
            stop();
            throw;
        }
    }

    void work(unsigned index) {
        detail::name_this_thread("feedline-w" + std::to_string(index));
        staging_ring& ring = delivery_.ring();
        // A remote read that retries gives up within 100 ms of the pipeline stopping (stop(), the
        // destructor, another worker's error), so nothing waits out a slow bucket's backoff.
        const detail::scoped_io_cancel cancel([&ring] { return ring.closed(); });
        const detail::scoped_fetch_ahead ahead(fetch_ahead_.get());  // remote ranges fetched for this worker's steps
        try {
            if (!worker_cpus_.empty()) pin_to(worker_cpus_);
            // Each source's writer, found when a batch first holds its samples: a writer this thread
            // made that accepts the source too (source_worker::bind: one for all of a mixture's token
            // shard domains), else a new one. A source costs a worker 4 bytes (its writer's index), and
            // nothing before the worker meets it.
            struct made_writer {
                std::unique_ptr<source_worker> writer;
                std::uint32_t bound;  // the source it writes for now
                bool wrote;           // in this batch: finish() is due
                bool shares = false;  // it accepts other sources (in `sharing`)
            };
            std::vector<made_writer> made;
            source_counters& counted = counters_[index];  // this thread's, whichever source its writers write for
            std::vector<std::uint32_t> sharing;           // made writers that may take other sources (few: one per kind)
            constexpr std::uint32_t no_writer = ~std::uint32_t{0};
            std::vector<std::uint32_t> writer_of(sources_.size(), no_writer);  // index into `made`
            std::vector<std::uint32_t> wrote;                                  // this batch's writers, for finish()
            // Source d's writer, bound to d and listed for this batch's finish().
            const auto writer = [&](std::uint32_t d) -> source_worker& {
                std::uint32_t k = writer_of[d];
                const batch_source& source = *sources_[d].source;
                if (k == no_writer) {
                    const auto taker =
                        std::find_if(sharing.begin(), sharing.end(), [&](std::uint32_t m) { return made[m].writer->accepts(source); });
                    if (taker != sharing.end()) {
                        k = *taker;
                    } else {
                        k = static_cast<std::uint32_t>(made.size());
                        made.push_back({sources_[d].source->make_worker(source_context::of(config_), counted), d, false});
                        if (made.back().writer->accepts(source)) {
                            sharing.push_back(k);
                            made.back().shares = true;
                        }
                    }
                    writer_of[d] = k;
                }
                made_writer& m = made[k];
                if (m.bound != d) {
                    m.writer->bind(source, counted);
                    m.bound = d;
                }
                if (!m.wrote) {
                    m.wrote = true;
                    wrote.push_back(k);
                }
                return *m.writer;
            };
            const auto finish_writers = [&](const slot_view& view) {
                for (const std::uint32_t k : wrote) {
                    made[k].wrote = false;
                    made[k].writer->finish(view);
                }
                wrote.clear();
            };
            if (sources_.size() == 1) {  // one writer, made before the first batch
                made.push_back({sources_[0].source->make_worker(source_context::of(config_), counted), 0, false});
                writer_of[0] = 0;
            }
            std::vector<std::uint32_t> by_dataset;  // the batch's rows ordered by dataset: one run per writer
            struct row_run {
                std::uint32_t dataset, first, rows;  // by_dataset[first, first + rows) are the dataset's
            };
            std::vector<row_run> runs;
            runs.reserve(all_rows_.size());
            constexpr std::size_t writer_lookahead = 3;  // runs between two links of a source's chain (below)
            batch_plan plan;                             // reused: no allocation per batch once warm
            sampler_step_delta after;
            sampler_state own_after;  // own planners: the state after the step (one dataset: small)
            detail::row_boundaries bounds;
            int excluded_cpu = -1;  // the trainer's CPU this thread's affinity leaves out
            for (;;) {
                // Parked by the autotuner: only timing changes, never which batch holds what.
                parked_.wait(
                    [&] { return index < target_workers_.load(std::memory_order_relaxed) || ring.closed() || planned_all_.load(); });
                delivery_.placement().keep_off(excluded_cpu);  // exec/trainer_cpu.hpp
                const auto t0 = std::chrono::steady_clock::now();
                if (!plan_next(index, plan, after, own_after, ring)) break;
                plan_ns_.fetch_add(detail::elapsed_ns(t0), std::memory_order_relaxed);
                std::byte* slot = ring.acquire(plan.step);
                if (slot == nullptr) break;
                delivery_.set_slot_state(plan.step, after);
                const slot_view view(slot, layout_);
                for (std::uint32_t r = 0; r < plan.samples.size(); ++r)
                    view.datasets[r] = static_cast<std::int32_t>(plan.samples[r].dataset);
                if (sources_.size() == 1) {  // made before the loop
                    made[0].writer->write(plan, all_rows_, view);
                    made[0].writer->finish(view);
                } else {  // O(batch), whatever the number of sources
                    const auto before = [&](std::uint32_t a, std::uint32_t b) {
                        const auto da = plan.samples[a].dataset, db = plan.samples[b].dataset;
                        return da != db ? da < db : a < b;
                    };
                    // The planner sorted the rows so already (plan_drawn): checked in one pass, strictly
                    // increasing over every row, instead of a second sort of the batch.
                    const auto& sorted = plan.by_dataset;
                    bool reuse = sorted.size() == all_rows_.size();
                    for (std::size_t i = 0; reuse && i < sorted.size(); ++i)
                        reuse = sorted[i] < all_rows_.size() && (i == 0 || before(sorted[i - 1], sorted[i]));
                    if (reuse) {
                        by_dataset.assign(sorted.begin(), sorted.end());
                    } else {
                        by_dataset.assign(all_rows_.begin(), all_rows_.end());
                        std::sort(by_dataset.begin(), by_dataset.end(), before);  // no allocation
                    }
                    runs.clear();
                    for (std::size_t first = 0, last = 0; first < by_dataset.size(); first = last) {
                        const std::uint32_t d = plan.samples[by_dataset[first]].dataset;
                        while (last < by_dataset.size() && plan.samples[by_dataset[last]].dataset == d) ++last;
                        runs.push_back({d, static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(last - first)});
                    }
                    // With thousands of sources each run's source is a chain of cache misses (its
                    // entry, the object that bind() reads, its writer's index here, then what the
                    // source's own objects hold): each link is requested a few runs ahead, once the
                    // one before it has had time to arrive.
                    for (std::size_t j = 0; j < runs.size(); ++j) {
                        // Runs whose sources one writer takes (a mixture's token shard domains: all of
                        // them), from this one on, in one call: the writer stages their misses itself.
                        if (const std::uint32_t k = writer_of[runs[j].dataset]; k != no_writer && made[k].shares) {
                            std::size_t end = j + 1;
                            while (end < runs.size() && writer_of[runs[end].dataset] == k) ++end;
                            if (end - j > 1) {
                                made_writer& m = made[k];
                                if (!m.wrote) {
                                    m.wrote = true;
                                    wrote.push_back(k);
                                }
                                const std::uint32_t rows = runs[end - 1].first + runs[end - 1].rows - runs[j].first;
                                m.bound = no_writer;  // unknown if it throws part of the way
                                m.writer->write_sources(plan, std::span<const std::uint32_t>(by_dataset).subspan(runs[j].first, rows),
                                                        sources_, counted, view);
                                m.bound = runs[end - 1].dataset;
                                j = end - 1;
                                continue;
                            }
                        }
                        const auto ahead = [&](std::size_t links) -> const weighted_source* {
                            const std::size_t at = j + links * writer_lookahead;
                            return at < runs.size() ? &sources_[runs[at].dataset] : nullptr;
                        };
                        if (const auto* e = ahead(4)) detail::prefetch(e);
                        if (const auto* e = ahead(3)) {
                            detail::prefetch(e->source.get());
                            detail::prefetch(&writer_of[runs[j + 3 * writer_lookahead].dataset]);
                        }
                        const auto first_of = [&](std::size_t links) -> const sample_plan& {
                            return plan.samples[by_dataset[runs[j + links * writer_lookahead].first]];
                        };
                        if (const auto* e = ahead(2)) e->source->prefetch_for_write(1, first_of(2));
                        if (const auto* e = ahead(1)) e->source->prefetch_for_write(2, first_of(1));
                        writer(runs[j].dataset)
                            .write(plan, std::span<const std::uint32_t>(by_dataset).subspan(runs[j].first, runs[j].rows), view);
                    }
                    finish_writers(view);
                }
                if (layout_.packed) {
                    const auto t1 = std::chrono::steady_clock::now();
                    padding_.fetch_add(detail::finish_packed_rows(plan, view, bounds, config_.ignore_index), std::memory_order_relaxed);
                    collate_ns_.fetch_add(detail::elapsed_ns(t1), std::memory_order_relaxed);
                }
                if (config_.tail == tail_policy::mask) mask_padding_rows(plan, view);
                if (fetch_ahead_) fetch_ahead_->step_done(plan.step);
                ring.publish(plan.step, layout_.bytes, {layout_.batch, layout_.seq_len});
            }
        } catch (...) {
            ring.fail(std::current_exception());
        }
        if (active_.fetch_sub(1) == 1) ring.close();  // the last worker out ends the stream
        parked_.notify();                             // parked workers see the end or the failure
    }

    // The next step's plan and what it changes in the state; false when there is none (max_steps
    // reached, or stopped). `scratch`: storage for an own planner's state after the step.
    bool plan_next(unsigned index, batch_plan& plan, sampler_step_delta& after, sampler_state& scratch, const staging_ring& ring) {
        if (own_planners_) {
            if (ring.closed()) return false;
            const std::uint64_t step = next_step_.fetch_add(1, std::memory_order_relaxed);
            if (end_step_ && step >= end_step_) return planned_all();
            planners_[index]->plan_at(step, plan, scratch, after);
            return true;
        }
        {
            detail::spin_then_lock(planner_, defaults::planner_spin);  // held for microseconds: spin before sleeping
            const std::lock_guard lock(planner_, std::adopt_lock);
            if (ring.closed()) return false;
            if (end_step_ && sampler_->state().step >= end_step_) return planned_all();
            sampler_->next_drawn(plan, after);                        // the sequential part: each sample's dataset and position
            next_step_.store(after.step, std::memory_order_relaxed);  // for the fetch ahead (own planners count it themselves)
        }
        // The samples' segments outside the lock, beside the other workers (each stream has its own
        // lock): a mixture of 10,000 domains spent half its planning there, every worker waiting.
        sampler_->plan_drawn(plan);
        return true;
    }

    // Remote data: the fetch-ahead store (created here, before the workers read through it) and thread.
    void start_fetch_ahead(const sampler_state& start) {
        if (memory_.fetch_ahead_bytes == 0) return;
        detail::fetch_ahead_thread::options o{.context = source_context::of(config_),
                                              .fixed_steps = config_.shards.fetch_ahead > 0 ? std::uint64_t(config_.shards.fetch_ahead) : 0,
                                              .end_step = end_step_,
                                              .next_unclaimed = [this] { return next_step_.load(std::memory_order_relaxed); },
                                              .stopped = [this] { return delivery_.ring().closed() || planned_all_.load(); }};
        for (const auto& s : sources_) o.sources.push_back(s.source.get());
        auto planner = make_sampler(sampler_->config());
        planner->restore(start);
        try {
            fetcher_ = std::make_unique<detail::fetch_ahead_thread>(std::move(planner), std::move(o), *fetch_ahead_);
        } catch (const std::system_error&) {
            // No thread for it (a pids limit): the workers read every range themselves, as without it.
        }
    }
    // Where the iteration ends: max_steps, or the end of `epochs` passes (one dataset; windows have the
    // same number of steps every epoch, packed epochs are laid out to count theirs).
    std::uint64_t end_of_run(std::uint64_t global_batch) {
        std::uint64_t end = config_.max_steps;
        if (!config_.epochs) return end;
        const std::uint64_t limit = sampler::max_step / global_batch;
        std::uint64_t steps = 0;
        if (config_.mode == sample_mode::windows) {
            const std::uint64_t per = sampler_->steps_in_epoch(0);
            steps = per > limit / config_.epochs ? limit : per * config_.epochs;
        } else {
            for (std::uint64_t e = 0; e < config_.epochs && steps < limit; ++e) steps += sampler_->steps_in_epoch(e);
        }
        if (steps == 0)
            throw config_error(
                "epochs",
                "an epoch holds fewer samples than one global batch, so a pass has no step; use tail = pad or mask, or a smaller batch");
        return end ? std::min(end, steps) : steps;
    }

    // tail = mask: the rows that complete an epoch's last batch (samples from its start again) get
    // ignore_index targets, so a loss over the batch counts each sample of the epoch once.
    void mask_padding_rows(const batch_plan& plan, const slot_view& view) {
        const auto ignore = static_cast<std::int32_t>(config_.ignore_index);
        std::uint64_t masked = 0;  // targets that counted until now (packed rows' own padding is counted already)
        for (std::uint32_t r = 0; r < plan.samples.size(); ++r)
            if (plan.samples[r].padding) {
                std::int32_t* t = view.target_row(r);
                for (std::uint64_t i = 0; i < view.seq_len; ++i) {
                    masked += t[i] != ignore;
                    t[i] = ignore;
                }
            }
        if (masked) padding_.fetch_add(masked, std::memory_order_relaxed);
    }

    bool planned_all() {
        planned_all_.store(true);  // parked workers must leave too, or the stream never ends
        parked_.notify();
        return false;
    }

    // Remote reads are counted from `start`, before the sources opened: opening reads headers and
    // indexes (often whole cache blocks, which later windows then hit), and they are this pipeline's.
    pipeline(const remote_reads& start, const std::vector<weighted_spec>& blend, const pipeline_config& config)
            : pipeline(start, (check_shape(config, blend.size()), read_mixture_spec(blend, tokens_per_step(config))), blend, config) {}
    pipeline(const remote_reads& start, std::optional<mixture_spec> mixture, const std::vector<weighted_spec>& blend,
             const pipeline_config& config)
            : sources_(mixture ? detail::open_domains(*mixture, config) : detail::open_sources(blend, config)),
              config_(config) {
        if (mixture) {
            mixture_ = mixture->schedule;
            mixture_path_ = mixture->path;
        }
        construct();
        remote_start_ = start;
    }
    // Global batch x seq_len, for a mixture file's stages given by token count.
    static std::uint64_t tokens_per_step(const pipeline_config& c) {
        const int world = c.world_size >= 0 ? c.world_size : launch_from_environment().world_size;
        return c.batch_size * static_cast<std::uint64_t>(std::max(world, 1)) * c.seq_len;
    }
    // A sampler over this pipeline's datasets: mixed by its schedule, or blended by weight.
    std::unique_ptr<sampler> make_sampler(const sampler_config& sc) const {
        if (mixture_) return std::make_unique<sampler>(sampling_datasets(), mixture_, sc);
        return std::make_unique<sampler>(sampling_datasets(), weights_, sc);
    }
    // The sampler's view of every source, made again for each sampler instead of kept: a mixture's
    // 10,000 domains would keep 72 bytes each for the few samplers made after the first.
    std::vector<sampler_dataset> sampling_datasets() const {
        std::vector<sampler_dataset> out;
        out.reserve(sources_.size());
        for (const auto& s : sources_) out.push_back(s.source->sampling(source_context::of(config_)));
        return out;
    }

    static void pin_to(const std::vector<int>& cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : cpus)
            if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
        (void)::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);  // best effort: placement, never correctness
    }

    std::vector<weighted_source> sources_;
    pipeline_config config_;
    device_choice device_;  // config_.device, resolved by start()
    std::vector<double> weights_;
    std::shared_ptr<const mixture_schedule> mixture_;  // null: fixed weights (or one dataset)
    std::string mixture_path_;                         // the mixture file, where a data spec named one
    std::unique_ptr<sampler> sampler_;
    std::uint64_t end_step_ = 0;          // end_step()
    std::uint64_t run_end_step_ = 0;      // what max_steps and epochs make it (set_epoch may end sooner)
    std::uint64_t planned_end_step_ = 0;  // the same from step 0 with one global batch throughout
    bool end_rebased_ = false;            // run_end_step_ follows a restore() with another global batch
    bool own_planners_ = false;
    std::vector<std::unique_ptr<sampler>> planners_;  // own_planners_: worker i's sampler
    std::atomic<std::uint64_t> next_step_{0};         // the next step a worker takes
    std::unique_ptr<fetch_ahead> fetch_ahead_;        // remote data: ranges fetched ahead (memory_.fetch_ahead_bytes)
    std::mutex planner_;                              // guards sampler_ once workers run
    batch_layout layout_;
    std::vector<std::uint32_t> all_rows_;  // 0 .. batch_size - 1: every row, for one source
    memory_plan memory_;
    remote_reads remote_start_ = detail::remote_counters::instance().snapshot();  // stats() counts remote reads from here
    bool autotune_ = false;
    std::string workers_reason_, io_reason_;
    std::vector<int> worker_cpus_;  // the GPU's local CPUs on a multi-node machine, else empty
    detail::delivery delivery_;     // the ring and the hand-off to the trainer
    detail::telemetry telemetry_;   // the stats log and the GPU's figures
    std::vector<std::thread> threads_;
    std::unique_ptr<detail::fetch_ahead_thread> fetcher_;
    std::atomic<unsigned> active_{0};
    std::atomic<unsigned> target_workers_{0};  // workers not parked (written by next())
    std::atomic<bool> planned_all_{false};
    detail::wait_point parked_;  // where parked workers sleep
    // What the writers read and how long it took, one per worker thread, each on a cache line of its
    // own: stats() sums them. Not one per source: a mixture has thousands, and none is reported alone.
    struct alignas(64) worker_counters : source_counters {};
    std::unique_ptr<worker_counters[]> counters_;
    std::atomic<std::uint64_t> plan_ns_{0}, collate_ns_{0}, padding_{0};
};

}  // namespace feedline
