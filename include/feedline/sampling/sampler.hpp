// feedline/sampling/sampler.hpp: which samples form each global batch, and which slice this rank gets.
// Batch k's content is a pure function of (seed, epoch, k, rank, world size, config): epochs lay out
// documents with seeded permutations, samples within an epoch are permuted too, several datasets are
// blended by weight, and each rank takes a disjoint slice of every global batch. The state is a handful
// of integers; restoring it is O(1) plus building the current epoch's layout, and a different world
// size (same global batch) continues at the same global sample. Fed by the sources' document lengths
// (sampler_dataset); feeds the pipeline's workers (a batch plan per step).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <feedline/detail/prefetch.hpp>
#include <feedline/detail/spin_lock.hpp>
#include <feedline/error.hpp>
#include <feedline/sampling/mixer.hpp>
#include <feedline/sampling/mixture_schedule.hpp>
#include <feedline/sampling/permutation.hpp>
#include <feedline/sampling/windows.hpp>

namespace feedline {

// Rank and world size as the launcher set them.
struct launch_info {
    int rank = 0;
    int world_size = 1;
    int local_rank = 0;
    int local_world_size = 1;  // processes on this node (each a trainer with its own data workers)
    std::string source = "default (single process)";
};

// Reads torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, else Open MPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE, else a single process. Throws config_error
// for values that do not parse or do not fit.
inline launch_info launch_from_environment() {
    auto get = [](const char* name) -> std::optional<int> {
        const char* v = std::getenv(name);
        if (v == nullptr || *v == '\0') return std::nullopt;
        char* end = nullptr;
        long x = std::strtol(v, &end, 10);
        if (*end != '\0' || x < 0 || x > 1 << 24) throw config_error(name, std::string("not a valid number: '") + v + "'");
        return static_cast<int>(x);
    };
    launch_info info;
    for (auto [r, w, l, lw, src] : {std::tuple{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun (RANK/WORLD_SIZE)"},
                                    std::tuple{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                               "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI (OMPI_COMM_WORLD_*)"}}) {
        auto rank = get(r), world = get(w);
        if (!rank || !world) continue;
        if (*world < 1 || *rank >= *world)
            throw config_error(r, "rank " + std::to_string(*rank) + " is not below world size " + std::to_string(*world));
        info.rank = *rank;
        info.world_size = *world;
        info.local_rank = get(l).value_or(0);
        info.local_world_size = std::max(1, get(lw).value_or(1));
        info.source = src;
        return info;
    }
    return info;
}

enum class tail_policy {
    drop,  // the last incomplete global batch of an epoch is dropped (count reported)
    pad,   // it is completed with samples from the start of the same epoch (count reported)
    mask,  // completed as with pad, and the pipeline sets the targets of those rows to ignore_index, so a
           // loss over the batch counts every sample of the epoch exactly once (evaluation passes)
};

template <>
struct enum_names<tail_policy> {
    static constexpr std::array values{named(tail_policy::drop, "drop"), named(tail_policy::pad, "pad"), named(tail_policy::mask, "mask")};
};

struct sampler_config {
    std::uint64_t seq_len = 1024;
    std::uint64_t global_batch = 32;  // samples per step across all ranks
    std::uint64_t seed = 1234;
    sample_mode mode = sample_mode::windows;
    shuffle_mode shuffle = shuffle_mode::global;
    bool shuffle_samples = true;
    tail_policy tail = tail_policy::drop;
    int rank = -1;        // -1: from the launcher's environment
    int world_size = -1;  // -1: from the launcher's environment
};

// One sample of a batch: where it comes from (identity, for logs and tests) and its tokens.
struct sample_plan {
    std::uint32_t dataset = 0;
    std::uint64_t epoch = 0;        // of that dataset
    std::uint64_t index = 0;        // sample number within that epoch, before shuffling
    bool padding = false;           // a repeat that completes the epoch's last batch (tail = pad)
    std::vector<segment> segments;  // windows: seq_len + 1 tokens; packed: up to seq_len tokens
};

// dataset_stream::plan_run's scratch: one per planner, not one per stream (a mixture has thousands).
struct plan_scratch {
    std::vector<std::uint64_t> shuffled;
    std::vector<std::uint32_t> pending;
    std::vector<std::uint64_t> keys;  // sampler::plan_drawn's sort: (dataset, row) in one integer
    // sampler::plan_drawn's samples of one-document streams and short runs of windows, permuted
    // together after the others: each (stream, epoch)'s permutation, and each sample's permutation,
    // index and row.
    std::vector<feistel_permutation> permutations;
    std::vector<std::uint32_t> which, rows;
    std::vector<std::uint64_t> indices;
    std::vector<std::uint32_t> laid_out;  // which of them are of streams that lay their epochs out
};

struct batch_plan {
    std::uint64_t step = 0;   // global step number
    std::uint64_t epoch = 0;  // for one dataset: its epoch; blended: the first dataset's
    std::uint64_t first_global_sample = 0;
    std::vector<sample_plan> samples;  // this rank's slice, in order
    // sampler::plan_drawn's order of the samples: by dataset, then by row (the pipeline's writers take
    // it as it is when it holds every row in that order).
    std::vector<std::uint32_t> by_dataset;
    plan_scratch runs;  // sampler::plan_drawn's, for its runs of consecutive samples (each worker has its plan)
};

// One dataset as the sampler sees it, whatever its kind (token shards, a text corpus): its documents'
// token counts, the first document of each shard (shuffle_mode::shard_blocks), and whether its samples
// are permuted within an epoch. Text keeps them in the epoch's document order (`in_stream_order`), so
// a batch covers consecutive tokens and each document is tokenized about once per epoch; its
// documents are still shuffled. The lengths function must stay valid while the sampler lives.
struct sampler_dataset {
    std::uint64_t documents = 0;
    std::function<std::uint64_t(std::uint64_t)> length;
    std::vector<std::uint64_t> block_starts;
    bool in_stream_order = false;
    std::uint64_t document_count() const { return documents; }
    std::uint64_t document_length(std::uint64_t i) const { return length(i); }
};

// One dataset's sample stream: epoch layouts built on demand, samples permuted within each epoch.
// May keep a reference to the dataset (past 64 documents): it must outlive the stream. Not thread-safe, except plan() and
// plan_run() under planning_lock(), samples_in_epoch, samples_of_epoch and plan_one_document (the
// last two without the lock, for one-document streams): those may run on several threads at once (a
// blend's workers plan their steps' samples outside the shared planner's lock: sampler::plan_drawn).
// A mixture holds one per domain, so it keeps only what planning reads (80 bytes; the epoch's layout
// and the documents' lengths too, unless it is one document read as windows): bench_mixture measures
// the memory per domain.
class dataset_stream {
public:
    template <document_lengths D>
    dataset_stream(const D& data, const sampler_config& config, std::uint32_t id, std::vector<std::uint64_t> block_starts = {})
            : dataset_stream(
                  sampler_dataset{.documents = data.document_count(),
                                  .length = [&data](std::uint64_t i) { return static_cast<std::uint64_t>(data.document_length(i)); },
                                  .block_starts = std::move(block_starts)},
                  config, id) {}
    dataset_stream(sampler_dataset data, const sampler_config& config, std::uint32_t id)
            : seq_len_(config.seq_len),
              seed_(config.seed ^ (std::uint64_t(id) << 48)),
              documents_(data.documents),
              id_(id),
              mode_(static_cast<std::uint8_t>(config.mode)),
              shuffle_(static_cast<std::uint8_t>(config.shuffle)),
              // shuffle_mode::none reads the samples (windows, rows) in order too, not only the documents.
              shuffle_samples_(config.shuffle_samples && config.shuffle != shuffle_mode::none && !data.in_stream_order) {
        if (one_document()) {
            if (seq_len_ == 0) throw config_error("seq_len", "must be at least 1");
            tokens_ = data.length(0);
            samples_ = tokens_ > seq_len_ ? (tokens_ - 1) / seq_len_ : 0;  // as detail::gpt_windows::count
            epoch_key_.set(0, detail::permutation_key(seed_, 0, 0));
        } else {
            // A few documents (a mixture's domain): every epoch's lengths from the layout before, so
            // the stream keeps neither the dataset's length function nor a block for it (48 bytes a
            // domain of a Megatron pair). Many: the function, since a copy of the lengths beside the
            // old layout would add half a layout's bytes to the epoch's change.
            if (documents_ > lengths_from_layout_max || mode() == sample_mode::packed)
                many_ = std::make_unique<many_documents>(documents_ > lengths_from_layout_max ? std::move(data.length) : nullptr);
            // The shard blocks' starts go into the layout (shuffle_mode::shard_blocks), and each
            // epoch's from the one before: the stream keeps no copy (a mixture keeps a stream per
            // domain, and a vector apart cost a domain of a Megatron pair 24 bytes and an allocation).
            select_epoch(0, data.block_starts, many_ && many_->lengths ? &many_->lengths : &data.length);
            tokens_ = layout_->tokens();
        }
        if (samples_ == 0)
            throw config_error("seq_len", "dataset " + std::to_string(id) + " has " + std::to_string(tokens_) +
                                              " tokens: too few for one sample of seq_len " + std::to_string(config.seq_len));
    }
    dataset_stream(dataset_stream&&) = default;

    std::uint64_t documents() const noexcept { return documents_; }
    std::uint64_t tokens() const noexcept { return tokens_; }
    // Samples in `epoch`. GPT windows: the same every epoch. Packed rows: depends on the epoch's
    // document order (padding differs), so this builds that epoch's layout (O(documents)) once.
    // Thread-safe beside plan() under planning_lock() (GPT windows read a constant; packed rows lay
    // out under the lock).
    std::uint64_t samples_in_epoch(std::uint64_t epoch) {
        if (mode() == sample_mode::windows) return samples_;
        const std::lock_guard hold(lock_);
        select_epoch(epoch);
        return samples_;
    }
    // At most samples_in_epoch(e) for every epoch e, without a layout or the lock: GPT windows, the
    // count itself; packed rows, the rows the tokens would fill with no padding. A blend asks for an
    // epoch's exact count only past it, near the epoch's end: asking at its start would lay out the
    // new epoch while other threads still plan the old one's last samples, and they would lay the old
    // one out again.
    std::uint64_t samples_at_least() const noexcept {
        return mode() == sample_mode::windows ? samples_ : tokens_ / seq_len_ + (tokens_ % seq_len_ != 0 ? 1 : 0);
    }
    // Of the epoch last laid out.
    std::uint64_t samples_per_epoch() const noexcept { return samples_; }
    std::uint64_t padding_tokens_per_epoch() const noexcept { return many_ && many_->rows ? many_->rows->padding() : 0; }

    // Sample `index` (before shuffling) of `epoch`: fills plan.segments. Rebuilds the layout when the
    // epoch changes (O(documents)); otherwise O(log documents).
    void plan(std::uint64_t epoch, std::uint64_t index, sample_plan& out) {
        select_epoch(epoch);
        out.dataset = id_;
        out.epoch = epoch;
        out.index = index;
        out.segments.clear();
        std::uint64_t s = shuffle_samples_ ? sample_permutation()(index) : index;
        if (one_document())
            out.segments.push_back(window_of_one_document(s));
        else if (mode() == sample_mode::windows)
            detail::gpt_windows(*layout_, seq_len_).segments(s, out.segments);
        else
            many_->rows->segments(s, out.segments);
    }

    // Whether its samples are one-document windows (a mixture's one-shard domains): a sample's window
    // then follows from its epoch and index alone, through fields set at construction and never
    // written again, so sampler::plan_drawn plans them without the stream's lock, and permutes the
    // samples of a step's many such streams together (feistel_permutation::map_each).
    bool plans_without_layout() const noexcept { return one_document(); }
    bool shuffles_samples() const noexcept { return shuffle_samples_; }
    // The sample order in `epoch` of a stream of windows (one-document or laid out): the permutation
    // plan() uses. Without the lock (the count is fixed at construction for windows, and the epoch's
    // key is read from the seqlock when it is the one last selected); a one-document stream whose
    // epoch moved on records the new one's key when its lock is free, for the next samples of that
    // epoch (a laid-out stream records it as it lays the epoch out).
    feistel_permutation samples_of_epoch(std::uint64_t epoch) {
        if (const auto key = epoch_key_.key_of(epoch)) return {samples_, *key};
        const std::uint64_t key = detail::permutation_key(seed_, epoch, 0);
        if (one_document() && lock_.try_lock()) {
            epoch_key_.set(epoch, key);
            lock_.unlock();
        }
        return {samples_, key};
    }
    // Fills `out` as plan(epoch, index, out) does on such a stream, given the index's place in the
    // epoch's order (`shuffled`: samples_of_epoch(epoch)(index), or the index when it shuffles none).
    void plan_one_document(std::uint64_t epoch, std::uint64_t index, std::uint64_t shuffled, sample_plan& out) const {
        out.dataset = id_;
        out.epoch = epoch;
        out.index = index;
        out.segments.clear();
        out.segments.push_back(window_of_one_document(shuffled));
    }

    // Whether its samples are GPT windows: their count is the same every epoch (fixed at
    // construction), so samples_of_epoch needs no lock for them either.
    bool plans_windows() const noexcept { return mode() == sample_mode::windows; }
    // Fills `out` as plan(epoch, index, out) does on a stream of windows, given the index's place in
    // the epoch's order (samples_of_epoch(epoch)(index)). Under planning_lock().
    void plan_window(std::uint64_t epoch, std::uint64_t index, std::uint64_t shuffled, sample_plan& out) {
        if (one_document()) return plan_one_document(epoch, index, shuffled, out);
        select_epoch(epoch);
        out.dataset = id_;
        out.epoch = epoch;
        out.index = index;
        out.segments.clear();
        detail::gpt_windows(*layout_, seq_len_).segments(shuffled, out.segments);
    }

    // Held around plan() by threads that plan samples of one stream at once (sampler::plan_drawn):
    // each sample's segments depend only on its epoch and index, so their order does not matter.
    detail::spin_lock& planning_lock() noexcept { return lock_; }

    // Samples first, first + 1, ..., first + count - 1 (before shuffling) of `epoch` into out[0, count),
    // as plan() one at a time would fill them. Their shuffled positions are computed first, all at once
    // (feistel_permutation::map: ~3x the rate), then their segments: a batch of 256 short windows
    // spent a third of a worker's time planning before (bench_end_to_end).
    void plan_run(std::uint64_t epoch, std::uint64_t first, std::size_t count, sample_plan* out, plan_scratch& scratch) {
        plan_run(
            epoch, first, count, [out](std::size_t i) -> sample_plan& { return out[i]; }, scratch);
    }
    // The same into at(0), ..., at(count - 1): plans anywhere (a blend's samples of one dataset, spread
    // over the batch's rows).
    template <class At>
    void plan_run(std::uint64_t epoch, std::uint64_t first, std::size_t count, At&& at, plan_scratch& scratch) {
        select_epoch(epoch);
        auto& shuffled = scratch.shuffled;
        shuffled.resize(count);
        if (shuffle_samples_)
            sample_permutation().map(first, count, shuffled.data(), scratch.pending);
        else
            for (std::size_t i = 0; i < count; ++i) shuffled[i] = first + i;
        for (std::size_t i = 0; i < count; ++i) {
            sample_plan& p = at(i);
            p.dataset = id_;
            p.epoch = epoch;
            p.index = first + i;
            p.segments.clear();
        }
        if (one_document()) {
            for (std::size_t i = 0; i < count; ++i) at(i).segments.push_back(window_of_one_document(shuffled[i]));
        } else if (mode() == sample_mode::windows) {
            const detail::gpt_windows windows(*layout_, seq_len_);
            for (int stage = 0; stage < 2; ++stage)
                for (std::size_t i = 0; i < count; ++i) windows.prefetch(shuffled[i], stage);
            for (std::size_t i = 0; i < count; ++i) windows.segments(shuffled[i], at(i).segments);
        } else {
            const detail::packed_rows& rows = *many_->rows;
            for (std::size_t i = 0; i < count; ++i) rows.segments(shuffled[i], at(i).segments);
        }
    }

    std::size_t memory_bytes() const noexcept {
        return (layout_ ? layout_->memory_bytes() : 0) + (many_ && many_->rows ? many_->rows->memory_bytes() : 0);
    }

    // Asks for this stream's fields (a mixture plans thousands of cold streams): only their addresses
    // are used, so it needs no lock. Every line the 80 bytes touch (three when they straddle two
    // boundaries). Not the lock's line for writing: with a few streams, the workers would take it
    // from each other at every sample.
    void prefetch() const noexcept { prefetch_lines(this, sizeof *this); }
    // Whether it lays its epochs out (several documents, or packed rows): one-document windows do not.
    bool lays_out_epochs() const noexcept { return !one_document(); }
    // Asks for the epoch layout's lines (its tables right after it, all of them up to about eight
    // documents: a mixture's domains of a few shards or a Megatron pair), a few runs before plan_drawn
    // plans this stream: its address is read without the lock, never what is there (another thread may
    // be replacing it). After prefetch(), in time for the stream's line to have come.
    void prefetch_layout() const noexcept {
        if (const detail::epoch_layout* l = layout_.get_unlocked()) prefetch_lines(l, detail::epoch_layout::prefetched_bytes);
    }
    // Only what drawing a step reads (samples_at_least; GPT windows' samples_in_epoch): asking for
    // every line of 32 streams at once fills the core's miss buffers, and the draw then waits on its
    // own prefetches (perf).
    void prefetch_counts() const noexcept {
        detail::prefetch(&mode_);
        detail::prefetch(&tokens_);
        detail::prefetch(&samples_);
    }

private:
    // Every cache line of [at, at + bytes), computed on the address as an integer: `at` may be an
    // object another thread has just freed (prefetch_layout), which is never read or stepped through.
    static void prefetch_lines(const void* at, std::size_t bytes) noexcept {
        const auto begin = reinterpret_cast<std::uintptr_t>(at), end = begin + bytes;
        for (std::uintptr_t line = begin & ~std::uintptr_t{63}; line < end; line += 64)
            detail::prefetch(reinterpret_cast<const void*>(line));
    }

    feistel_permutation sample_permutation() const { return {samples_, epoch_key_.key()}; }

    struct length_source {
        const std::function<std::uint64_t(std::uint64_t)>* f;
        std::uint64_t n;
        std::uint64_t document_count() const { return n; }
        std::uint64_t document_length(std::uint64_t i) const { return (*f)(i); }
    };

    // Up to this many documents, select_epoch takes an epoch's lengths from the layout before (on the
    // stack: 512 bytes) and the stream keeps no length function.
    static constexpr std::uint64_t lengths_from_layout_max = 64;
    struct kept_lengths {
        const std::uint64_t* lengths;
        std::uint64_t n;
        std::uint64_t document_count() const { return n; }
        std::uint64_t document_length(std::uint64_t i) const { return lengths[i]; }
    };

    sample_mode mode() const noexcept { return static_cast<sample_mode>(mode_); }
    // GPT windows over a dataset of one document (a mixture's one-shard llm.c domains, thousands of
    // them) need no layout: the epoch is that document, and window s is its tokens [s * seq_len,
    // s * seq_len + seq_len + 1). Keeping none saves each such domain a layout (80 bytes and up) and
    // planning a miss.
    bool one_document() const noexcept { return mode() == sample_mode::windows && documents_ == 1; }
    segment window_of_one_document(std::uint64_t s) const noexcept { return {0, s * seq_len_, seq_len_ + 1}; }

    // `first_blocks`, `first_lengths`: the shard blocks' starts and the documents' lengths for the
    // first layout (later ones take the layout's, and the lengths from it or from many_).
    void select_epoch(std::uint64_t epoch, std::span<const std::uint64_t> first_blocks = {},
                      const std::function<std::uint64_t(std::uint64_t)>* first_lengths = nullptr) {
        if (one_document()) {
            if (epoch != epoch_key_.epoch()) epoch_key_.set(epoch, detail::permutation_key(seed_, epoch, 0));
            return;
        }
        if (layout_ && epoch == epoch_key_.epoch()) return;
        std::vector<std::uint64_t> kept_blocks;
        if (layout_) {
            const auto b = layout_->block_starts();
            kept_blocks.assign(b.begin(), b.end());
        }
        const std::span<const std::uint64_t> blocks = layout_ ? std::span<const std::uint64_t>(kept_blocks) : first_blocks;
        const auto order = static_cast<shuffle_mode>(shuffle_);
        std::unique_ptr<detail::epoch_layout> next;
        if (!layout_) {
            if (first_lengths == nullptr) throw std::logic_error("dataset_stream: no lengths for the first layout");
            next = detail::epoch_layout::make(length_source{first_lengths, documents_}, order, seed_, epoch, blocks);
        } else if (documents_ <= lengths_from_layout_max) {
            // The lengths from the old epoch's layout, which stays until the new one is made (both
            // small): a failure leaves the stream as it was. The dataset's function went through its
            // shard table, a cache miss a shard (perf, 10,000 domains of 3 shards: 25 ns a window).
            std::array<std::uint64_t, lengths_from_layout_max> kept;  // documents_ of them written below
            std::fill_n(kept.begin(), documents_, 0);
            for (std::uint64_t k = 0; k < documents_; ++k) {
                const std::uint64_t d = layout_->document_at(k);  // a permutation of [0, documents_): checked, not assumed
                if (d >= documents_) throw std::logic_error("dataset_stream: an epoch's order is not a permutation");
                kept[d] = layout_->length_at(k);
            }
            next = detail::epoch_layout::make(kept_lengths{kept.data(), documents_}, order, seed_, epoch, blocks);
        } else {
            // Free the old epoch before building the new one: peak stays one layout.
            many_->rows.reset();
            layout_.reset();
            next = detail::epoch_layout::make(length_source{&many_->lengths, documents_}, order, seed_, epoch, blocks);
        }
        if (many_) many_->rows.reset();
        layout_.reset(std::move(next));
        if (mode() == sample_mode::windows) {
            // The same every epoch: set once (the constructor's layout), so samples_in_epoch reads it
            // without the lock. A dataset without one sample never gets past the constructor.
            if (samples_ == 0) samples_ = detail::gpt_windows(*layout_, seq_len_).count();
        } else {
            many_->rows = std::make_unique<detail::packed_rows>(*layout_, seq_len_);
            samples_ = many_->rows->count();
        }
        epoch_key_.set(epoch, detail::permutation_key(seed_, epoch, 0));
    }

    // What only a stream of many documents or packed rows needs: the documents' lengths (past
    // lengths_from_layout_max; empty below it) and the epoch's rows (the shard blocks' first documents
    // are in the layout). Behind one pointer, null for windows over a few documents: a mixture keeps
    // a stream per domain (40 bytes, one of the allocator's 48-byte chunks).
    struct many_documents {
        explicit many_documents(std::function<std::uint64_t(std::uint64_t)> l) : lengths(std::move(l)) {}
        std::function<std::uint64_t(std::uint64_t)> lengths;
        std::unique_ptr<detail::packed_rows> rows;  // packed mode (windows need only the layout and seq_len)
    };

    std::uint64_t seq_len_;
    std::uint64_t seed_;
    std::uint64_t documents_ = 0, tokens_ = 0;
    std::uint64_t samples_ = 0;
    // The epoch last selected, and its samples' key: their order is feistel_permutation(samples_,
    // key), made where it is used (six mixes, a few ns) instead of kept, since its round keys are 64 of
    // a stream's bytes and a mixture keeps a stream per domain. Written under the planning lock; read
    // under it, or without it by plan_drawn's one-document path (samples_of_epoch), where deriving the
    // key again for every sample (three chained mixes) cost 10,000 domains 5% of their planning.
    // A seqlock: the epoch doubled, odd while it and the key are being rewritten.
    class keyed_epoch {
    public:
        keyed_epoch() = default;
        keyed_epoch(keyed_epoch&& o) noexcept
                : seq_(o.seq_.load(std::memory_order_relaxed)), key_(o.key_.load(std::memory_order_relaxed)) {}
        keyed_epoch& operator=(keyed_epoch&&) = delete;
        // Under the lock.
        std::uint64_t epoch() const noexcept { return seq_.load(std::memory_order_relaxed) >> 1; }
        std::uint64_t key() const noexcept { return key_.load(std::memory_order_relaxed); }
        void set(std::uint64_t epoch, std::uint64_t key) noexcept {
            seq_.store(seq_.load(std::memory_order_relaxed) | 1, std::memory_order_relaxed);
            std::atomic_thread_fence(std::memory_order_release);
            key_.store(key, std::memory_order_relaxed);
            seq_.store(epoch << 1, std::memory_order_release);
        }
        // Without the lock: the key, if `epoch` is the epoch set (a torn read gives nothing; a key
        // read between two rewrites that both set `epoch` is that epoch's: keys follow from epochs).
        std::optional<std::uint64_t> key_of(std::uint64_t epoch) const noexcept {
            const std::uint64_t before = seq_.load(std::memory_order_acquire);
            if (before != epoch << 1) return std::nullopt;
            const std::uint64_t key = key_.load(std::memory_order_relaxed);
            std::atomic_thread_fence(std::memory_order_acquire);
            if (seq_.load(std::memory_order_relaxed) != before) return std::nullopt;
            return key;
        }

    private:
        std::atomic<std::uint64_t> seq_{0}, key_{0};
    };
    keyed_epoch epoch_key_;
    std::uint32_t id_;
    std::uint8_t mode_, shuffle_;  // sample_mode, shuffle_mode: a byte each, so that the stream is 80 bytes
    bool shuffle_samples_;
    detail::spin_lock lock_;  // planning_lock(); one byte
    // The epoch's layout, owned. Its address is read by other threads without the lock, for a prefetch
    // only (prefetch_layout): an atomic pointer, where reading a unique_ptr beside its reset is a data
    // race. 8 bytes, as the unique_ptr was.
    class layout_owner {
    public:
        layout_owner() = default;
        layout_owner(layout_owner&& o) noexcept : p_(o.p_.exchange(nullptr, std::memory_order_relaxed)) {}
        layout_owner& operator=(layout_owner&&) = delete;
        ~layout_owner() { delete get(); }
        // The owner's view (under the planning lock, or before other threads see the stream).
        detail::epoch_layout* get() const noexcept { return p_.load(std::memory_order_relaxed); }
        detail::epoch_layout* operator->() const noexcept { return get(); }
        detail::epoch_layout& operator*() const noexcept { return *get(); }
        explicit operator bool() const noexcept { return get() != nullptr; }
        void reset(std::unique_ptr<detail::epoch_layout> next = nullptr) noexcept {
            delete p_.exchange(next.release(), std::memory_order_relaxed);
        }
        // Another thread's view: an address to prefetch, which may be freed as it is read.
        const detail::epoch_layout* get_unlocked() const noexcept { return p_.load(std::memory_order_relaxed); }

    private:
        std::atomic<detail::epoch_layout*> p_{nullptr};
    };
    layout_owner layout_;
    std::unique_ptr<many_documents> many_;
};
static_assert(std::atomic<detail::epoch_layout*>::is_always_lock_free, "prefetch_layout reads the layout's address without a lock");
static_assert(std::is_nothrow_move_constructible_v<dataset_stream>, "a mixture's vector of streams moves them");
static_assert(sizeof(void*) != 8 || sizeof(dataset_stream) == 80, "a mixture keeps a stream per domain: 80 bytes (bench_mixture)");

// Weights the trainer set to take effect at a later step (sampler::set_mixture_weights with a step):
// held in the state until the sampler plans that step, so a state saved in between resumes with them.
struct mixture_weights_change {
    std::uint64_t step = 0;
    std::vector<double> weights;
    friend bool operator==(const mixture_weights_change&, const mixture_weights_change&) = default;
};

// The resumable position plus what it must be resumed with. Serialised by sampling/state_io.hpp.
// Holds no rank or world size: every rank has the same state, and any world size with the same
// global batch can continue from it.
struct sampler_state {
    // Version 1: a run with one global batch throughout. Version 2: a run that went on with another
    // global batch (with_global_batch below) and so carries the origin fields. Both are read; a state
    // is written as the version its content needs, so version-1 states keep their checksums.
    // Version 3: a blend mixed by a schedule (sampling/mixer.hpp), with the mixture fields below.
    // Version 4: version 3 with weights set for later steps not yet reached (`pending_weights`).
    static constexpr std::uint32_t current_version = 1, rebased_version = 2, mixture_version = 3, pending_version = 4;
    std::uint32_t version = current_version;
    // What the position means: restore() refuses a state whose fields differ from the sampler's.
    std::uint64_t seed = 0, seq_len = 0, global_batch = 0;
    std::uint32_t mode = 0, shuffle = 0, shuffle_samples = 0, tail = 0;
    std::vector<std::uint64_t> dataset_documents, dataset_tokens;
    std::vector<double> weights;
    // Where we are: the next global step, and per dataset the samples drawn so far and the next
    // sample's (epoch, index within the epoch).
    std::uint64_t step = 0;
    std::vector<std::uint64_t> taken, epoch, index;
    // Version 2 only: where the run went on with this global batch. The step it went on at, the
    // samples drawn before it over all datasets, and (one dataset) the next sample's epoch and index
    // then. Steps from there draw this global batch each: the rest of that epoch first, from the index.
    std::uint64_t origin_step = 0, origin_drawn = 0, origin_epoch = 0, origin_index = 0;
    bool rebased() const noexcept { return version == rebased_version; }
    // Version 3 only: which schedule decides each sample's dataset, and where its targets count from.
    // `mixture`: 1, the schedule the sampler was made with (from mixture_step on); 2, weights set during
    // the run (sampler::set_mixture_weights), held in `weights`. mixture_check: that schedule's
    // fingerprint. From mixture_step, where mixture_drawn samples had been drawn and each dataset's count
    // was mixture_taken, every dataset stays within one sample of its target.
    std::uint32_t mixture = 0;
    std::uint64_t mixture_check = 0, mixture_step = 0, mixture_drawn = 0;
    std::vector<std::uint64_t> mixture_taken;
    bool mixed() const noexcept { return version == mixture_version || version == pending_version; }
    // Version 4 only: weights set to take effect at later steps, in step order (one per step). The
    // sampler takes the first when it plans its step: `mixture` becomes 2 with those weights, and
    // targets count from that step.
    std::vector<mixture_weights_change> pending_weights;

    // Records `change` (steps in order: a later change for the same step replaces the earlier one).
    // Throws config_error for a step already passed or before the last one recorded.
    void add_weights_change(mixture_weights_change change) {
        if (change.step < step)
            throw config_error(
                "step", "weights for step " + std::to_string(change.step) + ", which comes before the next step, " + std::to_string(step));
        if (!pending_weights.empty() && change.step < pending_weights.back().step)
            throw config_error("step", "weights for step " + std::to_string(change.step) + " after weights for step " +
                                           std::to_string(pending_weights.back().step) + ": set them in step order");
        if (!pending_weights.empty() && change.step == pending_weights.back().step)
            pending_weights.back() = std::move(change);
        else
            pending_weights.push_back(std::move(change));
        version = pending_version;
    }
    // The first recorded change takes effect at this state's step; `check`: its weights' fingerprint
    // (a one-stage mixture_schedule's). Targets count from here, from the counts before the step.
    void take_weights_change(std::uint64_t check) {
        if (pending_weights.empty() || pending_weights.front().step != step)
            throw config_error("state.pending_weights", "no weights were set for step " + std::to_string(step));
        mixture = 2;
        weights = std::move(pending_weights.front().weights);
        pending_weights.erase(pending_weights.begin());
        mixture_check = check;
        mixture_step = step;
        mixture_drawn = drawn_before(step);
        mixture_taken = taken;
        version = pending_weights.empty() ? mixture_version : pending_version;
    }
    // Samples drawn before `step` (at or after origin_step) over all datasets.
    std::uint64_t drawn_before(std::uint64_t at) const noexcept { return origin_drawn + (at - origin_step) * global_batch; }
    friend bool operator==(const sampler_state&, const sampler_state&) = default;
};

// What one step changes in a sampler_state: the next step, and for each dataset the step drew from,
// that dataset's taken, epoch and index after it (nothing else changes while a sampler plans). A state
// with the deltas of the steps after it applied in order is the state after them. Pipelines keep one
// per batch in flight instead of a whole state: a mixture of 10,000 domains holds 70,000 numbers in
// its state, and copying them per batch cost more than the batch's tokens (bench_mixture, 10,000
// domains: 0.12x a 2-domain blend with whole states).
struct sampler_step_delta {
    struct position {
        std::uint32_t dataset = 0;
        std::uint64_t taken = 0, epoch = 0, index = 0;
    };
    std::uint64_t step = 0;  // the step after
    std::vector<position> datasets;
    // The step took the state's first pending weights (sampler_state::take_weights_change), whose
    // fingerprint is `weights_check`.
    bool took_weights = false;
    std::uint64_t weights_check = 0;

    // `s` must be the state the step was planned from (or the state after the step before it).
    void apply_to(sampler_state& s) const {
        if (took_weights) s.take_weights_change(weights_check);  // before the step: its targets count from here
        s.step = step;
        for (const position& p : datasets) {
            s.taken.at(p.dataset) = p.taken;
            s.epoch[p.dataset] = p.epoch;
            s.index[p.dataset] = p.index;
        }
    }
};

// What restoring a state saved with another global batch does (pipeline::restore): refuse it (the
// default: the batches would differ from either run's), or go on from the same sample.
enum class global_batch_change { refuse, from_same_sample };

// What restoring a state saved with another mixture schedule (or none) does (pipeline::restore): refuse
// it (the default), or go on with the sampler's schedule from the saved step
// (sampler::with_mixture_from_step).
enum class mixture_change { refuse, from_step };

// `s`, saved with one global batch, made to go on with `global_batch` from the same sample: every
// dataset's next sample is the one it would have drawn next, and steps keep their numbers (the next
// step is s.step). What differs from a run with either batch throughout is where epochs end (the
// samples a tail = drop leaves out of an epoch's last batch) and, for one dataset, nothing else: the
// stream of samples is the same. restore() of the result checks it like any state.
inline sampler_state with_global_batch(const sampler_state& s, std::uint64_t global_batch) {
    if (s.global_batch == global_batch) return s;
    if (s.mixed())
        throw config_error("global_batch", "a run mixed by a schedule goes on with its global batch, " + std::to_string(s.global_batch) +
                                               " (a schedule's targets count samples per step)");
    sampler_state r = s;
    r.version = sampler_state::rebased_version;
    r.global_batch = global_batch;
    r.origin_step = s.step;
    r.origin_drawn = 0;
    for (std::uint64_t t : s.taken) r.origin_drawn += t;
    const bool one = s.epoch.size() == 1 && s.index.size() == 1;
    r.origin_epoch = one ? s.epoch[0] : 0;
    r.origin_index = one ? s.index[0] : 0;
    return r;
}

class sampler {
public:
    // Single dataset. Throws config_error for an invalid config (named field and numbers). `data`
    // must outlive the sampler. `block_starts`: first document of each shard (shuffle_mode::shard_blocks).
    template <document_lengths D>
    sampler(const D& data, sampler_config config, std::vector<std::uint64_t> block_starts = {}) : sampler(config, {1.0}) {
        streams_.emplace_back(data, config_, 0, std::move(block_starts));
        finish_setup();
    }

    // Several datasets mixed by weight (normalised): every prefix of the sample stream holds each
    // dataset's share to within one sample, as Megatron's BlendedDataset does. No epochs overall: each
    // dataset cycles through its own epochs; `tail` does not apply.
    template <document_lengths D>
    sampler(const std::vector<const D*>& datasets, std::vector<double> weights, sampler_config config)
            : sampler(config, std::move(weights)) {
        if (datasets.size() != weights_.size() || datasets.empty())
            throw config_error("weights", "give one weight per dataset (" + std::to_string(datasets.size()) + " datasets, " +
                                              std::to_string(weights_.size()) + " weights)");
        streams_.reserve(datasets.size());
        for (std::uint32_t i = 0; i < datasets.size(); ++i) streams_.emplace_back(*datasets[i], config_, i);
        finish_setup();
    }

    // Datasets of any kind (sampler_dataset), mixed by weight: one dataset behaves as the
    // single-dataset sampler (epochs, tail policy), several as the blend above.
    sampler(std::vector<sampler_dataset> datasets, std::vector<double> weights, sampler_config config)
            : sampler(config, std::move(weights)) {
        if (datasets.size() != weights_.size() || datasets.empty())
            throw config_error("weights", "give one weight per dataset (" + std::to_string(datasets.size()) + " datasets, " +
                                              std::to_string(weights_.size()) + " weights)");
        streams_.reserve(datasets.size());
        for (std::uint32_t i = 0; i < datasets.size(); ++i) streams_.emplace_back(std::move(datasets[i]), config_, i);
        finish_setup();
    }

    // Datasets mixed by a schedule of weights over the steps (sampling/mixture_schedule.hpp), one
    // domain per dataset in order: after every sample each dataset's count is within one sample of
    // its scheduled share of the samples so far (sampling/mixer.hpp). At least two datasets; each
    // walks its own epochs. Throws config_error for a schedule whose domains are not one per dataset.
    sampler(std::vector<sampler_dataset> datasets, std::shared_ptr<const mixture_schedule> schedule, sampler_config config)
            : sampler(config, std::vector<double>(datasets.size(), 1.0)) {
        if (!schedule) throw config_error("mixture", "no schedule given");
        if (datasets.size() < 2) throw config_error("mixture", "a mixture needs two datasets at least (give one dataset on its own)");
        if (schedule->domains() != datasets.size())
            throw config_error("mixture", "the schedule has " + std::to_string(schedule->domains()) + " domains for " +
                                              std::to_string(datasets.size()) + " datasets");
        mixture_ = std::move(schedule);
        streams_.reserve(datasets.size());  // exactly: a mixture's 10,000 streams, no doubling
        for (std::uint32_t i = 0; i < datasets.size(); ++i) streams_.emplace_back(std::move(datasets[i]), config_, i);
        finish_setup();
        state_.version = sampler_state::mixture_version;
        state_.mixture = 1;
        state_.mixture_check = mixture_->fingerprint();
        state_.mixture_taken.assign(streams_.size(), 0);
        state_.weights = mixture_->shares(0);
        std::vector<double>().swap(weights_);  // a blend's fixed shares (choose_dataset): the schedule decides here
    }

    // Mixed by a schedule: the shares in force at the next step (the schedule's, or weights set during
    // the run). Empty for other samplers.
    const mixture_schedule* mixture() const noexcept { return mixture_.get(); }
    std::vector<double> mixture_shares() const { return mixture_shares(state_); }
    // The same for any state of this sampler (a delivered batch's, for stats).
    std::vector<double> mixture_shares(const sampler_state& s) const {
        if (!mixture_ || !s.mixed()) return {};
        return effective_schedule(s)->shares(s.step - s.mixture_step);
    }

    // Weights set during the run (online mixing, e.g. from per-domain losses): from the next step on,
    // each dataset's target grows by its share of these; what was drawn so far stays as it is. Recorded
    // in the state (restore goes on with them, exactly). Throws config_error for a sampler without a
    // schedule or weights that are not one per dataset, finite and at least 0, or all 0.
    void set_mixture_weights(const std::vector<double>& weights) {
        const std::uint64_t check = weights_fingerprint(weights);
        state_.mixture = 2;
        state_.weights = weights;
        state_.mixture_check = check;
        rebase_mixture(state_);
        mixer_.reset();
    }
    // The same from `step` on (at or after the next step, and after any step set before): recorded
    // in the state until then, so a state saved in between resumes with it and the stream does not
    // depend on when the call was made. What a pipeline planning ahead uses. Weights for the same
    // step as the last ones set replace them.
    void set_mixture_weights(const std::vector<double>& weights, std::uint64_t step) {
        (void)weights_fingerprint(weights);  // checked now, not when the step is planned
        state_.add_weights_change({step, weights});
    }

    // `s` (a state of this sampler's datasets, mixed or blended by fixed weights) made to go on with
    // this sampler's schedule from its step: targets count from the counts at that step, and the
    // schedule's stages keep their step numbers (those before it no longer matter). The explicit way
    // to continue a run with a new or edited schedule; restore() refuses a schedule that differs from
    // the saved one. A state already of this schedule is returned as it is; one whose weights were set
    // during the run goes back to this schedule. Throws config_error when the step falls inside a ramp
    // of the schedule.
    sampler_state with_mixture_from_step(sampler_state s) const {
        if (!mixture_) throw config_error("mixture", "this sampler has no mixture schedule to go on with");
        if (s.version != sampler_state::current_version && !s.mixed())
            throw config_error("state.version",
                               "version " + std::to_string(s.version) +
                                   ": a state that changed its global batch (2), or an unknown one, cannot go on with a schedule");
        // Already this schedule's (saved by a run with it, in force): nothing to rebase, and rebasing
        // would drop what its targets carried past whole samples.
        if (s.mixed() && s.mixture == 1 && s.mixture_check == mixture_->fingerprint()) return s;  // weights set for later steps kept
        (void)mixture_->from_step(s.step);                                                        // refuses a step inside a ramp
        s.version = sampler_state::mixture_version;
        s.pending_weights.clear();  // weights set for later steps belonged to the run this one replaces
        s.mixture = 1;
        s.mixture_check = mixture_->fingerprint();
        s.weights = mixture_->shares(s.step);
        rebase_mixture(s);
        return s;
    }

    int rank() const noexcept { return rank_; }
    int world_size() const noexcept { return world_; }
    std::uint64_t local_batch() const noexcept { return config_.global_batch / static_cast<std::uint64_t>(world_); }
    const sampler_config& config() const noexcept { return config_; }
    const dataset_stream& stream(std::size_t i) const { return streams_.at(i); }

    // Single dataset: global steps in `epoch`, and what the tail policy did to its last batch.
    std::uint64_t steps_in_epoch(std::uint64_t epoch) {
        const std::uint64_t spe = streams_.at(0).samples_in_epoch(epoch), g = config_.global_batch;
        return config_.tail == tail_policy::drop ? spe / g : (spe + g - 1) / g;
    }
    std::uint64_t dropped_in_epoch(std::uint64_t epoch) {
        const std::uint64_t spe = streams_.at(0).samples_in_epoch(epoch);
        return config_.tail == tail_policy::drop ? spe % config_.global_batch : 0;
    }
    std::uint64_t padded_in_epoch(std::uint64_t epoch) {
        const std::uint64_t spe = streams_.at(0).samples_in_epoch(epoch);
        return config_.tail != tail_policy::drop ? steps_in_epoch(epoch) * config_.global_batch - spe : 0;
    }
    // The same for the epoch the next step starts in (GPT windows: every epoch).
    std::uint64_t steps_per_epoch() { return steps_in_epoch(current_epoch()); }
    std::uint64_t dropped_per_epoch() { return dropped_in_epoch(current_epoch()); }
    std::uint64_t padded_per_epoch() { return padded_in_epoch(current_epoch()); }
    std::uint64_t current_epoch() const noexcept { return state_.epoch[0]; }

    // The plan for the next step: this rank's slice of the global batch. Advances the state.
    batch_plan next() {
        batch_plan b;
        plan_step(state_, b);
        return b;
    }
    // The same into `b`, reusing its storage (no allocation once it has held a batch).
    void next(batch_plan& b) { plan_step(state_, b); }
    // The same, with what the step changed in state() (storage reused): O(datasets drawn from), not
    // O(datasets).
    void next(batch_plan& b, sampler_step_delta& delta) {
        plan_step(state_, b);
        delta_of_step(state_, delta);
    }

    // next(b, delta) in two halves, for threads that share one sampler under a lock (the pipeline's
    // workers): next_drawn, under the lock, advances the state and says which dataset, epoch and index
    // each sample of the step takes (the sequential part: the blend's rule or the mixer); plan_drawn,
    // outside it, fills their segments. plan_drawn calls may run at once on several threads, and beside
    // next_drawn: each stream plans under its own lock (a one-document stream needs none), and a
    // sample's segments depend only on its dataset, epoch and index. Together they give what next(b, delta) gives. A single dataset plans
    // whole in next_drawn: its step is a few runs of one stream (and pipelines give each worker a
    // sampler of its own for the windows of one small dataset).
    void next_drawn(batch_plan& b, sampler_step_delta& delta) {
        draw_step(state_, b);
        delta_of_step(state_, delta);
    }
    void plan_drawn(batch_plan& b) {
        if (streams_.size() == 1) return;
        // Dataset by dataset: one lock per run of a stream's samples, and two threads planning a blend
        // of a few datasets do not pass each stream's lock back and forth sample by sample.
        // Sorted as integers, (dataset << 32) | row, not rows by a comparison that looks their samples
        // up: a batch of a mixture's domains is mostly distinct datasets, a full sort each step.
        auto& order = b.by_dataset;
        auto& keys = b.runs.keys;
        order.resize(b.samples.size());
        keys.resize(b.samples.size());
        for (std::uint32_t i = 0; i < order.size(); ++i) {
            keys[i] = std::uint64_t{b.samples[i].dataset} << 32 | i;
            streams_[b.samples[i].dataset].prefetch();
        }
        if (keys.size() <= rank_sorted_most) {
            // Each key's place is the number of keys below it (they are distinct: the row is in
            // them), counted without a branch: the comparisons of std::sort on a mixture's keys, mostly
            // distinct domains in random order, were mispredicted half the time, and it took 14 ns a
            // key to this count's 4 (32 keys, this machine).
            constexpr std::uint64_t bias = std::uint64_t{1} << 63;  // unsigned order through signed compares (AVX2 has only those)
            for (std::size_t i = 0; i < keys.size(); ++i) {
                const auto key = static_cast<std::int64_t>(keys[i] ^ bias);
                std::size_t below = 0;
                for (std::size_t j = 0; j < keys.size(); ++j) below += static_cast<std::int64_t>(keys[j] ^ bias) < key;
                order[below] = static_cast<std::uint32_t>(keys[i]);
            }
        } else {
            std::sort(keys.begin(), keys.end());
            for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(keys[i]);
        }
        // Each run's stream's epoch layout requested a few runs before it is planned: with thousands
        // of domains of a few shards each, the stream, its layout and the layout's tables were misses
        // one after another (perf: most of plan_drawn's time at 10,000 domains of 3 shards).
        std::size_t ahead = 0;  // the first row of the run whose layout is requested next
        const auto request_next_layout = [&] {
            const std::uint32_t d = b.samples[order[ahead]].dataset;
            streams_[d].prefetch_layout();
            while (ahead < order.size() && b.samples[order[ahead]].dataset == d) ++ahead;
        };
        if (!some_lay_out_) ahead = order.size();  // one-document windows all: nothing to request
        for (std::size_t k = 0; k < layout_lookahead && ahead < order.size(); ++k) request_next_layout();
        plan_scratch& one = b.runs;
        one.permutations.clear();
        one.which.clear();
        one.rows.clear();
        one.indices.clear();
        one.laid_out.clear();
        // The run starting at order[at]: samples of its dataset that follow each other in one epoch.
        const auto run_from = [&](std::size_t at) {
            const sample_plan& head = b.samples[order[at]];
            std::size_t n = 1;
            while (at + n < order.size() && b.samples[order[at + n]].dataset == head.dataset &&
                   b.samples[order[at + n]].epoch == head.epoch && b.samples[order[at + n]].index == head.index + n)
                ++n;
            return n;
        };
        for (std::size_t at = 0; at < order.size();) {
            if (ahead < order.size()) request_next_layout();
            const std::uint32_t d = b.samples[order[at]].dataset;
            dataset_stream& s = streams_[d];
            if (s.plans_without_layout()) {
                // Without the lock. A long run of consecutive samples (a blend's) is permuted at once
                // with its permutation's keys shared; the samples of short runs (a mixture's, a row or
                // two a domain) are permuted together below, each with its (stream, epoch)'s keys.
                while (at < order.size() && b.samples[order[at]].dataset == d) {
                    const sample_plan& head = b.samples[order[at]];
                    const std::size_t n = run_from(at);
                    if (!s.shuffles_samples()) {
                        for (std::size_t i = 0; i < n; ++i) {
                            sample_plan& p = b.samples[order[at + i]];
                            s.plan_one_document(p.epoch, p.index, p.index, p);
                        }
                    } else if (n >= shared_keys_run) {
                        one.shuffled.resize(n);
                        s.samples_of_epoch(head.epoch).map(head.index, n, one.shuffled.data(), one.pending);
                        for (std::size_t i = 0; i < n; ++i) {
                            sample_plan& p = b.samples[order[at + i]];
                            s.plan_one_document(p.epoch, p.index, one.shuffled[i], p);
                        }
                    } else {
                        one.permutations.push_back(s.samples_of_epoch(head.epoch));
                        for (std::size_t i = 0; i < n; ++i) {
                            one.which.push_back(static_cast<std::uint32_t>(one.permutations.size() - 1));
                            one.indices.push_back(head.index + i);
                            one.rows.push_back(order[at + i]);
                        }
                    }
                    at += n;
                }
                continue;
            }
            // A dataset's samples in a step follow each other in its epoch (drawn in row order): each
            // such run planned at once (plan_run: the permutation batched, ~3x the rate), where one
            // at a time took half of a two-dataset blend's time (perf, bench_mixture's baseline).
            // Short runs of windows (a domain of a few shards) are permuted with the one-document
            // streams' samples below, then placed in their epochs under the lock.
            const bool defer_short = s.plans_windows() && s.shuffles_samples() && s.samples_per_epoch() >= deferred_from_samples;
            std::unique_lock<detail::spin_lock> hold(s.planning_lock(), std::defer_lock);
            while (at < order.size() && b.samples[order[at]].dataset == d) {
                const sample_plan& head = b.samples[order[at]];
                const std::size_t n = run_from(at);
                if (defer_short && n < shared_keys_run) {
                    one.permutations.push_back(s.samples_of_epoch(head.epoch));
                    for (std::size_t i = 0; i < n; ++i) {
                        one.laid_out.push_back(static_cast<std::uint32_t>(one.rows.size()));
                        one.which.push_back(static_cast<std::uint32_t>(one.permutations.size() - 1));
                        one.indices.push_back(head.index + i);
                        one.rows.push_back(order[at + i]);
                    }
                } else {
                    if (!hold.owns_lock()) hold.lock();
                    if (n == 1) {
                        sample_plan& p = b.samples[order[at]];
                        s.plan(p.epoch, p.index, p);
                    } else {
                        s.plan_run(
                            head.epoch, head.index, n, [&, from = at](std::size_t i) -> sample_plan& { return b.samples[order[from + i]]; },
                            b.runs);
                    }
                }
                at += n;
            }
        }
        if (one.rows.empty()) return;
        one.shuffled.resize(one.rows.size());
        feistel_permutation::map_each(one.permutations.data(), one.which.data(), one.indices.data(), one.rows.size(), one.shuffled.data(),
                                      one.pending);
        // As plan_one_document, from the sampler's window length (every stream's): the streams, cold at
        // 10,000 domains, are not read again.
        const std::uint64_t seq_len = config_.seq_len;
        for (std::size_t i = 0, next_laid = 0; i < one.rows.size(); ++i) {
            if (next_laid < one.laid_out.size() && one.laid_out[next_laid] == i) {
                ++next_laid;
                continue;
            }
            // One segment, written in place: a sample's vector holds one from the step before (the plan
            // is reused), and clear() then push_back() was a call a sample (perf, 10,000 domains).
            auto& segments = b.samples[one.rows[i]].segments;
            if (segments.size() != 1) segments.resize(1);
            segments.front() = {0, one.shuffled[i] * seq_len, seq_len + 1};
        }
        // The laid-out streams' samples, each stream's (consecutive here) under one hold of its lock.
        const auto& laid = one.laid_out;
        for (std::size_t k = 0; k < laid.size();) {
            const std::uint32_t d = b.samples[one.rows[laid[k]]].dataset;
            dataset_stream& s = streams_[d];
            const std::lock_guard hold(s.planning_lock());
            for (; k < laid.size() && b.samples[one.rows[laid[k]]].dataset == d; ++k) {
                sample_plan& p = b.samples[one.rows[laid[k]]];
                s.plan_window(p.epoch, p.index, one.shuffled[laid[k]], p);
            }
        }
    }

    // The plan for any step of a single-dataset sampler, without changing the state. GPT windows:
    // O(batch); packed rows: also lays out every epoch before the step's (epoch lengths differ).
    batch_plan plan_at(std::uint64_t step) {
        batch_plan b;
        sampler_state after;
        plan_at(step, b, after);
        return b;
    }
    // The same into `b` (storage reused), and in `after` the state next() leaves once it has planned
    // `step`: state() after a sequential walk to it, field for field. Lets several threads plan steps
    // of one stream in parallel, each with its own sampler (pipeline workers). `step` may lie before
    // the current state (what was drawn before it is recomputed from the global batch).
    void plan_at(std::uint64_t step, batch_plan& b, sampler_state& after) {
        if (streams_.size() > 1) throw config_error("plan_at", "random access is for a single dataset; blended streams are sequential");
        if (step < state_.origin_step)
            throw config_error("plan_at", "step " + std::to_string(step) + " comes before step " + std::to_string(state_.origin_step) +
                                              ", where this run went on with another global batch");
        after = state_;  // copy-assignment: reuses `after`'s vectors once they have held a state
        // Single dataset: every step draws the whole global batch, so `taken` is linear in the step
        // (modular arithmetic gives the right value for an earlier step too).
        after.taken[0] = state_.taken[0] + (step - state_.step) * config_.global_batch;
        after.step = step;
        const auto start = step_start(state_, step);
        after.epoch[0] = start.epoch;
        after.index[0] = start.index;
        plan_step(after, b);
    }

    const sampler_state& state() const noexcept { return state_; }
    // plan_at with the change from the state before `step` to `after` (one dataset: its position).
    void plan_at(std::uint64_t step, batch_plan& b, sampler_state& after, sampler_step_delta& delta) {
        plan_at(step, b, after);
        delta_of_step(after, delta);
    }

    // Single dataset: the state at the first step of `epoch`, for restore() to begin a run there, as
    // if the epochs before had been walked (set_epoch). Packed rows lay out each epoch before it once
    // (their lengths differ). Throws config_error for a blend (each dataset walks its own epochs) and
    // for an epoch past what a run can reach.
    sampler_state state_at_epoch(std::uint64_t epoch) {
        if (streams_.size() > 1) throw config_error("epoch", "a blend has no common epoch: each of its datasets walks its own");
        const std::uint64_t g = config_.global_batch, limit = max_step / g;
        std::uint64_t step = 0;
        if (config_.mode == sample_mode::windows) {
            const std::uint64_t per = steps_in_epoch(0);
            if (per != 0 && epoch > limit / per) throw config_error("epoch", std::to_string(epoch) + ": past what a run can reach");
            step = epoch * per;
        } else {
            for (std::uint64_t e = 0; e < epoch; ++e) {
                check_epoch_fits(e);
                step += steps_in_epoch(e);
                if (step > limit) throw config_error("epoch", std::to_string(epoch) + ": past what a run can reach");
            }
        }
        // As if walked from the start with this global batch: a run that went on with another one
        // from some step (with_global_batch) gives that up here.
        sampler_state s = state_;
        s.version = sampler_state::current_version;
        s.origin_step = s.origin_drawn = s.origin_epoch = s.origin_index = 0;
        s.step = s.taken[0] = s.epoch[0] = s.index[0] = 0;
        if (step > 0) {
            // The state the previous epoch's last step leaves, as restore() expects it.
            s.step = step;
            s.taken[0] = step * g;
            const auto start = step_start(s, step - 1);
            s.epoch[0] = start.epoch;
            s.index[0] = start.index + g;
        }
        return s;
    }

    // Single dataset: the step at which `epoch` begins in this run, capped at what a run can reach.
    // After with_global_batch, counted from where the run went on: an epoch that began before then
    // gives that step.
    std::uint64_t first_step_of_epoch(std::uint64_t epoch) {
        if (streams_.size() > 1) throw config_error("epoch", "a blend has no common epoch: each of its datasets walks its own");
        const std::uint64_t g = config_.global_batch, limit = max_step / g;
        const sampler_state& st = state_;
        if (epoch <= st.origin_epoch && (st.rebased() || epoch == 0)) return st.origin_step;
        std::uint64_t step = st.origin_step, e = st.origin_epoch;
        if (st.rebased()) {
            const std::uint64_t spe = streams_[0].samples_in_epoch(e), left = st.origin_index >= spe ? 0 : spe - st.origin_index;
            step += config_.tail == tail_policy::drop ? left / g : (left + g - 1) / g;
            ++e;
        }
        if (config_.mode == sample_mode::windows) {
            const std::uint64_t per = steps_in_epoch(0);
            return epoch - e > (limit - std::min(limit, step)) / per ? limit : step + (epoch - e) * per;
        }
        for (; e < epoch && step < limit; ++e) {
            check_epoch_fits(e);
            step += steps_in_epoch(e);
        }
        return std::min(step, limit);
    }

    // The furthest step x global batch a state may hold: far past any run, far from wrapping 2^64.
    static constexpr std::uint64_t max_step = std::uint64_t(1) << 62;

    // Continues from `s` (saved by any world size with the same global batch). O(1) plus one epoch
    // layout: no replay. Throws config_error naming the first field that differs.
    void restore(const sampler_state& s) {
        auto differs = [&](const std::string& field, auto a, auto b) {
            if (a != b) throw config_error("state." + field, "saved " + to_text(a) + ", this sampler has " + to_text(b));
        };
        // Enumerations by name: "saved packed, this sampler has windows", not "saved 1, ... 0".
        auto differs_named = [&]<class E>(const std::string& field, std::uint32_t a, std::uint32_t b, E) {
            auto name = [](std::uint32_t v) {
                const std::string_view n = name_of(static_cast<E>(v));
                return n == "?" ? "unknown value " + std::to_string(v) : std::string(n);
            };
            if (a != b) throw config_error("state." + field, "saved " + name(a) + ", this sampler has " + name(b));
        };
        if (s.version != sampler_state::current_version && s.version != sampler_state::rebased_version &&
            s.version != sampler_state::mixture_version && s.version != sampler_state::pending_version)
            throw config_error("state.version", "unsupported version " + std::to_string(s.version));
        if ((s.version == sampler_state::pending_version) != !s.pending_weights.empty())
            throw config_error("state.pending_weights", "a version-" + std::to_string(s.version) + " state " +
                                                            (s.pending_weights.empty() ? "without" : "with") +
                                                            " weights set for later steps (edited or corrupted state)");
        if (mixture_ && !s.mixed())
            throw config_error("state.mixture",
                               "saved without a mixture schedule, and this sampler mixes by one: go on with it from the "
                               "saved step explicitly (sampler::with_mixture_from_step; pipeline::restore with "
                               "mixture_change::from_step)");
        if (!mixture_ && s.mixed())
            throw config_error("state.mixture", "saved by a run mixed with a schedule: make the sampler with that schedule");
        if (!s.mixed() && ((s.mixture | s.mixture_check | s.mixture_step | s.mixture_drawn) != 0 || !s.mixture_taken.empty()))
            throw config_error("state.mixture", "a version-" + std::to_string(s.version) + " state has no mixture fields");
        if (!s.rebased() && (s.origin_step | s.origin_drawn | s.origin_epoch | s.origin_index) != 0)
            throw config_error("state.origin_step", "a version-1 state has no origin fields");
        differs("seed", s.seed, state_.seed);
        differs("seq_len", s.seq_len, state_.seq_len);
        differs("global_batch", s.global_batch, state_.global_batch);
        differs_named("mode", s.mode, state_.mode, sample_mode{});
        differs_named("shuffle", s.shuffle, state_.shuffle, shuffle_mode{});
        differs("shuffle_samples", s.shuffle_samples, state_.shuffle_samples);
        differs_named("tail", s.tail, state_.tail, tail_policy{});
        differs("datasets", s.dataset_documents.size(), state_.dataset_documents.size());
        const std::size_t n = state_.dataset_documents.size();
        if (s.dataset_tokens.size() != n || s.weights.size() != n || s.taken.size() != n || s.epoch.size() != n || s.index.size() != n)
            throw config_error("state", "per-dataset fields differ in length");
        for (std::size_t i = 0; i < n; ++i) {
            const std::string at = index_text(i);
            differs("dataset_documents" + at, s.dataset_documents[i], state_.dataset_documents[i]);
            differs("dataset_tokens" + at, s.dataset_tokens[i], state_.dataset_tokens[i]);
            if (!s.mixed()) differs("weights" + at, s.weights[i], state_.weights[i]);
            const bool at_origin = n == 1 && s.rebased() && s.step == s.origin_step;  // the earlier batch's index (bounded below)
            if (!at_origin && s.index[i] > streams_[i].samples_in_epoch(s.epoch[i]) + config_.global_batch)
                throw config_error("state.index" + at,
                                   "sample " + std::to_string(s.index[i]) + " is past the end of epoch " + std::to_string(s.epoch[i]));
        }
        // Steps and sample counts stay far from wrapping (the staging ring numbers slots 2 x step + 1).
        if (s.step > max_step / s.global_batch)
            throw config_error("state.step", std::to_string(s.step) + " steps of " + std::to_string(s.global_batch) +
                                                 " samples: past what a run can reach (edited or corrupted state)");
        if (s.rebased() && (s.origin_step > s.step || s.origin_drawn > max_step))
            throw config_error("state.origin_step", "step " + std::to_string(s.origin_step) + " after " + std::to_string(s.origin_drawn) +
                                                        " samples does not come before step " + std::to_string(s.step) +
                                                        " (edited or corrupted state)");
        // One dataset: the origin is where the earlier batch left the stream, no further than the samples
        // drawn by then reach (each epoch holds one at least; a padded last batch passes the epoch's end
        // by less than a batch, and a batch is at most what was drawn).
        if (n == 1 && s.rebased() &&
            (s.origin_epoch > s.origin_drawn || (s.origin_drawn == 0 && s.origin_index != 0) ||
             s.origin_index > streams_[0].samples_in_epoch(s.origin_epoch) + s.origin_drawn))
            throw config_error("state.origin_index", "epoch " + std::to_string(s.origin_epoch) + ", sample " +
                                                         std::to_string(s.origin_index) + " cannot follow " +
                                                         std::to_string(s.origin_drawn) + " samples (edited or corrupted state)");
        // Every step draws the whole global batch, so a state whose counts disagree was edited or
        // corrupted (and workers planning with plan_at would resume elsewhere than next()).
        const std::uint64_t drawn = s.drawn_before(s.step);  // <= 2 x max_step: no wrap
        std::uint64_t taken = 0;                             // capped at drawn + 1: no wrap either
        for (std::uint64_t t : s.taken) taken = std::min(taken + std::min(t, drawn + 1), drawn + 1);
        if (taken != drawn)
            throw config_error("state.taken", "samples drawn per dataset do not add up to " + std::to_string(drawn) + " (" +
                                                  std::to_string(s.step) + " steps of " + std::to_string(s.global_batch) +
                                                  (s.rebased() ? " since step " + std::to_string(s.origin_step) + ")" : ")"));
        // Where each stream is follows from what it drew: a state whose position was edited apart from
        // its counts (or the reverse) is refused. One dataset: from the step (every epoch's steps, as
        // plan_at walks them; packed rows lay out each epoch once). A blend of GPT windows: from each
        // dataset's count (its epochs are all alike). Packed blends rely on the state's checksum.
        if (n == 1 && s.step > s.origin_step) {
            // Packed rows walk each epoch's steps up to the saved epoch at most (a state that claims a
            // later one is refused below without laying out more epochs than it names).
            const auto last = step_start(s, s.step - 1, s.epoch[0]);
            const std::uint64_t index = last.index + s.global_batch;
            if (s.epoch[0] != last.epoch || s.index[0] != index)
                throw config_error("state.index", "epoch " + std::to_string(s.epoch[0]) + ", sample " + std::to_string(s.index[0]) +
                                                      " is not where step " + std::to_string(s.step) + " leaves this stream (epoch " +
                                                      std::to_string(last.epoch) + ", sample " + std::to_string(index) + ")");
        } else if (n == 1 && s.rebased() && (s.epoch[0] != s.origin_epoch || s.index[0] != s.origin_index)) {
            throw config_error("state.index", "epoch " + std::to_string(s.epoch[0]) + ", sample " + std::to_string(s.index[0]) +
                                                  " is not where the run went on with this global batch (epoch " +
                                                  std::to_string(s.origin_epoch) + ", sample " + std::to_string(s.origin_index) + ")");
        } else if (n > 1 && config_.mode == sample_mode::windows) {
            for (std::size_t i = 0; i < n; ++i) {
                const std::uint64_t per = streams_[i].samples_in_epoch(0), t = s.taken[i];
                const std::uint64_t epoch = t == 0 ? 0 : (t - 1) / per, index = t == 0 ? 0 : t - epoch * per;
                if (s.epoch[i] != epoch || s.index[i] != index)
                    throw config_error("state.taken" + index_text(i), std::to_string(t) + " samples drawn leave dataset " +
                                                                          std::to_string(i) + " at epoch " + std::to_string(epoch) +
                                                                          ", sample " + std::to_string(index) + ", not the saved epoch " +
                                                                          std::to_string(s.epoch[i]) + ", sample " +
                                                                          std::to_string(s.index[i]) + " (edited or corrupted state)");
            }
        }
        if (s.mixed()) check_mixture(s);
        state_ = s;
        mixer_.reset();
    }

private:
    // A mixed state's own fields: where its targets count from, which schedule, and counts within one
    // sample of their targets (the mixer refuses others).
    void check_mixture(const sampler_state& s) {
        const std::size_t n = streams_.size();
        if (s.mixture != 1 && s.mixture != 2)
            throw config_error("state.mixture",
                               "unknown value " + std::to_string(s.mixture) + " (1: the schedule, 2: weights set during the run)");
        if (s.mixture_taken.size() != n) throw config_error("state.mixture_taken", "not one count per dataset");
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < n; ++i) {
            if (s.mixture_taken[i] > s.taken[i])
                throw config_error("state.mixture_taken" + index_text(i),
                                   "more than the dataset's samples drawn since (edited or corrupted state)");
            sum += s.mixture_taken[i];
        }
        if (s.mixture_step > s.step || s.mixture_drawn != s.mixture_step * s.global_batch || sum != s.mixture_drawn)
            throw config_error("state.mixture_step", "step " + std::to_string(s.mixture_step) + " after " +
                                                         std::to_string(s.mixture_drawn) + " samples is not a step before " +
                                                         std::to_string(s.step) + " (edited or corrupted state)");
        if (s.mixture == 1 && s.mixture_check != mixture_->fingerprint())
            throw config_error("state.mixture_check",
                               "saved with another mixture schedule: go on with this one from the saved step "
                               "explicitly (sampler::with_mixture_from_step; pipeline::restore with "
                               "mixture_change::from_step)");
        for (std::size_t i = 0; i < n; ++i)  // shown in stats and saved again: numbers JSON can hold
            if (!std::isfinite(s.weights[i]) || s.weights[i] < 0)
                throw config_error("state.weights" + index_text(i), "not a finite number, at least 0 (edited or corrupted state)");
        if (s.mixture == 2 && s.mixture_check != effective_schedule(s)->fingerprint())
            throw config_error("state.weights",
                               "the weights set during the run do not match the state's check (edited or corrupted state)");
        for (std::size_t k = 0; k < s.pending_weights.size(); ++k) {
            const auto& p = s.pending_weights[k];
            if (p.step < s.step || (k > 0 && p.step <= s.pending_weights[k - 1].step))
                throw config_error("state.pending_weights" + index_text(k), "step " + std::to_string(p.step) +
                                                                                " is not after the state's step " + std::to_string(s.step) +
                                                                                " and the step before it (edited or corrupted state)");
            try {
                (void)weights_fingerprint(p.weights);
            } catch (const config_error& e) {
                throw config_error("state.pending_weights" + index_text(k), e.what());
            }
        }
        try {  // counts within one sample of their targets: the mixer refuses others
            (void)mixer(effective_schedule(s), s.global_batch, s.drawn_before(s.step) - s.mixture_drawn, taken_since(s));
        } catch (const config_error& e) {
            if (e.field().starts_with("state.")) throw;
            throw config_error("state.mixture_taken", std::string(e.what()) + " (edited or corrupted state)");
        }
    }

    // The schedule in force for a mixed state: the sampler's from its mixture_step, or the weights set
    // during the run.
    std::shared_ptr<const mixture_schedule> effective_schedule(const sampler_state& s) const {
        if (s.mixture == 2) {
            try {
                return std::make_shared<const mixture_schedule>(mixture_->names(), std::vector<mixture_stage>{{0, s.weights, 0, ""}});
            } catch (const config_error& e) {
                throw config_error("state.weights", std::string("weights set during the run: ") + e.what());
            }
        }
        if (s.mixture_step == 0) return mixture_;
        return std::make_shared<const mixture_schedule>(mixture_->from_step(s.mixture_step));
    }
    // Weights set during the run, checked (one per dataset, finite, at least 0, not all 0; config_error
    // otherwise), as the fingerprint of the one-stage schedule they make.
    std::uint64_t weights_fingerprint(const std::vector<double>& weights) const {
        if (!mixture_) throw config_error("mixture", "weights during the run are for a sampler made with a mixture schedule");
        return mixture_schedule(mixture_->names(), std::vector<mixture_stage>{{0, weights, 0, ""}}).fingerprint();
    }
    static std::vector<std::uint64_t> taken_since(const sampler_state& s) {
        std::vector<std::uint64_t> t(s.taken.size());
        for (std::size_t i = 0; i < t.size(); ++i) t[i] = s.taken[i] - s.mixture_taken[i];
        return t;
    }
    // Targets count from `s`'s step on.
    static void rebase_mixture(sampler_state& s) {
        s.mixture_step = s.step;
        s.mixture_drawn = s.drawn_before(s.step);
        s.mixture_taken = s.taken;
    }
    // The dataset of the sample after `drawn` samples: the mixer over `st`'s counts, rebuilt when the
    // state it follows is not the one it was left at.
    std::uint32_t mix_next(const sampler_state& st, std::uint64_t drawn) {
        const std::uint64_t since = drawn - st.mixture_drawn;
        if (!mixer_ || mixer_->drawn() != since || mixer_step_ != st.mixture_step || mixer_check_ != st.mixture_check) {
            mixer_.emplace(effective_schedule(st), config_.global_batch, since, taken_since(st));
            mixer_step_ = st.mixture_step;
            mixer_check_ = st.mixture_check;
        }
        try {
            return mixer_->next();
        } catch (...) {  // a draw that threw left the mixer half-changed: rebuilt from the state next time
            mixer_.reset();
            throw;
        }
    }

    sampler(sampler_config config, std::vector<double> weights) : config_(config) {
        launch_info env = launch_from_environment();
        rank_ = config_.rank >= 0 ? config_.rank : env.rank;
        world_ = config_.world_size >= 0 ? config_.world_size : env.world_size;
        if (world_ < 1) throw config_error("world_size", "must be at least 1, got " + std::to_string(world_));
        if (rank_ >= world_) throw config_error("rank", std::to_string(rank_) + " is not below world size " + std::to_string(world_));
        if (config_.global_batch == 0 || config_.global_batch % static_cast<std::uint64_t>(world_) != 0)
            throw config_error("global_batch", std::to_string(config_.global_batch) + " samples do not split evenly over " +
                                                   std::to_string(world_) + " ranks");
        double largest = 0;
        for (double w : weights) {
            if (!(w > 0) || !std::isfinite(w)) throw config_error("weights", "every weight must be positive and finite");
            largest = std::max(largest, w);
        }
        // Scaled by the largest first: weights near the double's limit would overflow a plain sum (and
        // every share would become 0, a uniform blend in disguise).
        double total = 0;
        for (double w : weights) total += w / largest;
        weights_.reserve(weights.size());
        for (double w : weights) {
            weights_.push_back(w / largest / total);
            if (!(weights_.back() > 0))
                throw config_error("weights", "weight " + to_text(w) + " is too small beside the largest, " + to_text(largest) +
                                                  ": its share rounds to 0 and its data would never be drawn");
        }
    }

    void finish_setup() {
        some_lay_out_ = std::any_of(streams_.begin(), streams_.end(), [](const dataset_stream& t) { return t.lays_out_epochs(); });
        state_.seed = config_.seed;
        state_.seq_len = config_.seq_len;
        state_.global_batch = config_.global_batch;
        state_.mode = static_cast<std::uint32_t>(config_.mode);
        state_.shuffle = static_cast<std::uint32_t>(config_.shuffle);
        state_.shuffle_samples = config_.shuffle_samples;
        state_.tail = static_cast<std::uint32_t>(config_.tail);
        state_.dataset_documents.reserve(streams_.size());  // exactly: a mixture's 10,000 domains, no doubling
        state_.dataset_tokens.reserve(streams_.size());
        for (auto& s : streams_) {
            state_.dataset_documents.push_back(s.documents());
            state_.dataset_tokens.push_back(s.tokens());
        }
        state_.weights = weights_;
        state_.taken.assign(streams_.size(), 0);
        state_.epoch.assign(streams_.size(), 0);
        state_.index.assign(streams_.size(), 0);
        if (streams_.size() == 1) check_epoch_fits(0);
    }

    // Where `step` (at or after st.origin_step) begins in a single dataset: its epoch and the index of
    // its first sample. From the origin (epoch 0, index 0 unless the run went on with another global
    // batch) the rest of that epoch comes first, then whole epochs. Windows: O(1); packed rows walk
    // each epoch's steps, no further than `last_epoch` (the result is then past it).
    struct step_position {
        std::uint64_t epoch = 0, index = 0;
    };
    step_position step_start(const sampler_state& st, std::uint64_t step,
                             std::uint64_t last_epoch = std::numeric_limits<std::uint64_t>::max()) {
        const std::uint64_t g = config_.global_batch;
        std::uint64_t k = step - st.origin_step, epoch = st.origin_epoch;
        if (st.rebased()) {
            const std::uint64_t spe = streams_.at(0).samples_in_epoch(epoch), from = st.origin_index;
            const std::uint64_t left = from >= spe ? 0 : spe - from;
            const std::uint64_t rest = config_.tail == tail_policy::drop ? left / g : (left + g - 1) / g;
            if (k < rest) return {epoch, from + k * g};
            k -= rest;
            ++epoch;
            check_epoch_fits(epoch);
        }
        if (config_.mode == sample_mode::windows) {  // every epoch alike: no walk
            const std::uint64_t per = steps_in_epoch(0);
            return {epoch + k / per, k % per * g};
        }
        for (std::uint64_t per = steps_in_epoch(epoch); k >= per && epoch <= last_epoch; per = steps_in_epoch(epoch)) {
            k -= per;
            ++epoch;
            check_epoch_fits(epoch);  // an epoch of 0 steps would never end this walk
        }
        return {epoch, k * g};
    }

    void check_epoch_fits(std::uint64_t epoch) {
        if (steps_in_epoch(epoch) == 0)
            throw config_error("global_batch", std::to_string(config_.global_batch) + " exceeds the " +
                                                   std::to_string(streams_[0].samples_in_epoch(epoch)) + " samples of epoch " +
                                                   std::to_string(epoch) + " (use tail = pad or a smaller batch)");
    }

    // Fills this rank's slice of the step `st` points at and advances `st` past it. Every rank walks
    // the same global batch, so every rank ends with the same state.
    void plan_step(sampler_state& st, batch_plan& b) {
        draw_step(st, b);
        plan_drawn(b);
    }

    // plan_step's sequential half: advances `st` past its step and sets each sample of this rank's
    // slice to its dataset, epoch and index; plan_drawn plans their segments (a single dataset: here).
    void draw_step(sampler_state& st, batch_plan& b) {
        const std::uint64_t g = config_.global_batch, local = local_batch();
        const std::uint64_t first = static_cast<std::uint64_t>(rank_) * local;
        b.step = st.step;
        b.first_global_sample = st.drawn_before(st.step);
        b.samples.resize(local);
        touched_.clear();
        took_weights_.reset();
        if (!st.pending_weights.empty() && st.pending_weights.front().step == st.step) {  // weights set for this step
            took_weights_ = weights_fingerprint(st.pending_weights.front().weights);
            st.take_weights_change(*took_weights_);
        }
        if (streams_.size() == 1) {
            touched_.push_back(0);
            auto& s = streams_[0];
            std::uint64_t spe = s.samples_in_epoch(st.epoch[0]);
            // The previous step ended the epoch (or left less than a batch, with tail = drop).
            if (config_.tail == tail_policy::drop ? st.index[0] + g > spe : st.index[0] >= spe) {
                ++st.epoch[0];
                st.index[0] = 0;
                check_epoch_fits(st.epoch[0]);
                spe = s.samples_in_epoch(st.epoch[0]);
            }
            b.epoch = st.epoch[0];
            // The samples inside the epoch in one run; those past its end (tail = pad) wrap around.
            const std::uint64_t begin = st.index[0] + first;
            const std::uint64_t whole = begin >= spe ? 0 : std::min(local, spe - begin);
            s.plan_run(b.epoch, begin, whole, b.samples.data(), scratch_);
            for (std::uint64_t i = 0; i < local; ++i) {
                const bool pad = i >= whole;
                if (pad) s.plan(b.epoch, (begin + i) % spe, b.samples[i]);
                b.samples[i].padding = pad;
            }
            st.index[0] += g;
            st.taken[0] += g;
        } else {
            // Blending: walk the global batch with the largest-deficit rule, keep this rank's slice.
            // The rule looks only at the samples drawn, so a run that went on with another global
            // batch draws the same stream.
            const std::uint64_t before = st.drawn_before(st.step);
            // Each dataset drawn from goes to touched_ once, in the order first drawn, found in a hash
            // set of the step's draws (open addressing, at most half full): no per-dataset mark to
            // miss in cache at each sample of thousands of domains, nor 8 bytes a domain to hold it.
            const std::size_t set_mask = std::bit_ceil(2 * std::min<std::size_t>(g, streams_.size())) - 1;
            const int set_shift = 64 - std::countr_zero(set_mask + 1);  // a hash's top bits index it
            drawn_set_.assign(set_mask + 1, no_dataset);
            if (mixture_) {
                step_domains_.resize(g);
                // The step's domains first (the mixer reads only its own counts), then their samples:
                // with thousands of domains each one's stream and counts are cache misses, and asked for
                // together here they overlap instead of stalling the planner one after another.
                for (std::uint64_t i = 0; i < g; ++i) {
                    const std::uint32_t d = step_domains_[i] = mix_next(st, before + i);
                    streams_[d].prefetch_counts();
                    detail::prefetch(&st.index[d]);
                    detail::prefetch(&st.epoch[d]);
                    detail::prefetch(&st.taken[d]);
                }
            }
            for (std::uint64_t i = 0; i < g; ++i) {
                const std::uint32_t d = mixture_ ? step_domains_[i] : choose_dataset(st.taken, before + i);
                for (std::size_t h = (d * std::uint64_t{0x9E3779B97F4A7C15}) >> set_shift;; h = (h + 1) & set_mask) {
                    if (drawn_set_[h] == d) break;
                    if (drawn_set_[h] == no_dataset) {  // first drawn from in this step
                        drawn_set_[h] = d;
                        touched_.push_back(d);
                        break;
                    }
                }
                auto& s = streams_[d];
                if (st.index[d] >= s.samples_at_least() && st.index[d] >= s.samples_in_epoch(st.epoch[d])) {
                    ++st.epoch[d];
                    st.index[d] = 0;
                }
                if (i >= first && i < first + local) {  // planned by plan_drawn
                    sample_plan& p = b.samples[i - first];
                    p.dataset = d;
                    p.epoch = st.epoch[d];
                    p.index = st.index[d];
                    p.padding = false;
                }
                ++st.index[d];
                ++st.taken[d];
            }
            b.epoch = st.epoch[0];
        }
        ++st.step;
    }

    // What the last plan_step (or draw_step) changed in `st` (the state it left).
    void delta_of_step(const sampler_state& st, sampler_step_delta& delta) const {
        delta.step = st.step;
        delta.datasets.clear();
        delta.took_weights = took_weights_.has_value();
        delta.weights_check = took_weights_.value_or(0);
        for (const std::uint32_t d : touched_) delta.datasets.push_back({d, st.taken[d], st.epoch[d], st.index[d]});
    }

    // Megatron's BlendedDataset rule: the dataset furthest below its share of the first i+1 samples.
    std::uint32_t choose_dataset(const std::vector<std::uint64_t>& taken, std::uint64_t i) const {
        std::uint32_t best = 0;
        double best_deficit = -1e300;
        for (std::uint32_t d = 0; d < weights_.size(); ++d) {
            double deficit = weights_[d] * static_cast<double>(i + 1) - static_cast<double>(taken[d]);
            if (deficit > best_deficit) {
                best_deficit = deficit;
                best = d;
            }
        }
        return best;
    }

    // Numbers as they were saved: doubles in their shortest exact form ("0.6" and "0.6000000000000001",
    // never both "0.600000").
    template <class T>
    static std::string to_text(const T& v) {
        if constexpr (std::is_floating_point_v<T>) {
            char buf[64];
            const auto r = std::to_chars(buf, buf + sizeof buf, v);
            return std::string(buf, r.ptr);
        } else {
            return std::to_string(static_cast<unsigned long long>(v));
        }
    }
    // "[i]", built so: "[" + to_string(i) draws a false -Wrestrict from GCC 12 at -O3.
    static std::string index_text(std::size_t i) {
        std::string at = std::to_string(i);
        at.insert(at.begin(), '[');
        at.push_back(']');
        return at;
    }

    sampler_config config_;
    std::vector<double> weights_;
    std::shared_ptr<const mixture_schedule> mixture_;  // null: fixed weights (or one dataset)
    std::optional<mixer> mixer_;                       // follows state_ while it plans in order
    std::uint64_t mixer_step_ = 0, mixer_check_ = 0;
    int rank_ = 0, world_ = 1;
    std::vector<dataset_stream> streams_;
    plan_scratch scratch_;
    std::vector<std::uint32_t> step_domains_;  // a mixed step's domains, drawn before its samples are planned
    sampler_state state_;
    std::vector<std::uint32_t> touched_;  // the datasets the last plan_step drew from, in the order first drawn
    static constexpr std::uint32_t no_dataset = ~std::uint32_t{0};
    // plan_drawn: one-document runs of at least this many samples are permuted on their own (map).
    static constexpr std::size_t shared_keys_run = 4;
    // plan_drawn: short runs of a laid-out stream of windows are permuted with the others from epochs of
    // this many samples: a smaller permutation rarely walks, and there the second pass over its cold
    // layout cost more than the lanes saved (10,000 domains of 3 shards, 15 windows an epoch: 0.96x).
    static constexpr std::uint64_t deferred_from_samples = 64;
    // plan_drawn: batches of at most this many samples are sorted by counting (n^2 comparisons, no branch).
    static constexpr std::size_t rank_sorted_most = 64;
    static constexpr std::size_t layout_lookahead = 4;  // runs between plan_drawn's request for a layout and its use
    bool some_lay_out_ = false;                         // a stream lays out its epochs (prefetch_layout has work)
    std::vector<std::uint32_t> drawn_set_;              // draw_step's hash set of them (no_dataset: an empty entry)
    std::optional<std::uint64_t> took_weights_;         // the last plan_step took pending weights with this fingerprint
};

}  // namespace feedline
