// feedline/pipeline/text_pipeline.hpp: batches from raw JSONL / text, tokenized on the fly.
// Documents are numbered per rank (rank r of W takes every W-th document of the epoch's order: a seeded
// permutation, or file order with shuffle_mode::none). Worker threads, each with its own
// SentencePieceProcessor, tokenize documents by number through an ordered pool, so the token stream
// is the same whatever the number of workers; one assembler cuts it into GPT windows (T + 1 tokens,
// consecutive rows sharing one token, crossing documents) written straight into ring slots.
// The state is (step, document number, token offset inside it): a restored pipeline starts tokenizing
// at that document and drops the tokens before the offset, so resume works in the middle of a document.
// Packed mode places whole documents into rows by the same greedy rule as for shards, on the stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if FEEDLINE_HAS_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include <feedline/detail/thread_name.hpp>
#include <feedline/exec/worker_pool.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/ring_consumer.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/pipeline/text_state.hpp>
#include <feedline/sampling/permutation.hpp>
#include <feedline/sampling/windows.hpp>

namespace feedline {

class text_pipeline {
public:
    // `inputs`: JSONL or text files, directories or globs. Needs config.tokenizer (a sentencepiece
    // model). Throws config_error (no tokenizer, bad numbers), io_error, format_error
    // before any thread starts.
    text_pipeline(const std::vector<std::string>& inputs, pipeline_config config, text_options options = {})
        : text_pipeline(std::make_shared<const text_corpus>(inputs, std::move(options)), std::move(config)) {}

    // A corpus opened before (feedline::open_dataset); shared, read-only.
    text_pipeline(std::shared_ptr<const text_corpus> corpus, pipeline_config config) : config_(std::move(config)), corpus_(std::move(corpus)) {
#if !FEEDLINE_HAS_SENTENCEPIECE
        throw config_error("tokenizer", "on-the-fly tokenization needs sentencepiece, which this build of feedline lacks");
#else
        if (config_.tokenizer.empty()) throw config_error("tokenizer", "text input needs a sentencepiece model (pipeline_config::tokenizer)");
        if (config_.batch_size == 0) throw config_error("batch_size", "must be at least 1");
        if (config_.seq_len == 0 || config_.seq_len > (1u << 30)) throw config_error("seq_len", "must be in [1, 2^30]");
        sentencepiece::SentencePieceProcessor probe;
        if (auto st = probe.Load(config_.tokenizer); !st.ok()) throw config_error("tokenizer", config_.tokenizer + ": " + st.ToString());
        vocab_ = probe.GetPieceSize();
        bos_ = probe.bos_id();
        eos_ = probe.eos_id();
        if (config_.add_bos && bos_ < 0) throw config_error("add_bos", config_.tokenizer + " has no BOS piece");
        if (config_.add_eos && eos_ < 0) throw config_error("add_eos", config_.tokenizer + " has no EOS piece");
        device_ = parse_device(config_.device);
        if (!corpus_) throw config_error("dataset", "no text corpus given");
        const launch_info env = launch_from_environment();
        world_ = config_.world_size >= 0 ? config_.world_size : env.world_size;
        rank_ = config_.rank >= 0 ? config_.rank : env.rank;
        if (world_ < 1) throw config_error("world_size", "must be at least 1");
        if (rank_ < 0 || rank_ >= world_) throw config_error("rank", std::to_string(rank_) + " is not in [0, " + std::to_string(world_) + ")");
        layout_ = batch_layout::make(config_.batch_size, config_.seq_len, config_.mode == sample_mode::packed);
        const topology topo = read_topology();
        unsigned workers = config_.workers;
        if (workers == 0) {
            workers = config_.max_workers ? config_.max_workers : static_cast<unsigned>(std::clamp(topo.usable_cores() - 1.0, 1.0, 8.0));
            autotune_ = workers > 1;
        }
        const std::uint64_t budget = config_.memory_budget ? config_.memory_budget : memory_available_to_process(topo) / 4;
        // Per worker: its processor (a few MB for an 8k model), one document's text and ids, and the
        // JSONL parser's buffers (a few times the longest line up to 1 MiB, mostly untouched).
        memory_ = plan_memory(config_, budget, workers, layout_.bytes, 8u << 20, corpus_->memory_bytes());
        consumer_.set_state({.seed = config_.seed,
                             .seq_len = config_.seq_len,
                             .batch_size = config_.batch_size,
                             .world_size = std::uint64_t(world_),
                             .rank = std::uint64_t(rank_),
                             .packed = config_.mode == sample_mode::packed});
        consumer_.open_log(config_);
#endif
    }

    text_pipeline(const text_pipeline&) = delete;
    text_pipeline& operator=(const text_pipeline&) = delete;
    ~text_pipeline() { stop(); }

    const text_corpus& corpus() const noexcept { return *corpus_; }
    const pipeline_config& config() const noexcept { return config_; }
    const memory_plan& memory() const noexcept { return memory_; }
    int rank() const noexcept { return rank_; }
    int world_size() const noexcept { return world_; }
    // Tokenizing workers running now (the autotuner parks and wakes them; fixed when config.workers was given).
    unsigned active_workers() const noexcept { return pool_ ? pool_->active_workers() : memory_.workers; }
    // Batches the assembler may run ahead of the trainer now (raised by the autotuner when prefetch = 0).
    std::size_t prefetch_depth() const noexcept { return consumer_.prefetch_depth(memory_); }
    int vocab_size() const noexcept { return vocab_; }

    // The next step's batch, in order; empty after max_steps. Rethrows a worker's error (a bad JSONL
    // line found while tokenizing arrives as the format_error naming file and offset).
    std::optional<batch> next() {
        if (!consumer_.started()) start();
        auto h = consumer_.next(config_, [this] { stop(); }, [this] { return stats(); });
        if (!h) return std::nullopt;
        // One assembler writes the slots, so it is the ring's only producer; parked workers are
        // tokenizers (the pool's window keeps the order whatever runs).
        if (pool_)
            if (const unsigned n = pool_->active_workers(), want = consumer_.tune(n, 1); want != n) pool_->set_active_workers(want);
        return batch(std::move(*h), &layout_);
    }

    const text_state& state() const noexcept { return consumer_.state(); }

    // Continues from a saved state; only before the first next(). Any worker count; same seed, shape
    // and ranks.
    void restore(const text_state& s) {
        if (consumer_.started()) throw config_error("restore", "call restore() before the first next()");
        const text_state& own = consumer_.state();
        if (s.seed != own.seed || s.seq_len != own.seq_len || s.batch_size != own.batch_size || s.world_size != own.world_size || s.rank != own.rank ||
            s.packed != own.packed)
            throw config_error("state", "saved for seed/seq_len/batch_size/world_size/rank/packed " + shape_of(s) + ", this pipeline is " + shape_of(own));
        consumer_.set_state(s);
    }

    void stop() noexcept {
        consumer_.close();
        if (pool_) pool_->stop();
        if (assembler_.joinable()) assembler_.join();
    }

    pipeline_stats stats() const {
        pipeline_stats s;
        consumer_.fill(s, config_, memory_);
        s.bytes_read = text_bytes_.load(std::memory_order_relaxed);
        s.padding_tokens = padding_.load(std::memory_order_relaxed);
        s.read_s = read_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.tokenize_s = tokenize_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.assemble_s = assemble_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.workers_active = active_workers();
        s.io_backend = "pread (text documents, tokenized by the workers)";
        return s;
    }

    // Range-for over batches: for (auto& b : pipeline) { ... }.
    using iterator = batch_iterator<text_pipeline>;
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

private:
    static std::string shape_of(const text_state& s) {
        return std::to_string(s.seed) + "/" + std::to_string(s.seq_len) + "/" + std::to_string(s.batch_size) + "/" + std::to_string(s.world_size) + "/" +
               std::to_string(s.rank) + "/" + std::to_string(s.packed);
    }
    static constexpr std::uint64_t documents_per_chunk = 16;
    struct token_chunk {
        std::vector<std::int32_t> tokens;   // the documents' tokens, concatenated
        std::vector<std::uint64_t> lengths;  // per document
    };

#if FEEDLINE_HAS_SENTENCEPIECE
    struct worker_state {
        sentencepiece::SentencePieceProcessor spm;
        text_corpus::scratch read;  // the document's bytes and the JSONL parser
        std::string text;
        std::vector<int> ids;
        std::uint64_t epoch = UINT64_MAX;
        feistel_permutation order;
    };

    // Tokens of this rank's `sequence`-th document, appended to `out`: a pure function of the config
    // and the number.
    void tokenize(worker_state& w, std::uint64_t sequence, std::vector<std::int32_t>& out) {
        const std::uint64_t n = corpus_->document_count();
        const std::uint64_t global = sequence * std::uint64_t(world_) + std::uint64_t(rank_);
        const std::uint64_t epoch = global / n, within = global % n;
        std::uint64_t doc = within;
        if (config_.shuffle != shuffle_mode::none) {
            if (w.epoch != epoch) w.order = feistel_permutation(n, permutation_key(config_.seed, epoch, 7)), w.epoch = epoch;
            doc = w.order(within);
        }
        auto t0 = std::chrono::steady_clock::now();
        corpus_->document_text(doc, w.read, w.text);
        auto t1 = std::chrono::steady_clock::now();
        if (auto st = w.spm.Encode(w.text, &w.ids); !st.ok()) {
            const auto& ref = corpus_->document(doc);
            throw format_error(corpus_->file_of(ref).path(), ref.offset, "sentencepiece could not encode this document: " + st.ToString());
        }
        if (config_.add_bos) out.push_back(bos_);
        out.insert(out.end(), w.ids.begin(), w.ids.end());
        if (config_.add_eos) out.push_back(eos_);
        auto t2 = std::chrono::steady_clock::now();
        read_ns_.fetch_add(ns(t0, t1), std::memory_order_relaxed);
        tokenize_ns_.fetch_add(ns(t1, t2), std::memory_order_relaxed);
        text_bytes_.fetch_add(w.text.size(), std::memory_order_relaxed);
    }

    // Pool item `chunk`: documents [chunk x K, chunk x K + K) of this rank, tokenized. Several
    // documents per item, so hand-offs between workers and the assembler are not paid per document.
    token_chunk tokenize_chunk(worker_state& w, std::uint64_t chunk) {
        token_chunk c;
        c.lengths.reserve(documents_per_chunk);
        for (std::uint64_t d = chunk * documents_per_chunk; d < (chunk + 1) * documents_per_chunk; ++d) {
            const std::size_t before = c.tokens.size();
            tokenize(w, d, c.tokens);
            c.lengths.push_back(c.tokens.size() - before);
        }
        return c;
    }
#endif

    void start() {
        consumer_.start(config_, memory_, layout_, device_, autotune_, 1);  // the assembler fills the slots
        origin_ = consumer_.state();  // the assembler's copy: next() rewrites the consumer's while it runs
#if FEEDLINE_HAS_SENTENCEPIECE
        const std::string model = config_.tokenizer;
        pool_options options;
        options.workers = memory_.workers;
        // Chunks tokenized ahead of the assembler: several batches' worth, so workers rarely wait for room.
        options.window = 16 + 4 * std::size_t(memory_.workers);
        options.first_sequence = origin_.document / documents_per_chunk;
        options.name_prefix = "feedline-tok";
        pool_ = std::make_unique<ordered_pool<token_chunk>>(
            options,
            [model](unsigned) {
                auto w = std::make_unique<worker_state>();
                if (auto st = w->spm.Load(model); !st.ok()) throw config_error("tokenizer", model + ": " + st.ToString());
                return w;
            },
            [this](std::unique_ptr<worker_state>& w, std::uint64_t chunk) { return tokenize_chunk(*w, chunk); });
#endif
        assembler_ = std::thread([this] {
            detail::name_this_thread("feedline-asm");
            assemble();
        });
    }

    // The rank's token stream as the assembler holds it: whole chunks of documents from the pool, in
    // order, starting at the restored (document, offset). Stream positions count from the restored
    // token; `carry` holds positions [base, base + carry.size()).
    struct token_stream {
        struct piece {
            std::uint64_t document, start, length;  // stream position of the document's token 0, and its tokens
        };
        std::deque<piece> pieces;  // documents not yet fully consumed (none of length 0)
        std::vector<std::int32_t> carry;
        std::uint64_t base = 0, next_document = 0;
        bool first = true;
        std::uint64_t end() const noexcept { return base + carry.size(); }
        // Drops tokens before `cursor` once they are the larger part of the buffer (amortised O(1)).
        void consumed(std::uint64_t cursor) {
            while (!pieces.empty() && pieces.front().start + pieces.front().length <= cursor) pieces.pop_front();
            if (cursor - base > carry.size() / 2 && cursor - base > 4096) {
                carry.erase(carry.begin(), carry.begin() + static_cast<std::ptrdiff_t>(cursor - base));
                base = cursor;
            }
        }
        // Where `cursor` is, as a resumable state: the document it is in and the offset inside it.
        void locate(std::uint64_t cursor, text_state& s) const {
            s.document = pieces.empty() ? next_document : pieces.front().document;
            s.offset = pieces.empty() ? 0 : cursor - pieces.front().start;
        }
    };

    // Appends the next chunk of documents to the stream; false once the pool has stopped.
    bool pull(token_stream& s) {
        auto chunk = pool_->next();
        if (!chunk) return false;
        std::size_t from = 0;
        for (std::uint64_t length : chunk->lengths) {
            const std::uint64_t document = s.next_document++;
            std::uint64_t skip = 0;
            if (s.first && document < origin_.document) skip = length;  // a restored stream starts later in this chunk
            if (s.first && document == origin_.document) skip = std::min(origin_.offset, length);  // ... inside this document
            if (skip < length) {
                s.pieces.push_back({document, s.end() - skip, length});
                s.carry.insert(s.carry.end(), chunk->tokens.begin() + static_cast<std::ptrdiff_t>(from + skip),
                               chunk->tokens.begin() + static_cast<std::ptrdiff_t>(from + length));
            }
            from += length;
        }
        s.first = false;
        return true;
    }

    // One batch per ring slot, in step order, until max_steps or stop().
    void assemble() {
        try {
            token_stream s;
            s.next_document = origin_.document / documents_per_chunk * documents_per_chunk;  // first of the first chunk
            if (layout_.packed)
                cut_packed(s);
            else
                cut_windows(s);
        } catch (...) {
            consumer_.ring().fail(std::current_exception());
            return;
        }
        finish();
    }

    // The assembler's next slot (nullptr once the ring closed), taken from a CPU other than a busy
    // trainer's when there is one to spare (exec/trainer_cpu.hpp).
    std::byte* acquire_slot(std::uint64_t step) {
        consumer_.placement().keep_off(assembler_excluded_cpu_);
        return consumer_.ring().acquire(step);
    }

    // Windows: B rows of T + 1 consecutive stream tokens, consecutive rows sharing one, crossing documents.
    void cut_windows(token_stream& s) {
        const std::uint64_t B = config_.batch_size, T = config_.seq_len, need = B * T + 1;
        for (std::uint64_t step = origin_.step, cursor = 0;; ++step) {
            if (config_.max_steps && step >= config_.max_steps) return;
            while (s.end() < cursor + need)
                if (!pull(s)) return;
            std::byte* slot = acquire_slot(step);
            if (slot == nullptr) return;
            auto t0 = std::chrono::steady_clock::now();
            auto* inputs = reinterpret_cast<std::int32_t*>(slot + layout_.inputs);
            auto* targets = reinterpret_cast<std::int32_t*>(slot + layout_.targets);
            const std::int32_t* src = s.carry.data() + (cursor - s.base);
            for (std::uint64_t r = 0; r < B; ++r) {
                std::memcpy(inputs + r * T, src + r * T, T * sizeof(std::int32_t));
                std::memcpy(targets + r * T, src + r * T + 1, T * sizeof(std::int32_t));
            }
            cursor += B * T;
            publish(s, step, cursor, t0);
        }
    }

    // Packed: whole documents placed greedily in stream order into rows of T, by the rule of the
    // sampler's packed_rows (sampling/windows.hpp): a document that fits in a row but not in the rest
    // of the current one starts the next row (the rest is padding); a longer one is split where it
    // falls. The rule needs only the lengths seen so far, so it runs on the stream; batches end on row
    // boundaries, so a restored stream (document, offset) starts a row exactly where this one did.
    void cut_packed(token_stream& s) {
        const std::uint64_t B = config_.batch_size, T = config_.seq_len;
        std::vector<segment> segments;
        row_boundaries bounds;
        for (std::uint64_t step = origin_.step, cursor = 0;; ++step) {
            if (config_.max_steps && step >= config_.max_steps) return;
            std::byte* slot = acquire_slot(step);
            if (slot == nullptr) return;
            auto t0 = std::chrono::steady_clock::now();
            auto* inputs = reinterpret_cast<std::int32_t*>(slot + layout_.inputs);
            auto* targets = reinterpret_cast<std::int32_t*>(slot + layout_.targets);
            auto* positions = reinterpret_cast<std::int32_t*>(slot + layout_.position_ids);
            auto* cu = reinterpret_cast<std::int32_t*>(slot + layout_.cu_seqlens);
            auto* pieces = reinterpret_cast<std::int32_t*>(slot + layout_.pieces);
            std::uint64_t padding = 0;
            for (std::uint64_t r = 0; r < B; ++r) {
                std::int32_t* in = inputs + r * T;
                std::int32_t* tg = targets + r * T;
                segments.clear();
                for (std::uint64_t col = 0; col < T;) {
                    if (s.pieces.empty() && !pull(s)) return;  // stopped (the slot is never published)
                    if (s.pieces.empty()) continue;            // a chunk of empty documents
                    const auto p = s.pieces.front();
                    const std::uint64_t off = cursor - p.start, rest = p.length - off;
                    if (off == 0 && rest <= T && col > 0 && col + rest > T) break;  // would be split needlessly: pad
                    const std::uint64_t take = std::min(rest, T - col);
                    std::memcpy(in + col, s.carry.data() + (cursor - s.base), take * sizeof(std::int32_t));
                    segments.push_back({p.document, off, take});
                    cursor += take;
                    col += take;
                    if (take == rest) s.pieces.pop_front();
                }
                boundaries_of(segments, T, bounds);
                pieces[r] = finish_packed_row(bounds, T, in, tg, positions + r * T, cu + r * (T + 1));
                padding += bounds.padding;
            }
            padding_.fetch_add(padding, std::memory_order_relaxed);
            publish(s, step, cursor, t0);
        }
    }

    // The batch of `step` is in its slot and the stream consumed up to `cursor`: records where a
    // restore would continue and hands the slot over.
    void publish(token_stream& s, std::uint64_t step, std::uint64_t cursor, std::chrono::steady_clock::time_point t0) {
        s.consumed(cursor);
        text_state after = origin_;
        after.step = step + 1;
        s.locate(cursor, after);
        consumer_.set_slot_state(step, after);
        assemble_ns_.fetch_add(ns(t0, std::chrono::steady_clock::now()), std::memory_order_relaxed);
        consumer_.ring().publish(step, layout_.bytes, {config_.batch_size, config_.seq_len});
    }
    void finish() { consumer_.ring().close(); }

    static std::uint64_t ns(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
        return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
    }

    pipeline_config config_;
    std::shared_ptr<const text_corpus> corpus_;
    device_choice device_;
    int world_ = 1, rank_ = 0, vocab_ = 0;
    [[maybe_unused]] int bos_ = -1, eos_ = -1;  // read only by the tokenizing workers (with sentencepiece)
    batch_layout layout_;
    memory_plan memory_;
    ring_consumer<text_state> consumer_;  // the ring; what the trainer has consumed up to (main thread)
    text_state origin_;                     // where this run started (read by the assembler)
    std::unique_ptr<ordered_pool<token_chunk>> pool_;  // chunks of documents -> tokens, in order
    std::thread assembler_;
    int assembler_excluded_cpu_ = -1;  // written by the assembler only
    bool autotune_ = false;  // workers = 0: park and wake tokenizing workers
    std::atomic<std::uint64_t> text_bytes_{0}, read_ns_{0}, tokenize_ns_{0}, assemble_ns_{0}, padding_{0};
};

}  // namespace feedline
