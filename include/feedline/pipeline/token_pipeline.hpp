// feedline/pipeline/token_pipeline.hpp: feedline::token_pipeline, from a token dataset to batches on the
// device (feedline::pipeline in pipeline/pipeline.hpp picks it for Megatron and llm.c shards).
// Each worker takes the next step number and plans it (windows over an index of at most 4 MiB: with a
// sampler of its own, random access, so in parallel; otherwise with the shared sampler behind a
// mutex), reads that step's token ranges through its own reader, converts them into the step's ring
// slot in place (inputs, targets and, when packed, document boundaries), and publishes it (an async
// H2D copy with the pinned ring). The ring is the reorder window: the trainer receives steps in order
// whatever the number of workers, and the data of step k is a pure function of the config, so resume
// is exact with any worker count.
// state() is the sampler state after the last batch handed to the trainer (batches prefetched but not
// yet taken are not counted, so nothing is lost or repeated on resume).
// llm.c shards in windows mode are sampled as one token stream per shard (windows cross documents
// anyway), so opening them never scans the tokens for document delimiters; packed mode needs the
// documents and builds llm.c's document index on open.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <feedline/detail/thread_name.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/ring_consumer.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/storage/reader.hpp>

namespace feedline {

class token_pipeline {
public:
    // A Megatron prefix, an llm.c shard pattern, a directory or a list of them.
    token_pipeline(const std::string& dataset_spec, pipeline_config config)
        : token_pipeline(std::make_shared<const token_dataset>(dataset_spec), std::move(config)) {}

    // Validates everything and sizes memory; threads start at the first next() (so restore() can come
    // first). Throws config_error / format_error / io_error before any thread exists.
    token_pipeline(std::shared_ptr<const token_dataset> data, pipeline_config config) : data_(std::move(data)), config_(std::move(config)) {
        if (config_.batch_size == 0) throw config_error("batch_size", "must be at least 1");
        if (config_.seq_len == 0 || config_.seq_len > (1u << 30)) throw config_error("seq_len", "must be in [1, 2^30]");
        backend_ = parse_io_backend(config_.io_backend);
        device_ = parse_device(config_.device);
        const topology topo = read_topology();
        launch_info env = launch_from_environment();
        const int world = config_.world_size >= 0 ? config_.world_size : env.world_size;
        if (world < 1) throw config_error("world_size", "must be at least 1");
        sampler_config sc{.seq_len = config_.seq_len,
                          .global_batch = config_.batch_size * static_cast<std::uint64_t>(world),
                          .seed = config_.seed,
                          .mode = config_.mode,
                          .shuffle = config_.shuffle,
                          .tail = config_.tail,
                          .rank = config_.rank >= 0 ? config_.rank : env.rank,
                          .world_size = world};
        if (streams_are_shards()) shard_view_ = {data_.get()};
        sampler_ = make_sampler(sc);
        // Windows with a small index: every worker plans with a sampler of its own (plan_at), so
        // planning runs in parallel instead of behind planner_ (with 2 workers, waiting for the lock
        // cost each worker as much as planning itself). Packed mode plans sequentially: plan_at would
        // lay out every epoch before the step's.
        const std::uint64_t index_bytes = sampler_->stream(0).memory_bytes();
        own_planners_ = config_.mode == sample_mode::windows && index_bytes <= own_planner_max_bytes;
        layout_ = batch_layout::make(config_.batch_size, config_.seq_len, config_.mode == sample_mode::packed);

        unsigned workers = config_.workers;
        if (workers == 0) {
            workers = config_.max_workers ? config_.max_workers : static_cast<unsigned>(std::clamp(topo.usable_cores() - 1.0, 1.0, 8.0));
            autotune_ = workers > 1;
        }
        const std::uint64_t budget = config_.memory_budget ? config_.memory_budget : memory_available_to_process(topo) / 4;
        const std::uint64_t raw = config_.batch_size * (config_.seq_len + 1) * dtype_size(data_->dtype());
        memory_ = plan_memory(config_, budget, workers, layout_.bytes, raw + 64 * 1024, index_bytes * (own_planners_ ? workers + 1 : 1));
        consumer_.set_state(sampler_->state());
        consumer_.open_log(config_);
    }

    token_pipeline(const token_pipeline&) = delete;
    token_pipeline& operator=(const token_pipeline&) = delete;
    ~token_pipeline() { stop(); }

    const token_dataset& dataset() const noexcept { return *data_; }
    const pipeline_config& config() const noexcept { return config_; }
    const memory_plan& memory() const noexcept { return memory_; }
    int rank() const noexcept { return sampler_->rank(); }
    int world_size() const noexcept { return sampler_->world_size(); }

    // The next step's batch, in order; empty after max_steps. Rethrows a worker's error (a corrupt
    // shard found mid-epoch arrives here as the format_error naming file and offset), after which the
    // pipeline is stopped.
    std::optional<batch> next() {
        if (!consumer_.started()) start();
        auto h = consumer_.next(config_, [this] { stop(); }, [this] { return stats(); });
        if (!h) return std::nullopt;
        // Workers write slots themselves: each running worker is a producer of the ring.
        const unsigned n = active_workers();
        if (const unsigned want = consumer_.tune(n, n); want != n) target_workers_.store(want, std::memory_order_relaxed);
        return batch(std::move(*h), &layout_);
    }

    // Workers running now (the autotuner parks and wakes them; fixed when config.workers was given).
    unsigned active_workers() const noexcept { return target_workers_.load(std::memory_order_relaxed); }
    // Batches the workers may run ahead of the trainer now (raised by the autotuner when prefetch = 0).
    std::size_t prefetch_depth() const noexcept { return consumer_.prefetch_depth(memory_); }

    // Where the trainer is: restoring this continues with the batch after the last one returned.
    const sampler_state& state() const noexcept { return consumer_.state(); }

    // Continues from a saved state (any worker count; any world size with the same global batch).
    // Only before the first next(). Throws config_error when the state does not belong here.
    void restore(const sampler_state& s) {
        if (consumer_.started()) throw config_error("restore", "call restore() before the first next()");
        sampler_->restore(s);
        consumer_.set_state(sampler_->state());
    }

    // Workers stop and join; batches not taken are dropped. Idempotent.
    void stop() noexcept {
        consumer_.close();
        for (auto& t : threads_)
            if (t.joinable()) t.join();
    }

    // A snapshot of the counters. Call from the consumer's thread (the one calling next()).
    pipeline_stats stats() const {
        pipeline_stats s;
        consumer_.fill(s, config_, memory_);
        s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
        s.padding_tokens = padding_.load(std::memory_order_relaxed);
        s.read_s = read_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.assemble_s = assemble_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.plan_s = plan_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.workers_active = consumer_.started() ? active_workers() : memory_.workers;
        s.io_backend = io_reason_;
        return s;
    }

    // Range-for over batches: for (auto& b : pipeline) { ... }. Ends after max_steps (or never).
    using iterator = batch_iterator<token_pipeline>;
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

private:
    void start() {
        // What can throw comes before the ring exists: once started() is true, next() waits on producers.
        {
            auto probe = make_reader({.backend = backend_, .dataset_bytes = data_total_bytes()});
            io_reason_ = std::string(probe.name()) + (probe.reason().empty() ? "" : " (" + probe.reason() + ")");
        }
        std::vector<std::unique_ptr<sampler>> planners;
        if (own_planners_)
            for (unsigned w = 0; w < memory_.workers; ++w) {
                planners.push_back(make_sampler(sampler_->config()));
                planners.back()->restore(sampler_->state());
            }
        planners_ = std::move(planners);
        consumer_.start(config_, memory_, layout_, device_, autotune_, memory_.workers);
        active_.store(memory_.workers);
        target_workers_.store(memory_.workers);
        next_step_.store(sampler_->state().step);
        for (unsigned w = 0; w < memory_.workers; ++w) threads_.emplace_back([this, w] { work(w); });
    }

    // A shard as one "document": what the sampler sees of llm.c data in windows mode.
    struct shard_lengths {
        const token_dataset* data = nullptr;
        std::uint64_t document_count() const { return data->shard_count(); }
        std::uint64_t document_length(std::uint64_t i) const { return data->shard(i).tokens; }
    };
    bool streams_are_shards() const { return data_->format() == dataset_format::llmc && config_.mode == sample_mode::windows; }

    std::unique_ptr<sampler> make_sampler(const sampler_config& sc) const {
        if (streams_are_shards()) return std::make_unique<sampler>(shard_view_, sc);
        return std::make_unique<sampler>(*data_, sc, data_->shard_document_starts());
    }
    // Largest sampler index copied into every worker (llm.c shards in windows mode need bytes; a
    // Megatron dataset 8 per document, so up to ~500 000 documents).
    static constexpr std::uint64_t own_planner_max_bytes = 4u << 20;

    std::uint64_t data_total_bytes() const { return data_->total_tokens() * dtype_size(data_->dtype()); }

    void work(unsigned index) {
        detail::name_this_thread("feedline-w" + std::to_string(index));
        staging_ring& ring = consumer_.ring();
        try {
            any_reader reader = make_reader({.backend = backend_, .dataset_bytes = data_total_bytes()});
            mmap_reader* mapped = reader.get_if<mmap_reader>();  // zero-copy: convert straight from the mapping
            std::vector<std::byte> raw;
            std::vector<read_request> requests;
            std::vector<mapped_piece> pieces;
            row_boundaries bounds;
            batch_plan plan;       // reused: no allocation per batch once warm
            sampler_state after;
            int excluded_cpu = -1;  // the trainer's CPU this thread's affinity leaves out
            for (;;) {
                // Parked by the autotuner: only timing changes, never which batch holds what.
                while (index >= target_workers_.load(std::memory_order_relaxed) && !ring.closed() && !planned_all_.load())
                    std::this_thread::sleep_for(std::chrono::milliseconds(1));
                consumer_.placement().keep_off(excluded_cpu);  // exec/trainer_cpu.hpp
                auto t0 = std::chrono::steady_clock::now();
                if (own_planners_) {
                    if (ring.closed()) break;
                    const std::uint64_t step = next_step_.fetch_add(1, std::memory_order_relaxed);
                    if (config_.max_steps && step >= config_.max_steps) {
                        planned_all_.store(true);  // parked workers must leave too, or the stream never ends
                        break;
                    }
                    planners_[index]->plan_at(step, plan, after);
                } else {
                    std::lock_guard lock(planner_);
                    if (ring.closed()) break;
                    if (config_.max_steps && sampler_->state().step >= config_.max_steps) {
                        planned_all_.store(true);
                        break;
                    }
                    sampler_->next(plan);
                    after = sampler_->state();
                }
                auto t1 = std::chrono::steady_clock::now();
                plan_ns_.fetch_add(ns(t0, t1), std::memory_order_relaxed);
                std::byte* slot = ring.acquire(plan.step);
                if (slot == nullptr) break;
                consumer_.set_slot_state(plan.step, after);
                auto t2 = std::chrono::steady_clock::now();
                if (mapped != nullptr && config_.mode == sample_mode::windows) {
                    assemble_mapped(plan, *mapped, raw, requests, pieces, slot);
                    read_ns_.fetch_add(ns(t2, std::chrono::steady_clock::now()), std::memory_order_relaxed);
                } else {
                    read_plan(plan, reader, raw, requests);
                    auto t3 = std::chrono::steady_clock::now();
                    read_ns_.fetch_add(ns(t2, t3), std::memory_order_relaxed);
                    assemble(plan, raw, slot, bounds);
                    assemble_ns_.fetch_add(ns(t3, std::chrono::steady_clock::now()), std::memory_order_relaxed);
                }
                ring.publish(plan.step, layout_.bytes, {layout_.batch, layout_.seq_len});
            }
        } catch (...) {
            ring.fail(std::current_exception());
        }
        if (active_.fetch_sub(1) == 1) ring.close();  // the last worker out ends the stream
    }

    // A contiguous run of one window's tokens in the mapping: window `sample`, from its token `first`.
    struct mapped_piece {
        std::span<const std::byte> bytes;
        std::size_t sample = 0;
        std::uint64_t first = 0;
    };

    // Appends the read requests of one sample's segments (dest: consecutive from `dest`).
    std::uint64_t sample_requests(const sample_plan& sp, std::byte* dest, std::vector<read_request>& requests) const {
        const std::size_t item = dtype_size(data_->dtype());
        std::uint64_t bytes = 0;
        for (const segment& s : sp.segments) {
            if (streams_are_shards())
                data_->append_stream_requests(static_cast<std::uint32_t>(s.document), s.offset, s.length, dest, requests);
            else
                data_->append_requests(data_->document(s.document), s.offset, s.length, dest, requests);
            dest += s.length * item;
            bytes += s.length * item;
        }
        return bytes;
    }

    // Windows through an mmap reader: tokens go from the page cache straight into the slot (one pass,
    // as a hand-written gather loop would), no staging buffer. The batch's plan is known up front,
    // which a gather loop does not use: the views of all windows are resolved first, and while one
    // window is converted the cache lines of the next ones are requested, so the DRAM (and page-walk)
    // latency of a random window overlaps the conversion instead of stalling it (bench_end_to_end:
    // one worker went from 0.7x to ~1.0x of the gather loop).
    void assemble_mapped(const batch_plan& plan, mmap_reader& mapped, std::vector<std::byte>& raw, std::vector<read_request>& requests,
                         std::vector<mapped_piece>& pieces, std::byte* slot) {
        const std::size_t item = dtype_size(data_->dtype());
        const std::uint64_t T = config_.seq_len;
        auto* inputs = reinterpret_cast<std::int32_t*>(slot + layout_.inputs);
        auto* targets = reinterpret_cast<std::int32_t*>(slot + layout_.targets);
        std::uint64_t bytes = 0;
        raw.resize((T + 1) * item);  // requests need a destination; this path reads through view() instead
        pieces.clear();
        for (std::size_t i = 0; i < plan.samples.size(); ++i) {
            requests.clear();
            bytes += sample_requests(plan.samples[i], raw.data(), requests);
            std::uint64_t k = 0;  // the piece's first token within window i
            for (const read_request& r : requests) {
                pieces.push_back({mapped.view(*r.source, r.offset, r.length), i, k});
                k += r.length / item;
            }
        }
        // Requested ahead: the lines of the piece being converted (one burst of misses instead of one
        // at a time) and of the pieces after it, up to `prefetch_bytes` of pieces ahead (two uint16
        // windows at T = 1024), each piece's first `prefetch_bytes` at most (prefetch_lines).
        std::size_t next = 0;     // the first piece not requested yet
        std::uint64_t ahead = 0;  // bytes requested in pieces after the one being converted
        for (std::size_t p = 0; p < pieces.size(); ++p) {
            if (next == p) prefetch_lines(pieces[next++].bytes);
            else ahead -= pieces[p].bytes.size();
            while (next < pieces.size() && ahead < prefetch_bytes) {
                prefetch_lines(pieces[next].bytes);
                ahead += pieces[next++].bytes.size();
            }
            // Token k of the window goes to inputs[k] (k < T) and targets[k - 1] (k >= 1).
            const auto& [src, i, k] = pieces[p];
            const std::uint64_t n = src.size() / item;
            const std::uint64_t in_n = k < T ? std::min(n, T - k) : 0;
            if (in_n) convert_tokens(src.data(), data_->dtype(), in_n, inputs + i * T + k);
            const std::uint64_t skip = k == 0 ? 1 : 0;  // token 0 is nobody's target
            if (n > skip) convert_tokens(src.data() + skip * item, data_->dtype(), n - skip, targets + i * T + k + skip - 1);
        }
        bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
    }

    // Software prefetch of the cache lines of `bytes`, at most the first `prefetch_bytes` of them: past
    // that the hardware's stream prefetcher has seen the sequential run and takes over.
    static void prefetch_lines(std::span<const std::byte> bytes) noexcept {
        constexpr std::size_t line = 64;
        if (bytes.empty()) return;
        const auto first = reinterpret_cast<std::uintptr_t>(bytes.data()) & ~std::uintptr_t(line - 1);
        const auto last = reinterpret_cast<std::uintptr_t>(bytes.data() + std::min<std::size_t>(bytes.size(), prefetch_bytes) - 1);
        for (std::uintptr_t a = first; a <= last; a += line) __builtin_prefetch(reinterpret_cast<const void*>(a), 0, 3);
    }
    static constexpr std::uint64_t prefetch_bytes = 4096;

    // Every segment of every sample into `raw` (the file's dtype), with one batched read.
    void read_plan(const batch_plan& plan, any_reader& reader, std::vector<std::byte>& raw, std::vector<read_request>& requests) {
        const std::size_t item = dtype_size(data_->dtype());
        const std::uint64_t row = config_.mode == sample_mode::windows ? config_.seq_len + 1 : config_.seq_len;
        raw.resize(plan.samples.size() * row * item);
        requests.clear();
        std::uint64_t bytes = 0;
        for (std::size_t i = 0; i < plan.samples.size(); ++i) bytes += sample_requests(plan.samples[i], raw.data() + i * row * item, requests);
        reader.read(requests);
        bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
    }

    void assemble(const batch_plan& plan, const std::vector<std::byte>& raw, std::byte* slot, row_boundaries& bounds) {
        const std::size_t item = dtype_size(data_->dtype());
        const std::uint64_t T = config_.seq_len;
        auto* inputs = reinterpret_cast<std::int32_t*>(slot + layout_.inputs);
        auto* targets = reinterpret_cast<std::int32_t*>(slot + layout_.targets);
        if (config_.mode == sample_mode::windows) {
            for (std::size_t i = 0; i < plan.samples.size(); ++i) {
                const std::byte* src = raw.data() + i * (T + 1) * item;
                convert_tokens(src, data_->dtype(), T, inputs + i * T);
                convert_tokens(src + item, data_->dtype(), T, targets + i * T);
            }
            return;
        }
        auto* positions = reinterpret_cast<std::int32_t*>(slot + layout_.position_ids);
        auto* cu = reinterpret_cast<std::int32_t*>(slot + layout_.cu_seqlens);
        auto* pieces = reinterpret_cast<std::int32_t*>(slot + layout_.pieces);
        std::uint64_t padding = 0;
        for (std::size_t i = 0; i < plan.samples.size(); ++i) {
            const auto& segs = plan.samples[i].segments;
            std::int32_t* in = inputs + i * T;
            std::int32_t* tg = targets + i * T;
            boundaries_of(segs, T, bounds);
            convert_tokens(raw.data() + i * T * item, data_->dtype(), T - bounds.padding, in);
            pieces[i] = finish_packed_row(bounds, T, in, tg, positions + i * T, cu + i * (T + 1));
            padding += bounds.padding;
        }
        padding_.fetch_add(padding, std::memory_order_relaxed);
    }

    static std::uint64_t ns(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
        return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
    }

    std::shared_ptr<const token_dataset> data_;
    pipeline_config config_;
    io_backend backend_ = io_backend::automatic;
    device_choice device_;
    shard_lengths shard_view_;
    std::unique_ptr<sampler> sampler_;
    bool own_planners_ = false;
    std::vector<std::unique_ptr<sampler>> planners_;  // own_planners_: worker i's sampler
    std::atomic<std::uint64_t> next_step_{0};         // own_planners_: the next step a worker takes
    batch_layout layout_;
    memory_plan memory_;
    std::mutex planner_;
    ring_consumer<sampler_state> consumer_;  // the ring; the sampler state after each slot's step (written after acquire)
    std::vector<std::thread> threads_;
    std::atomic<unsigned> active_{0};
    std::atomic<unsigned> target_workers_{0};  // workers not parked (written by the consumer's tune())
    std::atomic<bool> planned_all_{false};
    bool autotune_ = false;  // workers = 0: park and wake workers
    std::atomic<std::uint64_t> bytes_read_{0}, padding_{0}, read_ns_{0}, assemble_ns_{0}, plan_ns_{0};
    std::string io_reason_;
};

}  // namespace feedline
