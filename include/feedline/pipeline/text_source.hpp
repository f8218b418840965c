// feedline/pipeline/text_source.hpp: JSONL / text files as a pipeline source, tokenized on the fly by
// the workers. The sampler lays out epochs from every document's token count, exactly as for shards,
// so text gets everything shards get: the three shuffle modes (a file is a shard), windows and packed
// rows with the same packing function, tail drop/pad, rank slices that join to the one-rank batch,
// exact resume anywhere (mid-document included) and blending with any other source.
// The counts come from one tokenizing pass when the corpus is first opened, kept in a cache file
// (pipeline/detail/text_token_counts.hpp). Samples stay in the epoch's document order (documents are
// shuffled, windows are not shuffled across the epoch): a batch then covers consecutive tokens, so a
// worker tokenizes each of its documents once; the documents a batch shares with its neighbours (its
// first and last, and any longer than a sample), which other workers need too, are tokenized once and
// shared through a bounded cache (pipeline/detail/document_cache.hpp). Each worker has its own
// tokenizer (transform/tokenizer.hpp: any registered kind).
// Fed by format/text_corpus.hpp; feeds the pipeline's workers (pipeline/pipeline.hpp).
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <feedline/format/text_corpus.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/detail/document_cache.hpp>
#include <feedline/pipeline/detail/text_token_counts.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/transform/tokenizers.hpp>

namespace feedline {

class text_source final : public batch_source {
public:
    // Opens `corpus` with `config.tokenizer` and its token-length index (cached, or computed by
    // `threads` tokenizing threads: 0 = the cores this process may use). Throws config_error (no or
    // bad tokenizer, a corpus without tokens), io_error, format_error naming file and offset.
    text_source(std::shared_ptr<const text_corpus> corpus, text_config config, unsigned threads = 0)
            : corpus_(std::move(corpus)), config_(std::move(config)) {
        if (!corpus_) throw config_error("dataset", "no text corpus given");
        const auto probe = make_tokenizer(tokenizer_config());
        vocab_ = probe->vocab_size();
        tokenizer_description_ = probe->describe();
        if (!probe->chosen_because().empty()) tokenizer_description_ += "; " + probe->chosen_because();
        for (std::uint64_t d = 0; d < corpus_->document_count(); ++d)
            if (d == 0 || corpus_->document(d).file != corpus_->document(d - 1).file) block_starts_.push_back(d);
        auto counts = detail::load_or_count_tokens(*corpus_, tokenizer_config(), *probe, config_.cache_dir, threads);
        lengths_ = std::move(counts.lengths);
        lengths_origin_ = std::move(counts.origin);
        for (std::uint32_t n : lengths_) tokens_ += n;
        // Never more than the whole corpus's tokens: a small corpus does not reserve the full default.
        cache_ = std::make_unique<detail::document_cache>(
            std::min<std::uint64_t>(defaults::document_cache_bytes, tokens_ * sizeof(std::int32_t)));
    }
    // JSONL / text files, directories or globs, split into documents by config.documents.
    text_source(const std::vector<std::string>& inputs, text_config config, unsigned threads = 0)
            : text_source(std::make_shared<const text_corpus>(inputs, config.documents), config, threads) {}

    const text_corpus& corpus() const noexcept { return *corpus_; }
    const text_config& config() const noexcept { return config_; }
    int vocab_size() const noexcept { return vocab_; }
    std::uint64_t total_tokens() const noexcept { return tokens_; }
    std::uint32_t document_tokens(std::uint64_t d) const { return lengths_.at(d); }
    // Where the token counts came from: read from a cache file, or computed (and cached, or why not).
    const std::string& lengths_origin() const noexcept { return lengths_origin_; }
    const detail::document_cache& document_cache() const noexcept { return *cache_; }

    source_kind kind() const noexcept override { return source_kind::text; }
    std::string describe() const override {
        return std::to_string(corpus_->document_count()) + " text documents (" + std::to_string(corpus_->text_bytes()) + " bytes, " +
               std::to_string(tokens_) + " tokens), tokenized on the fly";
    }
    sampler_dataset sampling(const source_context&) const override {
        const std::vector<std::uint32_t>* lengths = &lengths_;
        return {.documents = lengths_.size(),
                .length = [lengths](std::uint64_t i) { return std::uint64_t((*lengths)[i]); },
                .block_starts = block_starts_,
                .in_stream_order = true};
    }
    std::uint64_t index_bytes(const source_context&) const override {
        return corpus_->memory_bytes() + lengths_.capacity() * sizeof(std::uint32_t) + cache_->capacity();
    }
    std::uint64_t worker_bytes(const source_context& c) const override {
        return defaults::text_worker_bytes + (c.seq_len + 1) * sizeof(std::int32_t);
    }
    std::string prepare(const source_context&) override {
        return "pread (text documents, tokenized by the workers with " + tokenizer_description_ + ")";
    }
    // What tokenizes ("feedline's Unigram encoder"), and why where kind "auto" did not take the first kind.
    const std::string& tokenizer_description() const noexcept { return tokenizer_description_; }
    std::unique_ptr<source_worker> make_worker(const source_context& c, source_counters& counters) override {
        return std::make_unique<worker>(*this, c, counters);
    }

private:
    tokenizer_options tokenizer_config() const {
        return {.model = config_.tokenizer, .kind = config_.tokenizer_kind, .add_bos = config_.add_bos, .add_eos = config_.add_eos};
    }

    void encode(tokenizer& tok, std::uint64_t d, const std::string& text, std::vector<std::int32_t>& ids) const {
        if (std::string problem = tok.encode(text, ids); !problem.empty()) {
            const auto& ref = corpus_->document(d);
            throw format_error(corpus_->file_of(ref).name(), ref.offset, "the tokenizer could not encode this document: " + problem);
        }
    }

    class worker final : public source_worker {
    public:
        worker(text_source& s, const source_context& c, source_counters& counters)
                : source_(s),
                  counters_(counters),
                  windows_(c.mode == sample_mode::windows),
                  long_document_(c.seq_len),
                  tokenizer_(make_tokenizer(s.tokenizer_config())) {}

        void write(const batch_plan& plan, std::span<const std::uint32_t> rows, const slot_view& slot) override {
            std::uint64_t assemble_ns = 0;
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const std::uint32_t r = rows[i];
                const auto& segments = plan.samples[r].segments;
                std::uint64_t k = 0;  // the sample's token (windows) or column (packed) the segment starts at
                for (std::size_t j = 0; j < segments.size(); ++j) {
                    const segment& s = segments[j];
                    if (s.length == 0) continue;  // an empty document in a packed row
                    // Windows in stream order: the batch's first and last documents are the ones its
                    // neighbours hold too (consecutive windows share a token), and another worker makes
                    // those batches; shared through the cache, each is tokenized once, not twice.
                    const bool edge = windows_ && ((i == 0 && j == 0) || (i + 1 == rows.size() && j + 1 == segments.size()));
                    const std::int32_t* tokens = tokens_of(s.document, edge) + s.offset;
                    const auto t0 = std::chrono::steady_clock::now();
                    if (windows_)
                        slot.put_window_tokens(r, k, tokens, s.length);
                    else
                        std::memcpy(slot.input_row(r) + k, tokens, s.length * sizeof(std::int32_t));
                    assemble_ns += detail::elapsed_ns(t0);
                    k += s.length;
                }
            }
            // Once per batch: counting per document would cost more than the counting is worth.
            counters_.assemble_ns.fetch_add(assemble_ns, std::memory_order_relaxed);
            counters_.read_ns.fetch_add(std::exchange(read_ns_, 0), std::memory_order_relaxed);
            counters_.tokenize_ns.fetch_add(std::exchange(tokenize_ns_, 0), std::memory_order_relaxed);
            counters_.bytes_read.fetch_add(std::exchange(bytes_read_, 0), std::memory_order_relaxed);
        }

    private:
        // Document d's tokens: the one this worker used last, from the shared cache (a document longer
        // than a sample, or one at the batch's edge), or tokenized now. Valid until the next call.
        const std::int32_t* tokens_of(std::uint64_t d, bool edge) {
            if (d == current_) return current_tokens_->data();
            if (edge || source_.lengths_[d] > long_document_) {
                shared_ = source_.cache_->get(d, [&] {
                    std::vector<std::int32_t> out;
                    tokenize(d, out);
                    return out;
                });
                current_tokens_ = shared_.get();
            } else {
                tokenize(d, own_);
                current_tokens_ = &own_;
            }
            current_ = d;
            return current_tokens_->data();
        }

        void tokenize(std::uint64_t d, std::vector<std::int32_t>& out) {
            current_ = UINT64_MAX;  // `out` may be the buffer current_ refers to
            const auto t0 = std::chrono::steady_clock::now();
            source_.corpus_->document_text(d, scratch_, text_);
            const auto t1 = std::chrono::steady_clock::now();
            source_.encode(*tokenizer_, d, text_, out);
            read_ns_ += detail::elapsed_ns(t0, t1);
            tokenize_ns_ += detail::elapsed_ns(t1);
            bytes_read_ += text_.size();
            if (out.size() != source_.lengths_[d]) {
                const auto& ref = source_.corpus_->document(d);
                throw format_error(source_.corpus_->file_of(ref).name(), ref.offset,
                                   "this document now has " + std::to_string(out.size()) + " tokens, " +
                                       std::to_string(source_.lengths_[d]) +
                                       " when the corpus was opened (the file changed under the job)");
            }
        }

        text_source& source_;
        source_counters& counters_;
        bool windows_;
        std::uint64_t long_document_;  // longer than a sample: shared through the cache
        std::unique_ptr<tokenizer> tokenizer_;
        text_corpus::scratch scratch_;
        std::string text_;
        std::vector<std::int32_t> own_;
        detail::document_cache::tokens shared_;
        const std::vector<std::int32_t>* current_tokens_ = nullptr;
        std::uint64_t current_ = UINT64_MAX;
        std::uint64_t read_ns_ = 0, tokenize_ns_ = 0, bytes_read_ = 0;  // this batch's, added to counters_ once
    };

    std::shared_ptr<const text_corpus> corpus_;
    text_config config_;
    int vocab_ = 0;
    std::vector<std::uint64_t> block_starts_;  // the first document of each file: shuffle_mode::shard_blocks
    std::vector<std::uint32_t> lengths_;
    std::uint64_t tokens_ = 0;
    std::string lengths_origin_;
    std::string tokenizer_description_;
    std::unique_ptr<detail::document_cache> cache_;
};

namespace detail {

// Registered as text: a spec whose files include JSONL or text (.jsonl, .json, .ndjson, .txt, .text)
// and no shard (.idx, .bin).
inline const bool text_source_registered =
    source_registry::add({.kind = source_kind::text,
                          .claims =
                              [](const std::string&, const std::vector<std::string>& files) {
                                  bool text = false;
                                  for (const auto& f : files) {
                                      if (detail::ends_with(f, ".idx") || detail::ends_with(f, ".bin")) return false;
                                      for (std::string_view ext : {".jsonl", ".json", ".ndjson", ".txt", ".text"})
                                          text = text || detail::ends_with(f, ext);
                                  }
                                  return text;
                              },
                          .open = [](const std::string& spec, const pipeline_config& c) -> std::shared_ptr<batch_source> {
                              return std::make_shared<text_source>(std::vector<std::string>{spec}, c.text);
                          },
                          .open_list = [](const std::vector<std::string>& specs, const pipeline_config& c) -> std::shared_ptr<batch_source> {
                              return std::make_shared<text_source>(specs, c.text);
                          }});

}  // namespace detail

}  // namespace feedline
