// feedline/output/pack_text.hpp: JSONL/text in, token shards out: what feedline-pack does once it has a
// model, and what Python's feedline.pack() runs. Documents are read in order (format/text.hpp), encoded
// on several threads and written in input order (transform/tokenize_in_order.hpp) by the dataset writer
// (output/dataset_writer.hpp), so the output is the same for any thread count, memory stays bounded, and
// nothing is published unless every document was written.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/format/text.hpp>
#include <feedline/output/dataset_writer.hpp>
#include <feedline/transform/tokenize_in_order.hpp>
#include <feedline/transform/tokenizers.hpp>

namespace feedline {

// Reads documents from every input file in order, in batches.
class document_batches {
public:
    document_batches(std::vector<std::string> files, text_options opt) : files_(std::move(files)), opt_(std::move(opt)) {}
    // Appends up to `max_docs` documents (or ~max_bytes of text) to `out` (cleared first); false when
    // there are no more.
    bool next_batch(std::vector<std::string>& out, std::size_t max_docs, std::size_t max_bytes) {
        out.clear();
        std::size_t bytes = 0;
        text_document doc;
        while (out.size() < max_docs && bytes < max_bytes) {
            if (!reader_) {
                if (next_file_ == files_.size()) break;
                reader_ = std::make_unique<text_reader>(files_[next_file_++], opt_);
            }
            if (!reader_->next(doc)) {
                skipped_ += reader_->skipped();
                reader_.reset();
                continue;
            }
            bytes += doc.text.size();
            out.push_back(std::move(doc.text));
        }
        skipped_so_far_.store(skipped_ + (reader_ ? reader_->skipped() : 0), std::memory_order_relaxed);
        return !out.empty();
    }
    // Invalid JSONL lines skipped (text_options::skip_invalid) in the batches read so far. Safe beside
    // next_batch on another thread: pack_text reads batches on a reader thread and reports this from
    // its writer, where reading the open reader's count raced with that thread closing it
    // (ThreadSanitizer, tests/integration/test_sources.cpp).
    std::uint64_t skipped() const noexcept { return skipped_so_far_.load(std::memory_order_relaxed); }

private:
    std::vector<std::string> files_;
    text_options opt_;
    std::size_t next_file_ = 0;
    std::unique_ptr<text_reader> reader_;
    std::uint64_t skipped_ = 0;                     // by the files closed
    std::atomic<std::uint64_t> skipped_so_far_{0};  // skipped(): published after each batch
};

struct pack_options {
    std::vector<std::string> inputs;  // JSONL/text files, directories or globs (resolve_text_inputs)
    tokenizer_options tokenizer;      // the model, its kind, add_eos
    text_options documents;           // what a document is
    std::string format = "megatron";  // megatron | llmc
    std::string dtype = "auto";       // auto: the narrowest that holds the vocabulary (llm.c: uint16 or uint32)
    std::uint64_t shard_bytes = 0;    // dataset_writer_options::shard_bytes
    unsigned threads = 1;             // tokenizer threads
};

struct pack_progress {
    std::uint64_t documents = 0, tokens = 0, text_bytes = 0, skipped = 0;
    double seconds = 0;
};

struct pack_result {
    std::vector<std::string> written;  // Megatron prefixes or llm.c shard paths
    pack_progress totals;
    token_dtype dtype = token_dtype::uint16;
    std::string tokenizer;  // the encoder that ran, and why it was chosen when that is not obvious
};

// The dtype `pack_options::dtype` names for a vocabulary of `vocab` ids in `format`.
inline token_dtype pack_dtype(const std::string& dtype, const std::string& format, std::uint64_t vocab) {
    if (dtype != "auto") return parse_dtype(dtype);
    if (format == "llmc") return vocab <= 65536 ? token_dtype::uint16 : token_dtype::uint32;
    return megatron_optimal_dtype(vocab);
}

// Packs `o.inputs` into `output`. `held`: the output's lock when the caller holds it (feedline-pack
// holds it from the model's training on); else one is taken here. `progress` is called from this
// thread about every `every` while documents are written or awaited, and once with the totals before the
// dataset is published; `stop`, when set,
// ends the pack within about a second (error "interrupted"), leaving no output. Throws io_error,
// format_error (a bad input line), config_error (the model, dtype, format or a token that does not fit).
inline pack_result pack_text(const std::string& output, const pack_options& o, const output_lock* held = nullptr,
                             const std::function<void(const pack_progress&)>& progress = {}, const std::atomic<bool>* stop = nullptr,
                             std::chrono::milliseconds every = std::chrono::milliseconds(500)) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    if (o.format != "megatron" && o.format != "llmc") throw config_error("format", "expected megatron or llmc, got '" + o.format + "'");
    const auto files = resolve_text_inputs(o.inputs);
    std::optional<output_lock> own_lock;
    if (!held) held = &own_lock.emplace(output);
    tokenizer_options probe_options = o.tokenizer;
    probe_options.add_eos = false;
    const auto probe = make_tokenizer(probe_options, "model");
    const int eos = probe->eos_id();
    if (o.tokenizer.add_eos && eos < 0) throw config_error("append-eos", "the model has no end-of-sentence piece");
    pack_result result;
    result.dtype = pack_dtype(o.dtype, o.format, static_cast<std::uint64_t>(probe->vocab_size()));
    result.tokenizer = probe->describe() + (probe->chosen_because().empty() ? "" : ": " + probe->chosen_because());
    // llm.c documents begin with a delimiter: the model's end-of-text piece, as llm.c uses GPT-2's.
    const auto delimiter = static_cast<std::uint32_t>(eos >= 0 ? eos : std::max(0, probe->bos_id()));
    dataset_writer out(output, {.format = o.format, .dtype = result.dtype, .delimiter = delimiter, .shard_bytes = o.shard_bytes}, held);

    document_batches src(files, o.documents);
    pack_progress& p = result.totals;
    auto last = clock::now();
    const auto report = [&] {
        p.skipped = src.skipped();
        p.seconds = std::chrono::duration<double>(clock::now() - start).count();
        if (progress) progress(p);
    };
    const auto check_stop = [&] {
        if (stop && stop->load()) throw error("interrupted by a signal; no output was written");
    };
    // A reader thread, o.threads tokenizers (one each) and this thread writing in input order.
    tokenize_in_order(
        o.tokenizer, std::max(1u, o.threads),
        [&](std::vector<std::string>& batch) {
            check_stop();
            return src.next_batch(batch, 2048, 8 << 20);
        },
        [&](const std::vector<std::string>& batch, const std::vector<std::vector<std::int32_t>>& ids) {
            check_stop();
            for (std::size_t i = 0; i < batch.size(); ++i) {
                out.add(ids[i]);
                p.tokens += ids[i].size();
                p.text_bytes += batch[i].size();
            }
            p.documents += batch.size();
            if (clock::now() - last >= every) {
                report();
                last = clock::now();
            }
        },
        stop,  // a stop ends every thread within about a second, even mid-document
        [&] {  // while waiting for a chunk (a slow tokenizer, long documents): progress goes on too
            if (clock::now() - last >= every) {
                report();
                last = clock::now();
            }
        });
    report();  // the totals, before publishing: a stop asked for now still leaves no output
    check_stop();
    result.written = out.finish();
    return result;
}

}  // namespace feedline
