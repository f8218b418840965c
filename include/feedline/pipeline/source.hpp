// feedline/pipeline/source.hpp: what the pipeline asks of a kind of data. A source says what the
// sampler needs (documents, their token counts, shard blocks, sample order) and makes, for each worker
// thread, a source_worker that writes the tokens of planned samples into a batch's slot. Everything
// else (config checks, ranks, workers, memory, the ring, autotuning, stats, resume) is the pipeline's,
// so every source gets all of it. Kinds of source register themselves with the source registry (which
// files of a spec they claim, how to open one): token shards (pipeline/shard_source.hpp) and JSONL/text
// tokenized on the fly (pipeline/text_source.hpp), listed in pipeline/sources.hpp.
// An abstract class rather than a template parameter: a blend mixes kinds in one pipeline, and the
// pipeline calls a source once per batch, never per token (the per-token loops live inside it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/detail/registry.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/storage/byte_source.hpp>
#include <feedline/transform/collate.hpp>

namespace feedline {

// A kind of source, by name. Open: a new kind is a new name (and its registration), not a new case in
// a switch. The two built in are named here because their options are config sections of their own
// (pipeline_config::shards, ::text).
struct source_kind {
    std::string_view name;
    friend constexpr bool operator==(source_kind a, source_kind b) noexcept { return a.name == b.name; }
    static const source_kind tokens, text;
};
inline constexpr source_kind source_kind::tokens{"token shards"};
inline constexpr source_kind source_kind::text{"text"};

inline std::string_view to_string(source_kind k) noexcept { return k.name; }

namespace detail {
// Nanoseconds between two steady-clock points (the second: now), for the workers' time counters.
inline std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point from,
                                std::chrono::steady_clock::time_point to = std::chrono::steady_clock::now()) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}
}  // namespace detail

// What a source is told about the run: the batch's shape on this rank, how samples are made, and the
// options of token shards. Narrow on purpose: a source does not see the pipeline's workers, memory,
// device or logging, and a new option reaches a source only by being added here.
struct source_context {
    std::uint64_t batch_size = 8;  // samples per step on this rank
    std::uint64_t seq_len = 1024;
    sample_mode mode = sample_mode::windows;
    shard_options shards;
    static source_context of(const pipeline_config& c) { return {c.batch_size, c.seq_len, c.mode, c.shards}; }
};

// Counters a pipeline's workers keep per run (relaxed atomics; summed into pipeline_stats): one set per
// worker thread, which the writers of every source on that thread count into. Owned by the pipeline,
// so two pipelines over one source count separately.
struct source_counters {
    std::atomic<std::uint64_t> bytes_read{0}, read_ns{0}, tokenize_ns{0}, assemble_ns{0};
};

class batch_source;

// A source of a blend or mixture, with its weight (a mixture's are 1: its schedule weighs them).
struct weighted_source {
    double weight = 1;
    std::shared_ptr<batch_source> source;
};

// One worker's view of a source: its reader or tokenizer and scratch buffers, made on the worker's
// thread (first touch puts them on its NUMA node), used by that thread only.
class source_worker {
public:
    virtual ~source_worker() = default;
    // Writes the tokens of plan.samples[r] for each r in `rows` (samples whose dataset is this
    // source) into `slot`: windows mode, the sample's T + 1 tokens with slot.put_window_tokens;
    // packed mode, its segments' tokens in order from column 0 of inputs row r (the pipeline adds
    // targets, positions and cu_seqlens). Throws format_error / io_error naming file and offset.
    virtual void write(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) = 0;
    // Completes what write() left to the batch's end: called, before the slot is published, once on
    // every writer that wrote in the batch (however many sources it was bound to), after its last write. Workers of one thread that share their
    // scratch may gather the whole batch's rows there and convert them in one pass, so that the cache
    // misses of one domain's rows overlap another's (a mixture's batch holds a row or two of each of
    // dozens of domains). Throws as write() does. Default: nothing was left.
    virtual void finish(const slot_view& slot) { (void)slot; }

    // One writer for many sources. A writer that keeps nothing of a source's own between batches may
    // write for other sources as well: accepts(s) says whether it can write for `s` (on its thread, in
    // this run). The pipeline then binds it to each such source before that source's rows instead of
    // making a writer per source: a mixture of 10,000 domains costs a worker a few bytes per domain,
    // not a writer per domain (which, times 16 workers, was more than the domain's own state).
    // The pipeline asks once per source and thread and keeps the answer for the run, so it must not
    // depend on the source bound now. Default: a writer per source.
    virtual bool accepts(const batch_source& source) const {
        (void)source;
        return false;
    }
    // Writes for `source` (one accepts() took) from the next write() on, counting into `counters`.
    // finish() then counts into the counters bound last. If it throws, the run ends (the writer is
    // not used again).
    virtual void bind(const batch_source& source, source_counters& counters) {
        (void)source;
        (void)counters;
    }
    // The rows of several sources, each one this writer accepts(), in one call: `rows` in dataset
    // order, and sources[d] the source of dataset d (row r's d is plan.samples[r].dataset). The same
    // as binding to each source in turn and writing its rows (the default), and it leaves the writer
    // bound to the last; a writer that keeps nothing of a source's own may take them all in one pass.
    // A mixture of 10,000 domains has a source or two per row of a batch, and a call per source was a
    // chain of cache misses and virtual calls per row.
    virtual void write_sources(const batch_plan& plan, std::span<const std::uint32_t> rows, std::span<const weighted_source> sources,
                               source_counters& counters, const slot_view& slot);
};

class batch_source {
public:
    virtual ~batch_source() = default;
    virtual source_kind kind() const noexcept = 0;
    // One line for logs: what the data is ("9363 tokens in 3 Megatron shards", "120 text documents ...").
    virtual std::string describe() const = 0;
    // The source as the sampler sees it. The context says the mode (llm.c shards are one stream per
    // shard in windows mode). The lengths function refers to the source: it must outlive the sampler.
    virtual sampler_dataset sampling(const source_context& run) const = 0;
    // Bytes held for the run (indexes, caches) and per worker (scratch), for the memory plan.
    virtual std::uint64_t index_bytes(const source_context& run) const = 0;
    virtual std::uint64_t worker_bytes(const source_context& run) const = 0;
    // Sources whose workers on one thread share their scratch (one reader and buffers for all of them)
    // name the same group: the memory plan counts the largest worker_bytes of a group once per worker,
    // not every source's. Default: a group of its own.
    virtual const void* worker_scratch_group() const noexcept { return this; }
    // Before any worker starts (at the first next()): whatever can fail early (probing a reader,
    // loading a tokenizer). Returns one line on how it reads, for stats (io_backend).
    virtual std::string prepare(const source_context& run) = 0;
    // On the worker's own thread.
    virtual std::unique_ptr<source_worker> make_worker(const source_context& run, source_counters& counters) = 0;

    // A hint a few writes before this source's: request the cache lines its writer will read, one
    // link of the chain per stage (the pipeline calls stage 1, then stage 2 a few writes later, each on
    // lines the stage before requested). A mixture's batch writes for dozens of its thousands of
    // sources, each a chain of misses (the source, its dataset, a shard's entry). `first`: the plan of
    // the first row that write takes (which of its shards a window starts in). Default: nothing.
    virtual void prefetch_for_write(unsigned stage, const sample_plan& first) const noexcept {
        (void)stage;
        (void)first;
    }

    // Data in remote storage: whether the pipeline should fetch ranges ahead for this source, and the
    // ranges a worker will request for plan.samples[r], r in `rows` (dest unset), appended to `out`: the
    // same source, offset and length a worker's read gives, or the worker does not find them
    // (storage/fetch_ahead.hpp). Default: none (local data; a source that reads whole objects).
    virtual bool reads_remote_ranges() const { return false; }
    virtual void remote_ranges(const source_context& /*run*/, const batch_plan& /*plan*/, std::span<const std::uint32_t> /*rows*/,
                               std::vector<read_request>& /*out*/) const {}
};

inline void source_worker::write_sources(const batch_plan& plan, std::span<const std::uint32_t> rows,
                                         std::span<const weighted_source> sources, source_counters& counters, const slot_view& slot) {
    for (std::size_t first = 0, last = 0; first < rows.size(); first = last) {
        const std::uint32_t d = plan.samples[rows[first]].dataset;
        while (last < rows.size() && plan.samples[rows[last]].dataset == d) ++last;
        bind(*sources[d].source, counters);
        write(plan, rows.subspan(first, last - first), slot);
    }
}

// A kind of source as the registry knows it: which specs it takes (by the files a spec names: a glob's
// matches, a directory's entries, or the spec itself) and how to open one. `fallback`: the kind a spec
// that no kind claims goes to (token shards, whose error then names what is missing).
struct source_type {
    source_kind kind;
    std::function<bool(const std::string& spec, const std::vector<std::string>& files)> claims;
    std::function<std::shared_ptr<batch_source>(const std::string& spec, const pipeline_config& config)> open;
    bool fallback = false;
    // Several specs of this kind opened together as one source, their files in the order given (a
    // mixture domain's list of data). Empty: the kind takes one spec a source.
    std::function<std::shared_ptr<batch_source>(const std::vector<std::string>& specs, const pipeline_config& config)> open_list{};
};

// The kinds this build has, in registration order (detail/registry.hpp).
using source_registry = detail::registry<source_type>;

}  // namespace feedline
