// feedline-pack: JSONL or plain text -> token shards (Megatron .bin/.idx or llm.c), tokenized on worker
// threads (a tokenizer each, from make_tokenizer; --train-model trains a sentencepiece model first).
// Output order equals input order whatever the thread count; ids equal `spm_encode --output_format=id`. Files appear under their final names only when the whole pack
// succeeded: an interrupted or failed pack (signal, disk full, bad input) leaves nothing that validates.
#include <fmt/core.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/stat.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <unordered_map>

#include <feedline/output/pack_text.hpp>
#include <feedline/pipeline.hpp>

#include "tool_main.hpp"

namespace {

std::atomic<bool> interrupted{false};
extern "C" void on_signal(int) { interrupted.store(true); }

// Shards smaller than a page make a file per document of most corpora; 4 KiB also leaves room for an
// llm.c header.
constexpr std::uint64_t min_shard_bytes = 4096;
constexpr unsigned max_threads = 1024;

struct options {
    std::vector<std::string> inputs;
    std::string model, output, format = "megatron", dtype = "auto", model_type = "unigram";
    std::uint64_t train_vocab = 0, shard_size = 0;
    unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    bool append_eos = false, quiet = false;
    // What a document is: the pipeline's text options (field, skip_invalid, text_split, max_line_bytes),
    // flags from their one declaration.
    feedline::pipeline_config text;
};

// A private working directory "<output>.spm-train.tmp-<tag>" (mkdir fails on anything planted there),
// removed on every way out; a killed pack's is removed by the next pack into the output (output_lock).
class training_directory {
public:
    training_directory(const std::string& output, const feedline::output_lock& lock) : path_(output + ".spm-train.tmp-" + lock.tag()) {
        if (::mkdir(path_.c_str(), 0700) != 0) throw feedline::io_error(path_, errno, "cannot create the model training directory");
    }
    ~training_directory() {
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    std::string operator/(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

// Trains a sentencepiece model on the input text (one document per line) and publishes it as
// OUTPUT.model and OUTPUT.vocab (renamed into place: a planted symlink there is replaced, never
// written through). Returns the model's path.
std::string train_model(const options& o, const std::vector<std::string>& files, const feedline::text_options& topt,
                        const feedline::output_lock& lock) {
    const training_directory work(o.output, lock);
    const std::string text_path = work / "input.txt";
    {
        feedline::atomic_file out(text_path, 1u << 20);
        feedline::document_batches src(files, topt);
        std::vector<std::string> batch;
        while (src.next_batch(batch, 4096, 16 << 20)) {
            if (interrupted.load()) throw feedline::error("interrupted by a signal; no output was written");
            for (auto& t : batch) {
                for (char& c : t)
                    if (c == '\n' || c == '\r') c = ' ';
                if (t.empty()) continue;
                t += '\n';
                out.write(t.data(), t.size());
            }
        }
        out.commit();
    }
    // The map form: paths with spaces stay one argument.
    const std::unordered_map<std::string, std::string> args = {{"input", text_path},
                                                               {"model_prefix", work / "model"},
                                                               {"vocab_size", std::to_string(o.train_vocab)},
                                                               {"model_type", o.model_type},
                                                               {"character_coverage", "1.0"},
                                                               {"hard_vocab_limit", "false"},
                                                               {"input_sentence_size", "2000000"},
                                                               {"shuffle_input_sentence", "true"},
                                                               {"minloglevel", "2"},
                                                               {"num_threads", std::to_string(o.threads)}};
    if (auto status = sentencepiece::SentencePieceTrainer::Train(args); !status.ok())
        throw feedline::config_error("train-model", "sentencepiece training failed: " + status.ToString());
    for (const char* ext : {".vocab", ".model"}) {
        const std::string from = work / (std::string("model") + ext), to = o.output + ext;
        if (::rename(from.c_str(), to.c_str()) != 0) throw feedline::io_error(to, errno, "cannot publish the trained model");
    }
    feedline::sync_parent_directory(o.output);
    return o.output + ".model";
}

int run(const options& o) {
    const feedline::text_options topt = o.text.text.documents;
    if (o.format != "megatron" && o.format != "llmc")
        throw feedline::config_error("format", "expected megatron or llmc, got '" + o.format + "'");
    if (o.model.empty() == (o.train_vocab == 0)) throw feedline::config_error("model", "give exactly one of --model and --train-model");
    if (o.shard_size != 0 && o.shard_size < min_shard_bytes)
        throw feedline::config_error("shard-size", std::to_string(o.shard_size) +
                                                       " bytes is below the smallest shard feedline-pack writes (" +
                                                       std::to_string(min_shard_bytes) + " bytes; 0: one shard)");
    if (o.threads > max_threads)
        throw feedline::config_error("threads", std::to_string(o.threads) + " tokenizer threads; at most " + std::to_string(max_threads));
    auto files = feedline::resolve_text_inputs(o.inputs);
    // One pack per output prefix at a time, held from the model's training to the last rename; what a
    // killed pack into this prefix left under temporary names goes now.
    const feedline::output_lock lock(o.output);
    if (!o.quiet && !lock.removed_temporaries().empty())
        fmt::print(stderr, "removed {} temporary file(s) a killed pack into {} left\n", lock.removed_temporaries().size(), o.output);
    const std::string model_path = o.model.empty() ? train_model(o, files, topt, lock) : o.model;

    const bool show_progress = !o.quiet && ::isatty(STDERR_FILENO);
    const auto r = feedline::pack_text(
        o.output,
        {.inputs = files,
         .tokenizer = {.model = model_path, .kind = o.text.text.tokenizer_kind, .add_eos = o.append_eos},
         .documents = topt,
         .format = o.format,
         .dtype = o.dtype,
         .shard_bytes = o.shard_size,
         .threads = o.threads},
        &lock,
        [&](const feedline::pack_progress& p) {
            if (show_progress)
                fmt::print(stderr, "\r{} documents  {} tokens  {:.1f} MB/s   ", p.documents, p.tokens,
                           static_cast<double>(p.text_bytes) / 1e6 / std::max(p.seconds, 1e-9));
        },
        &interrupted);
    if (show_progress) fmt::print(stderr, "\n");
    const auto& t = r.totals;
    if (!o.quiet)
        fmt::print("packed {} documents, {} tokens ({}, {}) into {} shard(s) at {} in {:.2f} s ({:.1f} MB/s of text, {}){}\n", t.documents,
                   t.tokens, o.format, feedline::to_string(r.dtype), r.written.size(), o.output, t.seconds,
                   static_cast<double>(t.text_bytes) / 1e6 / std::max(t.seconds, 1e-9), r.tokenizer,
                   t.skipped ? fmt::format("; skipped {} invalid lines", t.skipped) : "");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Tokenize JSONL / text with sentencepiece into Megatron or llm.c token shards"};
    options o;
    app.add_option("--input", o.inputs, "JSONL (.jsonl/.json) or text files, directories or globs")->required();
    app.add_option("--model", o.model, "sentencepiece model to tokenize with");
    app.add_option("--train-model", o.train_vocab,
                   "train a sentencepiece model of this vocabulary size on the input first (saved as OUTPUT.model)");
    app.add_option("--model-type", o.model_type, "sentencepiece model type for --train-model: unigram, bpe, char, word")
        ->capture_default_str();
    app.add_option("--output", o.output, "output prefix")->required();
    app.add_option("--format", o.format, "megatron or llmc")->capture_default_str();
    app.add_option("--dtype", o.dtype, "auto, uint16, int32 or uint32 (auto: the narrowest that holds the vocabulary)")
        ->capture_default_str();
    app.add_flag("--append-eos", o.append_eos, "append the model's end-of-sentence id to every document");
    app.add_option("--shard-size", o.shard_size, "start a new shard after this many bytes (0: Megatron one shard, llm.c 10^8 tokens)");
    app.add_option("--threads", o.threads, "tokenizer threads")->capture_default_str();
    tools::add_pipeline_options(app, o.text, {.only = {"field", "skip_invalid", "text_split", "max_line_bytes", "tokenizer_kind"}});
    app.add_flag("--quiet", o.quiet, "no progress or summary");
    if (const int code = tools::parse_command_line("feedline-pack", 1, app, argc, argv); code >= 0) return code;
    if (o.threads == 0) o.threads = 1;
    // A closed terminal (SIGHUP) stops a pack like Ctrl-C: nothing half-written is left. A file-size
    // limit (SIGXFSZ would kill the process with its temporary files in place) makes write() fail
    // with EFBIG instead, reported like a full disk.
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGHUP, on_signal);
    std::signal(SIGXFSZ, SIG_IGN);
    const int code = tools::run_tool("feedline-pack", 1, [&] { return run(o); });
    return code != 0 && interrupted.load() ? 130 : code;
}
