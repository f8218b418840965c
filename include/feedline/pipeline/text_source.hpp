// feedline/pipeline/text_source.hpp: JSONL / text files as a pipeline source, tokenized on the fly by
// the workers. The sampler lays out epochs from every document's token count, exactly as for shards,
// so text gets everything shards get: the three shuffle modes (a file is a shard), windows and packed
// rows with the same packing function, tail drop/pad, rank slices that join to the one-rank batch,
// exact resume anywhere (mid-document included) and blending with any other source.
// The counts come from one tokenizing pass when the corpus is first opened with a tokenizer, run on
// all usable cores and kept in a cache file (format/token_lengths.hpp) keyed by the tokenizer, the
// options and each file's identity, so later opens read 4 bytes per document instead.
// Samples stay in the epoch's document order (documents are shuffled, windows are not shuffled across
// the epoch): a batch then covers consecutive tokens, so a worker tokenizes each of its documents once;
// the documents a batch shares with its neighbours (its first and last, and any longer than a sample),
// which other workers need too, are tokenized once and shared through a bounded cache. Each worker has its own sentencepiece processor (transform/tokenizer.hpp).
// Fed by format/text_corpus.hpp; feeds the pipeline's workers (pipeline/pipeline.hpp).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <feedline/exec/topology.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/format/token_lengths.hpp>
#include <feedline/pipeline/defaults.hpp>
#include <feedline/pipeline/source.hpp>
#include <feedline/transform/tokenizer.hpp>

namespace feedline {

namespace detail {

// Tokens of long documents, shared by the workers of every pipeline over one text source: a document
// longer than a sample spans batches that different workers make, and each would tokenize all of it.
// The first worker to ask tokenizes it; workers asking meanwhile wait for that result instead of
// tokenizing it again. Least recently used entries go once the cache holds more than `capacity` bytes
// (the newest entry always stays, so a document larger than the cache costs one copy).
class document_cache {
public:
    using tokens = std::shared_ptr<const std::vector<std::int32_t>>;
    explicit document_cache(std::uint64_t capacity) : capacity_(capacity) {}

    // The document's tokens: cached, being made by another thread (waited for; its error rethrown),
    // or made here by `make()` (returns std::vector<std::int32_t>).
    template <class Make>
    tokens get(std::uint64_t document, Make&& make) {
        std::unique_lock lock(mutex_);
        if (auto it = entries_.find(document); it != entries_.end()) {
            order_.splice(order_.begin(), order_, it->second.position);
            std::shared_future<tokens> value = it->second.value;
            lock.unlock();
            return value.get();
        }
        std::promise<tokens> promise;
        order_.push_front(document);
        entries_.emplace(document, entry{promise.get_future().share(), order_.begin(), 0});
        lock.unlock();
        tokens made;
        try {
            made = std::make_shared<const std::vector<std::int32_t>>(make());
        } catch (...) {
            promise.set_exception(std::current_exception());
            lock.lock();
            erase(document);
            throw;
        }
        promise.set_value(made);
        lock.lock();
        if (auto it = entries_.find(document); it != entries_.end()) {
            it->second.bytes = made->size() * sizeof(std::int32_t) + sizeof(entry);
            used_ += it->second.bytes;
            evict(document);
        }
        return made;
    }

    std::uint64_t capacity() const noexcept { return capacity_; }
    // Bytes held now (approximate: for stats and tests).
    std::uint64_t used() const {
        std::lock_guard lock(mutex_);
        return used_;
    }

private:
    struct entry {
        std::shared_future<tokens> value;
        std::list<std::uint64_t>::iterator position;
        std::uint64_t bytes = 0;  // 0 while being made: never evicted then
    };
    void erase(std::uint64_t document) {
        auto it = entries_.find(document);
        if (it == entries_.end()) return;
        used_ -= it->second.bytes;
        order_.erase(it->second.position);
        entries_.erase(it);
    }
    void evict(std::uint64_t keep) {
        for (auto it = order_.end(); used_ > capacity_ && it != order_.begin();) {
            --it;
            const std::uint64_t doc = *it;
            auto& e = entries_.at(doc);
            if (doc == keep || e.bytes == 0) continue;
            ++it;  // erase() invalidates the element only
            erase(doc);
        }
    }

    std::uint64_t capacity_;
    mutable std::mutex mutex_;
    std::unordered_map<std::uint64_t, entry> entries_;
    std::list<std::uint64_t> order_;  // most recently used first
    std::uint64_t used_ = 0;
};

// The directory for feedline's caches: `configured`, else $FEEDLINE_CACHE_DIR, else
// $XDG_CACHE_HOME/feedline, else ~/.cache/feedline; empty for "none" or when none can be named.
inline std::string cache_directory(const std::string& configured) {
    if (configured == "none") return {};
    if (!configured.empty()) return configured;
    if (const char* d = std::getenv("FEEDLINE_CACHE_DIR"); d && *d) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/feedline";
    if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/feedline";
    return {};
}

}  // namespace detail

#if FEEDLINE_HAS_SENTENCEPIECE
class text_source final : public batch_source {
public:
    // Opens `corpus` with `config.tokenizer` and its token-length index (cached, or computed by
    // `threads` tokenizing threads: 0 = the cores this process may use). Throws config_error (no or
    // bad tokenizer, a corpus without tokens), io_error, format_error naming file and offset.
    text_source(std::shared_ptr<const text_corpus> corpus, text_config config, unsigned threads = 0)
        : corpus_(std::move(corpus)), config_(std::move(config)) {
        if (!corpus_) throw config_error("dataset", "no text corpus given");
        const tokenizer probe(tokenizer_config());
        vocab_ = probe.vocab_size();
        for (std::uint64_t d = 0; d < corpus_->document_count(); ++d)
            if (d == 0 || corpus_->document(d).file != corpus_->document(d - 1).file) block_starts_.push_back(d);
        load_or_count_lengths(threads);
        for (std::uint32_t n : lengths_) tokens_ += n;
        // Never more than the whole corpus's tokens: a small corpus does not reserve the full default.
        cache_ = std::make_unique<detail::document_cache>(std::min<std::uint64_t>(defaults::document_cache_bytes, tokens_ * sizeof(std::int32_t)));
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
    sampler_dataset sampling(const pipeline_config&) const override {
        const std::vector<std::uint32_t>* lengths = &lengths_;
        return {.documents = lengths_.size(),
                .length = [lengths](std::uint64_t i) { return std::uint64_t((*lengths)[i]); },
                .block_starts = block_starts_,
                .in_stream_order = true};
    }
    std::uint64_t index_bytes(const pipeline_config&) const override {
        return corpus_->memory_bytes() + lengths_.capacity() * sizeof(std::uint32_t) + cache_->capacity();
    }
    std::uint64_t worker_bytes(const pipeline_config& c) const override { return defaults::text_worker_bytes + (c.seq_len + 1) * sizeof(std::int32_t); }
    std::string prepare(const pipeline_config&) override { return "pread (text documents, tokenized by the workers)"; }
    std::unique_ptr<source_worker> make_worker(const pipeline_config& c, source_counters& counters) override {
        return std::make_unique<worker>(*this, c, counters);
    }

private:
    tokenizer_options tokenizer_config() const { return {.model = config_.tokenizer, .add_bos = config_.add_bos, .add_eos = config_.add_eos}; }

    // What the cached lengths are valid for: the format, the tokenizer file's identity and bytes, the
    // options, and each text file's identity (path, size, modification time, inode).
    std::string lengths_key() const {
        std::string key = "feedline.token_lengths 1\n";
        auto identity = [](const std::string& path) {
            struct stat st {};
            if (::stat(path.c_str(), &st) != 0) throw io_error(path, errno, "cannot stat");
            std::error_code ec;
            const auto canonical = std::filesystem::weakly_canonical(path, ec);
            return (ec ? path : canonical.string()) + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
                   std::to_string(st.st_mtim.tv_nsec) + " " + std::to_string(st.st_ino);
        };
        const file model(config_.tokenizer);
        std::vector<std::byte> bytes(model.size());
        pread_exact(model.fd(), model.path(), bytes.data(), bytes.size(), 0);
        boost::crc_32_type crc;
        crc.process_bytes(bytes.data(), bytes.size());
        key += "tokenizer " + identity(config_.tokenizer) + " crc32 " + std::to_string(crc.checksum()) + "\n";
        const text_options& o = corpus_->options();
        key += "bos " + std::to_string(config_.add_bos) + " eos " + std::to_string(config_.add_eos) + " field " + o.field + " split " +
               std::to_string(static_cast<int>(o.split)) + " skip_invalid " + std::to_string(o.skip_invalid) + " max_line_bytes " + std::to_string(o.max_line_bytes) + "\n";
        for (std::size_t f = 0; f < corpus_->file_count(); ++f) key += "file " + identity(corpus_->file_at(f).path()) + "\n";
        key += "documents " + std::to_string(corpus_->document_count()) + "\n";
        return key;
    }

    void load_or_count_lengths(unsigned threads) {
        const std::string key = lengths_key();
        const std::string dir = detail::cache_directory(config_.cache_dir);
        std::string path;
        if (!dir.empty()) {
            boost::crc_32_type crc;
            crc.process_bytes(key.data(), key.size());
            char name[32];
            std::snprintf(name, sizeof name, "tokens-%08x.lengths", static_cast<unsigned>(crc.checksum()));
            path = (std::filesystem::path(dir) / name).string();
            try {
                if (auto cached = token_lengths::read(path, key); cached && cached->size() == corpus_->document_count()) {
                    lengths_ = std::move(*cached);
                    lengths_origin_ = "read from " + path;
                    return;
                }
            } catch (const error& e) {  // damaged or unreadable: counted again and rewritten below
                lengths_origin_ = std::string("cache unusable (") + e.what() + "); ";
            }
        }
        const auto t0 = std::chrono::steady_clock::now();
        const unsigned n = count_lengths(threads);
        lengths_origin_ += "computed by " + std::to_string(n) + " thread(s) in " +
                           std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s";
        if (path.empty()) {
            lengths_origin_ += ", not cached (cache_dir none)";
            return;
        }
        try {
            std::error_code ec;
            std::filesystem::create_directories(dir, ec);
            token_lengths{key, lengths_}.write(path);
            lengths_origin_ += ", cached in " + path;
        } catch (const error& e) {  // a read-only home, a full disk: the run goes on, the next open counts again
            lengths_origin_ += std::string(", not cached: ") + e.what();
        }
    }

    // Every document's token count, on `threads` threads with a tokenizer each. Returns the threads used.
    unsigned count_lengths(unsigned threads) {
        const std::uint64_t n = corpus_->document_count();
        if (threads == 0) threads = static_cast<unsigned>(std::max(1.0, read_topology().usable_cores()));
        threads = static_cast<unsigned>(std::clamp<std::uint64_t>(n / 64, 1, threads));
        lengths_.assign(n, 0);
        constexpr std::uint64_t chunk = 64;  // documents claimed at once
        std::atomic<std::uint64_t> next{0};
        std::atomic<bool> failed{false};
        std::exception_ptr failure;
        std::mutex failure_mutex;
        auto count = [&] {
            try {
                tokenizer tok(tokenizer_config());
                text_corpus::scratch scratch;
                std::string text;
                std::vector<std::int32_t> ids;
                for (std::uint64_t first; !failed.load(std::memory_order_relaxed) && (first = next.fetch_add(chunk)) < n;)
                    for (std::uint64_t d = first; d < std::min(n, first + chunk); ++d) {
                        corpus_->document_text(d, scratch, text);
                        encode(tok, d, text, ids);
                        if (ids.size() > UINT32_MAX) {
                            const auto& ref = corpus_->document(d);
                            throw format_error(corpus_->file_of(ref).path(), ref.offset, "a document of more than 2^32 tokens");
                        }
                        lengths_[d] = static_cast<std::uint32_t>(ids.size());
                    }
            } catch (...) {
                std::lock_guard lock(failure_mutex);
                if (!failure) failure = std::current_exception();
                failed.store(true);
            }
        };
        std::vector<std::thread> pool;
        try {
            for (unsigned t = 1; t < threads; ++t) pool.emplace_back(count);
        } catch (const std::system_error&) {  // no more threads (a pids limit): count with those there are
        }
        count();
        for (auto& t : pool) t.join();
        if (failure) std::rethrow_exception(failure);
        return static_cast<unsigned>(pool.size()) + 1;
    }

    void encode(tokenizer& tok, std::uint64_t d, const std::string& text, std::vector<std::int32_t>& ids) const {
        if (std::string problem = tok.encode(text, ids); !problem.empty()) {
            const auto& ref = corpus_->document(d);
            throw format_error(corpus_->file_of(ref).path(), ref.offset, "sentencepiece could not encode this document: " + problem);
        }
    }

    class worker final : public source_worker {
    public:
        worker(text_source& s, const pipeline_config& c, source_counters& counters)
            : source_(s), counters_(counters), windows_(c.mode == sample_mode::windows), long_document_(c.seq_len), tokenizer_(s.tokenizer_config()) {}

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
            // Once per batch: the counters are shared by every worker (one cache line bouncing per
            // document would cost more than the counting).
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
            source_.encode(tokenizer_, d, text_, out);
            read_ns_ += detail::elapsed_ns(t0, t1);
            tokenize_ns_ += detail::elapsed_ns(t1);
            bytes_read_ += text_.size();
            if (out.size() != source_.lengths_[d]) {
                const auto& ref = source_.corpus_->document(d);
                throw format_error(source_.corpus_->file_of(ref).path(), ref.offset,
                                   "this document now has " + std::to_string(out.size()) + " tokens, " + std::to_string(source_.lengths_[d]) +
                                       " when the corpus was opened (the file changed under the job)");
            }
        }

        text_source& source_;
        source_counters& counters_;
        bool windows_;
        std::uint64_t long_document_;  // longer than a sample: shared through the cache
        tokenizer tokenizer_;
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
    std::unique_ptr<detail::document_cache> cache_;
};
#endif

}  // namespace feedline
