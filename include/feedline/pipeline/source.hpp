// feedline/pipeline/source.hpp: what the pipeline asks of a kind of data. A source says what the
// sampler needs (documents, their token counts, shard blocks, sample order) and makes, for each worker
// thread, a source_worker that writes the tokens of planned samples into a batch's slot. Everything
// else (config checks, ranks, workers, memory, the ring, autotuning, stats, resume) is the pipeline's,
// so every source gets all of it. Two sources exist: token shards (pipeline/shard_source.hpp) and
// JSONL/text tokenized on the fly (pipeline/text_source.hpp).
// An abstract class rather than a template parameter: a blend mixes kinds in one pipeline, and the
// pipeline calls a source once per batch, never per token (the per-token loops live inside it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/transform/collate.hpp>

namespace feedline {

enum class source_kind { tokens, text };

inline std::string_view to_string(source_kind k) noexcept { return k == source_kind::tokens ? "token shards" : "text"; }

namespace detail {
// Nanoseconds between two steady-clock points (the second: now), for the workers' time counters.
inline std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to = std::chrono::steady_clock::now()) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}
}  // namespace detail

// Counters a pipeline's workers keep per run (relaxed atomics; summed into pipeline_stats). Owned by
// the pipeline, so two pipelines over one source count separately.
struct source_counters {
    std::atomic<std::uint64_t> bytes_read{0}, read_ns{0}, tokenize_ns{0}, assemble_ns{0};
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
};

class batch_source {
public:
    virtual ~batch_source() = default;
    virtual source_kind kind() const noexcept = 0;
    // One line for logs: what the data is ("9363 tokens in 3 Megatron shards", "120 text documents ...").
    virtual std::string describe() const = 0;
    // The source as the sampler sees it. `config` says the mode (llm.c shards are one stream per
    // shard in windows mode). The lengths function refers to the source: it must outlive the sampler.
    virtual sampler_dataset sampling(const pipeline_config& config) const = 0;
    // Bytes held for the run (indexes, caches) and per worker (scratch), for the memory plan.
    virtual std::uint64_t index_bytes(const pipeline_config& config) const = 0;
    virtual std::uint64_t worker_bytes(const pipeline_config& config) const = 0;
    // Before any worker starts (at the first next()): whatever can fail early (probing a reader,
    // loading a tokenizer). Returns one line on how it reads, for stats (io_backend).
    virtual std::string prepare(const pipeline_config& config) = 0;
    // On the worker's own thread.
    virtual std::unique_ptr<source_worker> make_worker(const pipeline_config& config, source_counters& counters) = 0;
};

}  // namespace feedline
