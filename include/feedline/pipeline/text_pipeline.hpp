// feedline/pipeline/text_pipeline.hpp: batches from raw JSONL / text, tokenized on the fly.
// Documents are numbered per rank (rank r of W takes every W-th document of the epoch's order: a seeded
// permutation, or file order with shuffle_mode::none). Worker threads, each with its own
// SentencePieceProcessor, tokenize documents by number through an ordered pool, so the token stream
// is the same whatever the number of workers; one assembler cuts it into GPT windows (T + 1 tokens,
// consecutive rows sharing one token, crossing documents) written straight into ring slots.
// The state is (step, document number, token offset inside it): a restored pipeline starts tokenizing
// at that document and drops the tokens before the offset, so resume works in the middle of a document.
// Windows mode only: packing whole documents needs their lengths up front (pack the text into shards).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
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

#include <feedline/device/make_ring.hpp>
#include <feedline/exec/worker_pool.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/pipeline/batch.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/sampling/permutation.hpp>

namespace feedline {

// Where a text pipeline is: the next step, and the next token (document number in this rank's order,
// offset in its tokens). The other fields say what the position means; restore() checks them.
struct text_state {
    std::uint64_t seed = 0, seq_len = 0, batch_size = 0, world_size = 1, rank = 0;
    std::uint64_t step = 0, document = 0, offset = 0;
    friend bool operator==(const text_state&, const text_state&) = default;
};

inline std::string to_json(const text_state& s) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"kind\": \"text\", \"version\": 1, \"seed\": %llu, \"seq_len\": %llu, \"batch_size\": %llu, \"world_size\": %llu, "
                  "\"rank\": %llu, \"step\": %llu, \"document\": %llu, \"offset\": %llu}",
                  (unsigned long long)s.seed, (unsigned long long)s.seq_len, (unsigned long long)s.batch_size, (unsigned long long)s.world_size,
                  (unsigned long long)s.rank, (unsigned long long)s.step, (unsigned long long)s.document, (unsigned long long)s.offset);
    return buf;
}

inline text_state text_state_from_json(const std::string& text) {
    text_state s;
    unsigned long long v[8] = {};
    const int n = std::sscanf(text.c_str(),
                              " {\"kind\": \"text\", \"version\": 1, \"seed\": %llu, \"seq_len\": %llu, \"batch_size\": %llu, \"world_size\": %llu, "
                              "\"rank\": %llu, \"step\": %llu, \"document\": %llu, \"offset\": %llu}",
                              &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    if (n != 8) throw config_error("state", "not a version 1 text pipeline state: " + text.substr(0, 200));
    s.seed = v[0], s.seq_len = v[1], s.batch_size = v[2], s.world_size = v[3], s.rank = v[4], s.step = v[5], s.document = v[6], s.offset = v[7];
    return s;
}

class text_pipeline {
public:
    // `inputs`: JSONL or text files, directories or globs. Needs config.tokenizer (a sentencepiece
    // model). Throws config_error (no tokenizer, packed mode, bad numbers), io_error, format_error
    // before any thread starts.
    text_pipeline(const std::vector<std::string>& inputs, pipeline_config config, text_options options = {})
        : config_(std::move(config)) {
#if !FEEDLINE_HAS_SENTENCEPIECE
        (void)inputs;
        (void)options;
        throw config_error("tokenizer", "on-the-fly tokenization needs sentencepiece, which this build of feedline lacks");
#else
        if (config_.tokenizer.empty()) throw config_error("tokenizer", "text input needs a sentencepiece model (pipeline_config::tokenizer)");
        if (config_.mode != sample_mode::windows) throw config_error("mode", "text is tokenized on the fly in windows mode only; pack it into shards for packed mode");
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
        corpus_ = std::make_shared<const text_corpus>(inputs, options);
        const launch_info env = launch_from_environment();
        world_ = config_.world_size >= 0 ? config_.world_size : env.world_size;
        rank_ = config_.rank >= 0 ? config_.rank : env.rank;
        if (world_ < 1) throw config_error("world_size", "must be at least 1");
        if (rank_ < 0 || rank_ >= world_) throw config_error("rank", std::to_string(rank_) + " is not in [0, " + std::to_string(world_) + ")");
        layout_ = batch_layout::make(config_.batch_size, config_.seq_len, false);
        const topology topo = read_topology();
        unsigned workers = config_.workers;
        if (workers == 0) workers = static_cast<unsigned>(std::clamp(topo.usable_cores() - 1.0, 1.0, 8.0));
        const std::uint64_t budget = config_.memory_budget ? config_.memory_budget : memory_available_to_process(topo) / 4;
        // Per worker: its processor (a few MB for an 8k model) and one document's text and ids.
        memory_ = plan_memory(config_, budget, workers, layout_.bytes, 8u << 20, corpus_->memory_bytes());
        state_ = {config_.seed, config_.seq_len, config_.batch_size, std::uint64_t(world_), std::uint64_t(rank_), 0, 0, 0};
        if (!config_.stats_jsonl.empty()) {
            if (config_.stats_every == 0) throw config_error("stats_every", "must be at least 1 when stats_jsonl is set");
            stats_log_ = std::make_unique<stats_jsonl_log>(config_.stats_jsonl);
        }
#endif
    }

    text_pipeline(const text_pipeline&) = delete;
    text_pipeline& operator=(const text_pipeline&) = delete;
    ~text_pipeline() { stop(); }

    const text_corpus& corpus() const noexcept { return *corpus_; }
    const memory_plan& memory() const noexcept { return memory_; }
    int vocab_size() const noexcept { return vocab_; }

    // The next step's batch, in order; empty after max_steps. Rethrows a worker's error (a bad JSONL
    // line found while tokenizing arrives as the format_error naming file and offset).
    std::optional<batch> next() {
        if (!started_) start();
        std::optional<batch_handle> h;
        try {
            h = ring_->next();
        } catch (...) {
            stop();
            throw;
        }
        if (!h) {
            if (stats_log_ && !final_logged_) stats_log_->write(stats()), final_logged_ = true;
            return std::nullopt;
        }
        state_ = slot_states_[h->slot()];
        ++delivered_;
        if (stats_log_ && delivered_ % config_.stats_every == 0) stats_log_->write(stats());
        return batch(std::move(*h), &layout_);
    }

    const text_state& state() const noexcept { return state_; }

    // Continues from a saved state; only before the first next(). Any worker count; same seed, shape
    // and ranks.
    void restore(const text_state& s) {
        if (started_) throw config_error("restore", "call restore() before the first next()");
        if (s.seed != state_.seed || s.seq_len != state_.seq_len || s.batch_size != state_.batch_size || s.world_size != state_.world_size ||
            s.rank != state_.rank)
            throw config_error("state", "saved for seed/seq_len/batch_size/world_size/rank " + to_json(s) + ", this pipeline is " + to_json(state_));
        state_ = s;
    }

    void stop() noexcept {
        if (ring_) ring_->close();
        if (pool_) pool_->stop();
        if (assembler_.joinable()) assembler_.join();
    }

    pipeline_stats stats() const {
        pipeline_stats s;
        s.batches = delivered_;
        s.tokens = delivered_ * config_.batch_size * config_.seq_len;
        s.bytes_read = text_bytes_.load(std::memory_order_relaxed);
        s.seconds = started_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() : 0;
        s.tokens_per_s = s.seconds > 0 ? static_cast<double>(s.tokens) / s.seconds : 0;
        s.read_s = read_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.tokenize_s = tokenize_ns_.load(std::memory_order_relaxed) * 1e-9;
        s.assemble_s = assemble_ns_.load(std::memory_order_relaxed) * 1e-9;
        if (ring_) {
            auto r = ring_->stats();
            s.slot_wait_s = static_cast<double>(r.producer_wait_ns) * 1e-9;
            s.stall_s = static_cast<double>(r.consumer_wait_ns) * 1e-9;
            s.ready_batches = r.ready;
        }
        s.stall_fraction = s.seconds > 0 ? std::min(1.0, s.stall_s / s.seconds) : 0;
        s.slots = memory_.slots;
        s.workers = memory_.workers;
        s.workers_active = memory_.workers;
        s.prefetch_depth = memory_.slots;  // the whole ring (no depth tuning here)
        s.rss_bytes = resident_bytes();
        s.pinned_bytes = ring_ && ring_->pinned() ? memory_.slots * memory_.slot_bytes : 0;
        s.memory_budget = memory_.budget;
        s.planned_bytes = memory_.total();
        s.io_backend = "pread (text documents, tokenized by the workers)";
        s.device = device_reason_;
        return s;
    }

    class iterator {
    public:
        explicit iterator(text_pipeline* p) : p_(p) { advance(); }
        batch& operator*() { return *current_; }
        iterator& operator++() {
            current_.reset();
            advance();
            return *this;
        }
        bool operator==(std::default_sentinel_t) const { return !current_.has_value(); }

    private:
        void advance() { current_ = p_->next(); }
        text_pipeline* p_;
        std::optional<batch> current_;
    };
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

private:
    static constexpr std::uint64_t documents_per_chunk = 16;
    struct token_chunk {
        std::vector<std::int32_t> tokens;   // the documents' tokens, concatenated
        std::vector<std::uint64_t> lengths;  // per document
    };

#if FEEDLINE_HAS_SENTENCEPIECE
    struct worker_state {
        sentencepiece::SentencePieceProcessor spm;
        std::string raw, text;
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
        corpus_->document_text(doc, w.raw, w.text);
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
        started_ = true;
        start_time_ = std::chrono::steady_clock::now();
        auto chosen = make_ring({.slots = memory_.slots, .slot_bytes = layout_.bytes, .first_sequence = state_.step}, device_);
        ring_ = std::move(chosen.ring);
        device_reason_ = std::move(chosen.reason);
        slot_states_.assign(memory_.slots, state_);
        origin_ = state_;  // the assembler's copy: next() rewrites state_ while it runs
#if FEEDLINE_HAS_SENTENCEPIECE
        const std::string model = config_.tokenizer;
        pool_options options;
        options.workers = memory_.workers;
        // Chunks tokenized ahead of the assembler: several batches' worth, so workers rarely wait for room.
        options.window = 16 + 4 * std::size_t(memory_.workers);
        options.first_sequence = state_.document / documents_per_chunk;
        pool_ = std::make_unique<ordered_pool<token_chunk>>(
            options,
            [model](unsigned) {
                auto w = std::make_unique<worker_state>();
                if (auto st = w->spm.Load(model); !st.ok()) throw config_error("tokenizer", model + ": " + st.ToString());
                return w;
            },
            [this](std::unique_ptr<worker_state>& w, std::uint64_t chunk) { return tokenize_chunk(*w, chunk); });
#endif
        assembler_ = std::thread([this] { assemble(); });
    }

    // Cuts the ordered token stream into windows, one batch per ring slot.
    void assemble() {
        try {
            const std::uint64_t B = config_.batch_size, T = config_.seq_len, need = B * T + 1;
            struct piece {
                std::uint64_t document, start, length;  // stream positions of the document's tokens
            };
            std::deque<piece> pieces;
            std::vector<std::int32_t> carry;  // stream positions [base, base + carry.size())
            std::uint64_t base = 0, cursor = 0, step = origin_.step;
            std::uint64_t next_document = origin_.document / documents_per_chunk * documents_per_chunk;  // first of the first chunk
            bool first = true;
            for (;;) {
                if (config_.max_steps && step >= config_.max_steps) break;
                while (base + carry.size() < cursor + need) {
                    auto chunk = pool_->next();
                    if (!chunk) return finish();
                    std::size_t from = 0;
                    for (std::uint64_t length : chunk->lengths) {
                        const std::uint64_t document = next_document++;
                        std::uint64_t skip = 0;
                        if (first && document < origin_.document) skip = length;  // a restored stream starts later in this chunk
                        if (first && document == origin_.document) skip = std::min(origin_.offset, length);  // ... inside this document
                        const std::uint64_t at = base + carry.size();
                        if (skip < length) {
                            pieces.push_back({document, at - skip, length});
                            carry.insert(carry.end(), chunk->tokens.begin() + static_cast<std::ptrdiff_t>(from + skip),
                                         chunk->tokens.begin() + static_cast<std::ptrdiff_t>(from + length));
                        }
                        from += length;
                    }
                    first = false;
                }
                std::byte* slot = ring_->acquire(step);
                if (slot == nullptr) break;
                auto t0 = std::chrono::steady_clock::now();
                auto* inputs = reinterpret_cast<std::int32_t*>(slot + layout_.inputs);
                auto* targets = reinterpret_cast<std::int32_t*>(slot + layout_.targets);
                const std::int32_t* src = carry.data() + (cursor - base);
                for (std::uint64_t r = 0; r < B; ++r) {
                    std::memcpy(inputs + r * T, src + r * T, T * sizeof(std::int32_t));
                    std::memcpy(targets + r * T, src + r * T + 1, T * sizeof(std::int32_t));
                }
                cursor += B * T;
                while (!pieces.empty() && pieces.front().start + pieces.front().length <= cursor) pieces.pop_front();
                text_state after = origin_;
                after.step = step + 1;
                after.document = pieces.empty() ? next_document : pieces.front().document;
                after.offset = pieces.empty() ? 0 : cursor - pieces.front().start;
                slot_states_[step % memory_.slots] = after;
                // Drop consumed tokens once they are the larger part of the buffer (amortised O(1)).
                if (cursor - base > carry.size() / 2 && cursor - base > 4096) {
                    carry.erase(carry.begin(), carry.begin() + static_cast<std::ptrdiff_t>(cursor - base));
                    base = cursor;
                }
                assemble_ns_.fetch_add(ns(t0, std::chrono::steady_clock::now()), std::memory_order_relaxed);
                ring_->publish(step, layout_.bytes, {B, T});
                ++step;
            }
        } catch (...) {
            ring_->fail(std::current_exception());
            return;
        }
        finish();
    }
    void finish() { ring_->close(); }

    static std::uint64_t ns(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
        return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
    }

    pipeline_config config_;
    std::shared_ptr<const text_corpus> corpus_;
    device_choice device_;
    int world_ = 1, rank_ = 0, vocab_ = 0, bos_ = -1, eos_ = -1;
    batch_layout layout_;
    memory_plan memory_;
    text_state state_;   // what the trainer has consumed up to (main thread)
    text_state origin_;  // where this run started (read by the assembler)
    std::unique_ptr<stats_jsonl_log> stats_log_;
    bool final_logged_ = false;
    bool started_ = false;
    std::chrono::steady_clock::time_point start_time_;
    std::unique_ptr<staging_ring> ring_;
    std::string device_reason_;
    std::vector<text_state> slot_states_;
    std::unique_ptr<ordered_pool<token_chunk>> pool_;  // chunks of documents -> tokens, in order
    std::thread assembler_;
    std::uint64_t delivered_ = 0;
    std::atomic<std::uint64_t> text_bytes_{0}, read_ns_{0}, tokenize_ns_{0}, assemble_ns_{0};
};

}  // namespace feedline
