// feedline-inspect: validates a token dataset of any supported format and summarises it.
// --json prints the summary as one JSON object; --dump-tokens writes every token of every document,
// in dataset order, as little-endian uint32 to stdout, so any two readers can be compared byte for byte.
// A blend in Megatron's --data-path form is inspected dataset by dataset (JSONL/text: every line parsed).
// A tokenizer model (a sentencepiece .model or a tokenizer.json) is summarised too: its type and options, and which encoder
// feedline tokenizes it with (its own where it reproduces the model, else the library's, and why).
// A mixture file (sampling/mixture_file.hpp; recognised by its content, or named by --mixture) is
// summarised by its stages and, given a run of --steps steps of --global-batch x --seq-len, each
// domain's expected samples and tokens.
// Exit code 1 with the error (file and byte offset, or a mixture file's line) on bad input.
#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <feedline/pipeline.hpp>

#include "tool_main.hpp"

namespace {

struct inspect_options {
    bool json = false, dump = false, deep = false, mixture = false;
    std::uint64_t steps = 0, global_batch = 0, seq_len = 0;
    feedline::io_backend backend = feedline::io_backend::automatic;
    std::int64_t delimiter = -1;
};

// Validates one token dataset and returns its summary; with --dump-tokens writes its tokens instead.
nlohmann::json inspect_shards(const std::vector<std::string>& paths, const inspect_options& o) {
    feedline::token_dataset ds(paths);
    if (o.delimiter >= 0) ds.set_delimiter(static_cast<std::uint32_t>(o.delimiter));
    const std::uint64_t docs = ds.document_count();
    std::uint64_t smallest = docs ? std::numeric_limits<std::uint64_t>::max() : 0, largest = 0;
    for (std::uint64_t d = 0; d < docs; ++d) {
        auto len = ds.document(d).length;
        smallest = std::min(smallest, len);
        largest = std::max(largest, len);
    }
    if (o.dump || o.deep) {
        auto reader = feedline::make_reader({.backend = o.backend, .pattern = feedline::access_pattern::sequential});
        std::vector<std::uint32_t> tokens;
        for (std::uint64_t d = 0; d < docs; ++d) {
            auto span = ds.document(d);
            // Large documents are read in pieces so memory stays bounded.
            for (std::uint64_t first = 0; first < span.length; first += 1u << 20) {
                std::uint64_t n = std::min<std::uint64_t>(1u << 20, span.length - first);
                tokens.resize(n);
                ds.read_tokens(reader, span, first, n, tokens.data());
                if (o.dump && std::fwrite(tokens.data(), 4, n, stdout) != n)
                    throw feedline::io_error("stdout", errno, "writing tokens failed");
            }
        }
    }
    nlohmann::json shards = nlohmann::json::array();
    for (std::size_t s = 0; s < ds.shard_count(); ++s)
        shards.push_back({{"path", ds.shard_path(s)}, {"tokens", ds.shard(s).tokens}, {"documents", ds.shard(s).documents}});
    nlohmann::json summary = {
        {"format", std::string(feedline::to_string(ds.format()))},
        {"dtype", std::string(feedline::to_string(ds.dtype()))},
        {"shards", ds.shard_count()},
        {"documents", docs},
        {"tokens", ds.total_tokens()},
        {"smallest_document", smallest},
        {"largest_document", largest},
        {"valid", true},
        {"shard_list", shards},
    };
    if (feedline::is_token_stream(ds.format())) summary["delimiter"] = ds.delimiter();
    return summary;
}

// JSONL / text (alone or in a blend): every line parsed as the pipeline would (tokens are counted by the pipeline).
nlohmann::json inspect_text(const std::string& spec) {
    const feedline::text_corpus corpus({spec});
    return {{"format", "text"},
            {"files", corpus.file_count()},
            {"documents", corpus.document_count()},
            {"text_bytes", corpus.text_bytes()},
            {"valid", true}};
}

// A sentencepiece model: what it is and which encoder kind "auto" gives it, with why.
nlohmann::json inspect_model(const std::string& path) {
    const auto tok = feedline::make_tokenizer({.model = path, .add_eos = false}, "model");
    const auto tables = feedline::feedline_tokenizer::load(path, "model");
    const auto m = feedline::detail::read_sentencepiece_model(feedline::detail::read_model_file(path, "model"));
    std::size_t user_defined = 0, unused = 0;
    for (const auto& p : m.pieces)
        user_defined += p.type == feedline::detail::piece_type::user_defined, unused += p.type == feedline::detail::piece_type::unused;
    nlohmann::json summary = {{"format", "sentencepiece model"},
                              {"model_type", m.model_type_name()},
                              {"pieces", tok->vocab_size()},
                              {"normalizer", m.normalizer_name.empty() ? "(precompiled map only)" : m.normalizer_name},
                              {"byte_fallback", m.byte_fallback},
                              {"user_defined_pieces", user_defined},
                              {"unused_pieces", unused},
                              {"bos_id", tok->bos_id()},
                              {"eos_id", tok->eos_id()},
                              {"encoder", tok->describe()},
                              {"kind", std::string(tok->kind())},
                              {"why", tok->chosen_because()},
                              {"long_documents_split_at_spaces", tables->splits_at_spaces && tables->cuts_at_spaces},
                              {"valid", true}};
    if (tables->problem.empty()) {
        summary["word_cache"] = tables->cuts_at_spaces;
        summary["table_bytes"] = tables->memory_bytes();
    }
    return summary;
}

// A tokenizer.json: its model, pre-tokenizer and special tokens, and the encoder.
nlohmann::json inspect_tokenizer_json(const std::string& path) {
    const auto tok = feedline::make_tokenizer({.model = path, .add_eos = false}, "model");
    nlohmann::json summary = {{"format", "tokenizer.json"},      {"encoder", tok->describe()}, {"kind", std::string(tok->kind())},
                              {"vocab_size", tok->vocab_size()}, {"bos_id", tok->bos_id()},    {"eos_id", tok->eos_id()}};
#if FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON
    if (const auto* bpe = dynamic_cast<const feedline::byte_level_bpe_tokenizer*>(tok.get())) {
        const auto& m = bpe->model();
        summary["model_type"] = "byte-level BPE";
        summary["merges"] = m.merge_count;
        summary["ignore_merges"] = m.ignore_merges;
        summary["pre_tokenizer"] = m.pre_tokenizer;
        summary["normalizer"] = m.nfc ? "NFC" : "none";
        summary["added_tokens"] = m.added_raw.size() + m.added_normalized.size();
        summary["bos_token"] = m.bos_token;
        summary["eos_token"] = m.eos_token;
        summary["table_bytes"] = bpe->model_bytes();
    }
#endif
    summary["valid"] = true;
    return summary;
}

bool is_model_file(const std::string& path) {
    if (!std::filesystem::is_regular_file(path)) return false;
    return (path.ends_with(".model") && feedline::detail::looks_like_sentencepiece(path)) ||
           (path.ends_with(".json") && feedline::detail::looks_like_tokenizer_json(path));
}

void print(const nlohmann::json& summary, bool deep) {
    if (summary["format"] == "tokenizer.json") {
        fmt::print("format     tokenizer.json ({}, {} tokens, {} merges, normalizer {}{})\n", summary.value("model_type", std::string("?")),
                   summary["vocab_size"].get<int>(), summary.value("merges", std::size_t(0)), summary.value("normalizer", std::string("?")),
                   summary.value("ignore_merges", false) ? ", whole words first (ignore_merges)" : "");
        if (summary.contains("pre_tokenizer")) fmt::print("pre-tokens {}\n", summary["pre_tokenizer"].get<std::string>());
        fmt::print("special    {} added tokens; BOS {}, EOS {}\n", summary.value("added_tokens", std::size_t(0)),
                   summary.value("bos_token", std::string()).empty() ? "none" : summary["bos_token"].get<std::string>(),
                   summary.value("eos_token", std::string()).empty() ? "none" : summary["eos_token"].get<std::string>());
        fmt::print("encoder    {}\nvalid      yes\n", summary["encoder"].get<std::string>());
        return;
    }
    if (summary["format"] == "sentencepiece model") {
        fmt::print("format     sentencepiece model ({}, {} pieces, normalizer {}{})\n", summary["model_type"].get<std::string>(),
                   summary["pieces"].get<int>(), summary["normalizer"].get<std::string>(),
                   summary["byte_fallback"].get<bool>() ? ", byte fallback" : "");
        const std::string why = summary["why"].get<std::string>();
        fmt::print("encoder    {}{}\n", summary["encoder"].get<std::string>(), why.empty() ? "" : " (" + why + ")");
        if (summary.contains("word_cache"))
            fmt::print("words      {}\n", summary["word_cache"].get<bool>() ? "cut at spaces and cached per thread"
                                                                            : "not cut at spaces (each text encoded whole)");
        fmt::print("valid      yes\n");
        return;
    }
    if (summary["format"] == "text") {
        fmt::print("format     text (tokenized on the fly)\nfiles      {}\ndocuments  {}\nbytes      {}\nvalid      yes\n",
                   summary["files"].get<std::size_t>(), summary["documents"].get<std::uint64_t>(),
                   summary["text_bytes"].get<std::uint64_t>());
        return;
    }
    fmt::print("format     {}\ndtype      {}\nshards     {}\ndocuments  {}\ntokens     {}\ndocuments  smallest {} / largest {} tokens\n",
               summary["format"].get<std::string>(), summary["dtype"].get<std::string>(), summary["shards"].get<std::size_t>(),
               summary["documents"].get<std::uint64_t>(), summary["tokens"].get<std::uint64_t>(),
               summary["smallest_document"].get<std::uint64_t>(), summary["largest_document"].get<std::uint64_t>());
    if (summary.contains("delimiter")) fmt::print("delimiter  {}\n", summary["delimiter"].get<std::uint32_t>());
    fmt::print("valid      yes{}\n", deep ? " (every token read)" : "");
}

// A mixture file: its stages (step, ramp, shares) and each domain's expected samples and tokens after
// o.steps steps (the mixer keeps every domain within one sample of these; sampling/mixer.hpp).
nlohmann::json inspect_mixture(const std::string& path, const inspect_options& o) {
    std::string text;
    {
        feedline::file f(path);
        if (f.size() > (std::uint64_t{256} << 20))
            throw feedline::config_error("--mixture", path + ": larger than 256 MiB, not a mixture file");
        text.resize(f.size());
        f.read_at(text.data(), text.size(), 0);
    }
    const feedline::mixture_file m = feedline::parse_mixture(text, path, o.global_batch * o.seq_len);
    const feedline::mixture_schedule& s = *m.schedule;
    nlohmann::json out{{"mixture", path},  {"domains", s.domains()},         {"names", s.names()},
                       {"steps", o.steps}, {"global_batch", o.global_batch}, {"seq_len", o.seq_len}};
    nlohmann::json stages = nlohmann::json::array();
    for (std::size_t k = 0; k < s.stages(); ++k) {
        const std::vector<double> own = s.stage_shares(k);  // what the stage ramps to, or holds
        nlohmann::json shares = nlohmann::json::object();
        for (std::size_t d = 0; d < s.domains(); ++d) shares[s.names()[d]] = own[d];
        stages.push_back({{"at_step", s.stage_step(k)}, {"ramp_steps", s.stage_ramp(k)}, {"shares", shares}});
    }
    out["stages"] = stages;
    if (o.steps == 0 || o.global_batch == 0 || o.seq_len == 0) return out;  // no run shape: the stages only
    const feedline::mixture_targets targets(m.schedule, o.global_batch);
    if (o.steps >= feedline::mixture_schedule::max_samples / o.global_batch)
        throw feedline::config_error("--steps", "steps x global batch past 2^48 samples");
    const std::uint64_t samples = o.steps * o.global_batch;
    nlohmann::json domains = nlohmann::json::array();
    for (std::size_t d = 0; d < s.domains(); ++d) {
        const double expected = targets.expected(d, samples);
        domains.push_back({{"name", s.names()[d]},
                           {"declared_at", m.declared_at[d]},
                           {"data", m.data[d]},
                           {"expected_samples", expected},
                           {"expected_tokens", expected * static_cast<double>(o.seq_len)}});
    }
    out["expected"] = domains;
    return out;
}

void print_mixture(const nlohmann::json& m) {
    fmt::print("mixture    {}: {} domains, {} stages\n", m["mixture"].get<std::string>(), m["domains"].get<std::size_t>(),
               m["stages"].size());
    for (const auto& st : m["stages"]) {
        fmt::print("stage      from step {}", st["at_step"].get<std::uint64_t>());
        if (st["ramp_steps"].get<std::uint64_t>() > 0) fmt::print(" (ramp over {} steps)", st["ramp_steps"].get<std::uint64_t>());
        std::string shares;
        std::size_t shown = 0;
        for (const auto& [name, share] : st["shares"].items())
            if (share.get<double>() > 0 && shown++ < 8) shares += fmt::format(" {} {:.4f}", name, share.get<double>());
        if (shown > 8) shares += fmt::format(" (+{} more)", shown - 8);
        fmt::print(":{}\n", shares);
    }
    if (!m.contains("expected")) {
        fmt::print("domains   ");
        for (std::size_t d = 0; d < m["names"].size() && d < 8; ++d) fmt::print(" {}", m["names"][d].get<std::string>());
        if (m["names"].size() > 8) fmt::print(" (+{} more)", m["names"].size() - 8);
        fmt::print("\n(give --steps, --global-batch and --seq-len for each domain's expected samples and tokens)\n");
        return;
    }
    fmt::print("over       {} steps of {} x {}: expected samples and tokens per domain (each within one sample)\n",
               m["steps"].get<std::uint64_t>(), m["global_batch"].get<std::uint64_t>(), m["seq_len"].get<std::uint64_t>());
    for (const auto& d : m["expected"])
        fmt::print("  {:<20} {:>16.1f} samples {:>20.0f} tokens\n", d["name"].get<std::string>(), d["expected_samples"].get<double>(),
                   d["expected_tokens"].get<double>());
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "Validate and summarise a feedline token dataset (Megatron .bin/.idx or llm.c shards), each dataset of a blend, or a tokenizer "
        "model (a sentencepiece .model or a tokenizer.json)"};
    std::vector<std::string> paths;
    inspect_options o;
    app.add_option("paths", paths,
                   "Megatron prefixes, llm.c shards, directories or globs (one dataset), or one blend in Megatron's --data-path form: "
                   "\"0.7 data/web 0.3 code/*.jsonl\" (each dataset inspected on its own)")
        ->required();
    app.add_flag("--json", o.json, "print the summary as one JSON object (a blend: an array, one object per dataset with its weight)");
    app.add_flag("--dump-tokens", o.dump, "write every token as little-endian uint32 to stdout (no summary)");
    app.add_flag("--deep", o.deep, "also read every token through the storage backend");
    feedline::pipeline_config read_with;  // --io-backend (or --backend): how --deep and --dump-tokens read
    tools::add_pipeline_options(app, read_with, {.only = {"io_backend"}, .aliases = {{"io_backend", "--backend"}}});
    app.add_option("--delimiter", o.delimiter,
                   "llm.c or raw document delimiter token (default: from the llm.c header; raw: 50256 for uint16, else 128001)");
    app.add_flag("--mixture", o.mixture,
                 "the path is a mixture file (JSON: domains and stages of weights; recognised without this flag too): print its stages "
                 "and, given the run's shape, each domain's expected samples and tokens over --steps steps");
    app.add_option("--steps", o.steps, "with a mixture file: the run's length in steps")
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
    app.add_option("--global-batch", o.global_batch, "with a mixture file: samples per step, over all ranks")
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
    app.add_option("--seq-len", o.seq_len, "with a mixture file: tokens per sample (also turns a stage's at_tokens into a step)")
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
    if (const int code = tools::parse_command_line("feedline-inspect", 1, app, argc, argv); code >= 0) return code;
    o.backend = read_with.shards.backend;

    return tools::run_tool("feedline-inspect", 1, [&] {
        // A mixture file is recognised by its content ("domains" and "stages"), with or without --mixture:
        // before, a .json was taken for a tokenizer.json. The run's shape adds each domain's expectations.
        if (!o.mixture && paths.size() == 1 && feedline::detail::mixture_text({{1.0, paths[0]}})) o.mixture = true;
        if (o.mixture) {
            if (paths.size() != 1) throw feedline::config_error("--mixture", "give one mixture file");
            const bool shape = o.steps > 0 && o.global_batch > 0 && o.seq_len > 0;
            if (!shape && (o.steps > 0 || o.global_batch > 0 || o.seq_len > 0))
                throw feedline::config_error("--mixture", "give the run's whole shape: --steps, --global-batch and --seq-len");
            const nlohmann::json m = inspect_mixture(paths[0], o);
            if (o.json)
                fmt::print("{}\n", tools::json_text(m));
            else
                print_mixture(m);
            return 0;
        }
        const auto blend = paths.size() == 1 ? feedline::parse_data_spec(paths[0]) : std::vector<feedline::weighted_spec>{};
        if (blend.size() <= 1) {
            // One JSONL/text dataset is inspected as text (parsed line by line), not read as shards.
            const bool text = paths.size() == 1 && feedline::detect_source(paths[0]) == feedline::source_kind::text;
            if (text && o.dump)
                throw feedline::config_error("--dump-tokens",
                                             paths[0] + " is JSONL/text: tokens exist only once it is tokenized (feedline-pack)");
            const bool model = paths.size() == 1 && is_model_file(paths[0]);
            if (model && o.dump) throw feedline::config_error("--dump-tokens", paths[0] + " is a tokenizer model, not a token dataset");
            const bool json_model = model && paths[0].ends_with(".json");
            const nlohmann::json summary = json_model ? inspect_tokenizer_json(paths[0])
                                           : model    ? inspect_model(paths[0])
                                           : text     ? inspect_text(paths[0])
                                                      : inspect_shards(paths, o);
            if (o.dump) return std::fflush(stdout) == 0 ? 0 : 1;
            if (o.json)
                fmt::print("{}\n", tools::json_text(summary));
            else
                print(summary, o.deep);
            return 0;
        }
        if (o.dump) throw feedline::config_error("--dump-tokens", "give one dataset, not a blend");
        nlohmann::json all = nlohmann::json::array();
        for (const auto& w : blend) {
            nlohmann::json summary =
                feedline::detect_source(w.spec) == feedline::source_kind::text ? inspect_text(w.spec) : inspect_shards({w.spec}, o);
            summary["weight"] = w.weight;
            summary["spec"] = w.spec;
            if (!o.json) {
                fmt::print("== {} (weight {})\n", w.spec, w.weight);
                print(summary, o.deep);
            }
            all.push_back(std::move(summary));
        }
        if (o.json) fmt::print("{}\n", tools::json_text(all));
        return 0;
    });
}
