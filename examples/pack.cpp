// feedline-pack: JSONL or plain text -> token shards (Megatron .bin/.idx or llm.c), tokenized with
// sentencepiece on worker threads. Output order equals input order whatever the thread count; ids equal
// `spm_encode --output_format=id`. Files appear under their final names only when the whole pack
// succeeded: an interrupted or failed pack (signal, disk full, bad input) leaves nothing that validates.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>
#include <variant>

#include <feedline/pipeline.hpp>

namespace {

std::atomic<bool> interrupted{false};
extern "C" void on_signal(int) { interrupted.store(true); }

struct options {
    std::vector<std::string> inputs;
    std::string model, output, format = "megatron", dtype = "auto", field = "text", split = "file", model_type = "unigram";
    std::uint64_t train_vocab = 0, shard_size = 0;
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    bool append_eos = false, skip_invalid = false, quiet = false;
    std::uint64_t max_line_bytes = feedline::text_options{}.max_line_bytes;
};

// Reads documents from every input file in order, in batches.
class document_source {
public:
    document_source(std::vector<std::string> files, feedline::text_options opt) : files_(std::move(files)), opt_(std::move(opt)) {}
    // Appends up to `max_docs` documents (or ~max_bytes of text); false when there are no more.
    bool next_batch(std::vector<std::string>& out, std::size_t max_docs, std::size_t max_bytes) {
        out.clear();
        std::size_t bytes = 0;
        feedline::text_document doc;
        while (out.size() < max_docs && bytes < max_bytes) {
            if (!reader_) {
                if (next_file_ == files_.size()) break;
                reader_ = std::make_unique<feedline::text_reader>(files_[next_file_++], opt_);
            }
            if (!reader_->next(doc)) {
                skipped_ += reader_->skipped();
                reader_.reset();
                continue;
            }
            bytes += doc.text.size();
            out.push_back(std::move(doc.text));
        }
        return !out.empty();
    }
    std::uint64_t skipped() const { return skipped_ + (reader_ ? reader_->skipped() : 0); }

private:
    std::vector<std::string> files_;
    feedline::text_options opt_;
    std::size_t next_file_ = 0;
    std::unique_ptr<feedline::text_reader> reader_;
    std::uint64_t skipped_ = 0;
};

// Trains a sentencepiece model on the input text (one document per line) and returns its path.
std::string train_model(const options& o, const std::vector<std::string>& files, const feedline::text_options& topt) {
    std::string text_path = o.output + ".spm-train.txt.tmp-" + std::to_string(::getpid());
    {
        std::ofstream out(text_path);
        document_source src(files, topt);
        std::vector<std::string> batch;
        while (src.next_batch(batch, 4096, 16 << 20))
            for (auto& t : batch) {
                for (char& c : t)
                    if (c == '\n' || c == '\r') c = ' ';
                if (!t.empty()) out << t << '\n';
            }
        if (!out) throw feedline::io_error(text_path, errno, "cannot write training text");
    }
    std::string args = "--input=" + text_path + " --model_prefix=" + o.output + " --vocab_size=" + std::to_string(o.train_vocab) +
                       " --model_type=" + o.model_type + " --character_coverage=1.0 --hard_vocab_limit=false" +
                       " --input_sentence_size=2000000 --shuffle_input_sentence=true --minloglevel=2" +
                       " --num_threads=" + std::to_string(o.threads);
    auto status = sentencepiece::SentencePieceTrainer::Train(args);
    std::remove(text_path.c_str());
    if (!status.ok()) throw feedline::config_error("train-model", "sentencepiece training failed: " + status.ToString());
    return o.output + ".model";
}

// The output writer: Megatron (one or several prefixes) or llm.c shards.
class shard_output {
public:
    shard_output(const options& o, feedline::token_dtype dt, std::uint32_t delimiter) : o_(o), dtype_(dt) {
        if (o.format == "llmc") {
            std::uint64_t tokens = o.shard_size ? std::max<std::uint64_t>(1, (o.shard_size - std::min<std::uint64_t>(o.shard_size, 1024)) /
                                                                                  feedline::dtype_size(dt))
                                                : 100'000'000;
            llmc_ = std::make_unique<feedline::llmc_writer>(o.output, dt, delimiter, std::min<std::uint64_t>(tokens, 0x7fffffff));
        } else {
            open_megatron();
        }
    }
    void add(const std::vector<int>& ids) {
        if (llmc_) return llmc_->add_document(ids);
        if (o_.shard_size && megatron_.back()->bytes_written() >= o_.shard_size) {
            megatron_.back()->close();
            open_megatron();
        }
        megatron_.back()->add_document(ids);
    }
    std::vector<std::string> finish() {
        if (llmc_) return llmc_->finish();
        for (auto& w : megatron_) w->close();
        // Numbered pairs of an earlier pack into this prefix go first (indexes before data), so one
        // with more shards leaves none behind and a kill while publishing never mixes the two.
        if (o_.shard_size) feedline::detail::remove_numbered_files(o_.output, {".idx", ".bin"});
        std::vector<std::string> out;
        for (auto& w : megatron_) {
            w->commit();
            out.push_back(prefixes_[out.size()]);
        }
        return out;
    }

private:
    void open_megatron() {
        std::string prefix = o_.output;
        if (o_.shard_size) {
            char num[24];
            std::snprintf(num, sizeof(num), "_%06zu", megatron_.size());
            prefix += num;
        }
        prefixes_.push_back(prefix);
        megatron_.push_back(std::make_unique<feedline::megatron_writer>(prefix, dtype_));
    }
    const options& o_;
    feedline::token_dtype dtype_;
    std::unique_ptr<feedline::llmc_writer> llmc_;
    std::vector<std::unique_ptr<feedline::megatron_writer>> megatron_;
    std::vector<std::string> prefixes_;
};

int run(const options& o) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    feedline::text_options topt{.field = o.field,
                                .skip_invalid = o.skip_invalid,
                                .split = o.split == "blank"  ? feedline::text_split::blank_lines
                                         : o.split == "line" ? feedline::text_split::lines
                                                             : feedline::text_split::whole_file,
                                .max_line_bytes = o.max_line_bytes};
    if (o.split != "file" && o.split != "blank" && o.split != "line")
        throw feedline::config_error("text-split", "expected file, blank or line, got '" + o.split + "'");
    if (o.format != "megatron" && o.format != "llmc")
        throw feedline::config_error("format", "expected megatron or llmc, got '" + o.format + "'");
    if (o.model.empty() == (o.train_vocab == 0))
        throw feedline::config_error("model", "give exactly one of --model and --train-model");
    auto files = feedline::resolve_text_inputs(o.inputs);
    std::string model_path = o.model.empty() ? train_model(o, files, topt) : o.model;

    const feedline::tokenizer probe({.model = model_path, .add_eos = false}, "model");
    const auto vocab = static_cast<std::uint64_t>(probe.vocab_size());
    const int eos = probe.eos_id();
    if (o.append_eos && eos < 0) throw feedline::config_error("append-eos", "the model has no end-of-sentence piece");
    feedline::token_dtype dt;
    if (o.dtype == "auto")
        dt = o.format == "llmc" ? (vocab <= 65536 ? feedline::token_dtype::uint16 : feedline::token_dtype::uint32)
                                : feedline::megatron_optimal_dtype(vocab);
    else
        dt = feedline::parse_dtype(o.dtype);
    // llm.c documents begin with a delimiter: the model's end-of-text piece, as llm.c uses GPT-2's.
    auto delimiter = static_cast<std::uint32_t>(eos >= 0 ? eos : std::max(0, probe.bos_id()));
    shard_output out(o, dt, delimiter);

    // A reader thread, o.threads tokenizers (one sentencepiece processor each) and this thread writing
    // shards in input order, all at once (transform/tokenize_in_order.hpp).
    document_source src(files, topt);
    std::uint64_t docs = 0, tokens = 0, text_bytes = 0;
    auto last_progress = clock::now();
    const bool show_progress = !o.quiet && ::isatty(STDERR_FILENO);
    feedline::tokenize_in_order(
        {.model = model_path, .add_eos = o.append_eos}, o.threads,
        [&](std::vector<std::string>& batch) {
            if (interrupted.load()) throw feedline::error("interrupted by a signal; no output was written");
            return src.next_batch(batch, 2048, 8 << 20);
        },
        [&](const std::vector<std::string>& batch, const std::vector<std::vector<std::int32_t>>& ids) {
            if (interrupted.load()) throw feedline::error("interrupted by a signal; no output was written");
            for (std::size_t i = 0; i < batch.size(); ++i) {
                out.add(ids[i]);
                tokens += ids[i].size();
                text_bytes += batch[i].size();
            }
            docs += batch.size();
            if (show_progress && clock::now() - last_progress > std::chrono::milliseconds(500)) {
                double secs = std::chrono::duration<double>(clock::now() - start).count();
                fmt::print(stderr, "\r{} documents  {} tokens  {:.1f} MB/s   ", docs, tokens, static_cast<double>(text_bytes) / 1e6 / secs);
                last_progress = clock::now();
            }
        });
    if (interrupted.load()) throw feedline::error("interrupted by a signal; no output was written");
    auto written = out.finish();
    double secs = std::chrono::duration<double>(clock::now() - start).count();
    if (show_progress) fmt::print(stderr, "\n");
    if (!o.quiet)
        fmt::print("packed {} documents, {} tokens ({}, {}) into {} shard(s) at {} in {:.2f} s ({:.1f} MB/s of text){}\n", docs, tokens,
                   o.format, feedline::to_string(dt), written.size(), o.output, secs, static_cast<double>(text_bytes) / 1e6 / secs,
                   src.skipped() ? fmt::format("; skipped {} invalid lines", src.skipped()) : "");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Tokenize JSONL / text with sentencepiece into Megatron or llm.c token shards"};
    options o;
    app.add_option("--input", o.inputs, "JSONL (.jsonl/.json) or text files, directories or globs")->required();
    app.add_option("--model", o.model, "sentencepiece model to tokenize with");
    app.add_option("--train-model", o.train_vocab, "train a sentencepiece model of this vocabulary size on the input first (saved as OUTPUT.model)");
    app.add_option("--model-type", o.model_type, "sentencepiece model type for --train-model: unigram, bpe, char, word")->capture_default_str();
    app.add_option("--output", o.output, "output prefix")->required();
    app.add_option("--format", o.format, "megatron or llmc")->capture_default_str();
    app.add_option("--dtype", o.dtype, "auto, uint16, int32 or uint32 (auto: the narrowest that holds the vocabulary)")->capture_default_str();
    app.add_flag("--append-eos", o.append_eos, "append the model's end-of-sentence id to every document");
    app.add_option("--shard-size", o.shard_size, "start a new shard after this many bytes (0: Megatron one shard, llm.c 10^8 tokens)");
    app.add_option("--threads", o.threads, "tokenizer threads")->capture_default_str();
    app.add_option("--field", o.field, "JSONL field holding the text")->capture_default_str();
    app.add_flag("--skip-invalid", o.skip_invalid, "skip (and count) JSONL lines that are invalid or lack the field (or are longer than --max-line-bytes)");
    app.add_option("--max-line-bytes", o.max_line_bytes, "longest line (or whole-file document) to read, in bytes; 0: no limit")->capture_default_str();
    app.add_option("--text-split", o.split, "plain text documents: file, blank (blank-line separated) or line")->capture_default_str();
    app.add_flag("--quiet", o.quiet, "no progress or summary");
    CLI11_PARSE(app, argc, argv);
    if (o.threads == 0) o.threads = 1;
    // A closed terminal (SIGHUP) stops a pack like Ctrl-C: nothing half-written is left. A file-size
    // limit (SIGXFSZ would kill the process with its temporary files in place) makes write() fail
    // with EFBIG instead, reported like a full disk.
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGHUP, on_signal);
    std::signal(SIGXFSZ, SIG_IGN);
    try {
        return run(o);
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return interrupted.load() ? 130 : 1;
    }
}
