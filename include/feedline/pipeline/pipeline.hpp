// feedline/pipeline/pipeline.hpp: feedline::pipeline, the one entry point. open_dataset() looks at a
// spec and opens what it names: token shards (Megatron prefix, llm.c shards) or raw text (JSONL / text
// files, a directory or a glob of them, tokenized on the fly with config.tokenizer). The pipeline then
// runs a token_pipeline or a text_pipeline behind the same range of batches, stats and state, so a
// trainer switches between pre-tokenized shards and raw text by changing only the spec.
#pragma once

#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <feedline/format/dataset.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/pipeline/text_pipeline.hpp>
#include <feedline/pipeline/token_pipeline.hpp>
#include <feedline/sampling/state_io.hpp>

namespace feedline {

enum class source_kind { tokens, text };

// What a spec names, by its files: text when it names at least one JSONL / text file (.jsonl, .json,
// .ndjson, .txt, .text) and no shard (.idx, .bin); tokens otherwise (a spec that matches nothing is
// left to the token dataset, whose io_error names it).
inline source_kind detect_source(const std::string& spec) {
    if (detail::path_exists(spec + ".idx")) return source_kind::tokens;
    std::vector<std::string> files;
    std::error_code ec;
    if (detail::has_glob_chars(spec)) {
        files = detail::glob_paths(spec);
    } else if (std::filesystem::is_directory(spec, ec)) {
        for (const auto& e : std::filesystem::directory_iterator(spec, ec))
            if (e.is_regular_file(ec)) files.push_back(e.path().string());
    } else {
        files.push_back(spec);
    }
    bool text = false;
    for (const auto& f : files) {
        if (detail::ends_with(f, ".idx") || detail::ends_with(f, ".bin")) return source_kind::tokens;
        for (std::string_view ext : {".jsonl", ".json", ".ndjson", ".txt", ".text"}) text = text || detail::ends_with(f, ext);
    }
    return text ? source_kind::text : source_kind::tokens;
}

// An opened dataset: token shards or a text corpus (exactly one is set). Shareable between pipelines
// (a training and an evaluation pipeline over the same files open them once).
struct dataset_source {
    std::shared_ptr<const token_dataset> tokens;
    std::shared_ptr<const text_corpus> text;
    source_kind kind() const noexcept { return text ? source_kind::text : source_kind::tokens; }
};

// Opens whatever the spec names (detect_source). Text is indexed here (one scan, 24 bytes per
// document), not tokenized. Throws io_error / format_error naming the file.
inline dataset_source open_dataset(const std::string& spec, text_options text = {}) {
    if (detect_source(spec) == source_kind::text) return {nullptr, std::make_shared<const text_corpus>(std::vector<std::string>{spec}, std::move(text))};
    return {std::make_shared<const token_dataset>(spec), nullptr};
}

// Where a pipeline is, for either kind of data; to_json / pipeline_state_from_json below.
using pipeline_state = std::variant<sampler_state, text_state>;

#if FEEDLINE_HAS_JSON
inline std::string to_json(const pipeline_state& s) {
    return std::visit([](const auto& v) { return to_json(v); }, s);
}

// Either kind of saved state, told apart by its "format" field. Throws format_error otherwise.
inline pipeline_state pipeline_state_from_json(const std::string& text) {
    if (detail::json_format_of(nlohmann::json::parse(text, nullptr, false)) == "feedline.text_state") return text_state_from_json(text);
    return sampler_state_from_json(text);
}
#endif

class pipeline {
public:
    // spec: a Megatron prefix, llm.c shards, or JSONL / text files (a file, directory or glob; needs
    // config.tokenizer). `text` says how text files split into documents. Throws config_error,
    // io_error, format_error before any thread starts.
    pipeline(const std::string& spec, pipeline_config config, text_options text = {})
        : pipeline(open_dataset(spec, std::move(text)), std::move(config)) {}
    pipeline(std::shared_ptr<const token_dataset> data, pipeline_config config) : pipeline(dataset_source{std::move(data), nullptr}, std::move(config)) {}
    pipeline(std::shared_ptr<const text_corpus> corpus, pipeline_config config) : pipeline(dataset_source{nullptr, std::move(corpus)}, std::move(config)) {}
    pipeline(dataset_source source, pipeline_config config) {
        if (source.text)
            text_ = std::make_unique<text_pipeline>(std::move(source.text), std::move(config));
        else if (source.tokens)
            tokens_ = std::make_unique<token_pipeline>(std::move(source.tokens), std::move(config));
        else
            throw config_error("dataset", "no dataset given");
    }

    source_kind kind() const noexcept { return text_ ? source_kind::text : source_kind::tokens; }
    // The pipeline underneath, for what only one kind has (null for the other kind).
    token_pipeline* tokens() noexcept { return tokens_.get(); }
    text_pipeline* text() noexcept { return text_.get(); }
    // A one-line description of the data: shards and tokens, or text files and documents.
    std::string describe() const {
        if (tokens_) return std::to_string(tokens_->dataset().total_tokens()) + " tokens in shards";
        return std::to_string(text_->corpus().document_count()) + " text documents (" + std::to_string(text_->corpus().text_bytes()) +
               " bytes), tokenized on the fly";
    }

    // The next step's batch, in order; empty after max_steps. Rethrows a worker's error (format_error
    // naming file and offset), after which the pipeline is stopped.
    std::optional<batch> next() { return tokens_ ? tokens_->next() : text_->next(); }

    // Where the trainer is: restoring it continues with the batch after the last one returned.
    pipeline_state state() const { return tokens_ ? pipeline_state(tokens_->state()) : pipeline_state(text_->state()); }
    // Only before the first next(). Throws config_error when the state is for the other kind of data
    // or another shape.
    void restore(const pipeline_state& s) {
        if (tokens_ && std::holds_alternative<sampler_state>(s)) return tokens_->restore(std::get<sampler_state>(s));
        if (text_ && std::holds_alternative<text_state>(s)) return text_->restore(std::get<text_state>(s));
        throw config_error("state", std::string("saved by a ") + (std::holds_alternative<text_state>(s) ? "text" : "token-shard") +
                                        " pipeline; this one reads " + (text_ ? "text" : "token shards"));
    }

    pipeline_stats stats() const { return tokens_ ? tokens_->stats() : text_->stats(); }
    const pipeline_config& config() const noexcept { return tokens_ ? tokens_->config() : text_->config(); }
    const memory_plan& memory() const noexcept { return tokens_ ? tokens_->memory() : text_->memory(); }
    int rank() const noexcept { return tokens_ ? tokens_->rank() : text_->rank(); }
    int world_size() const noexcept { return tokens_ ? tokens_->world_size() : text_->world_size(); }
    unsigned active_workers() const noexcept { return tokens_ ? tokens_->active_workers() : text_->active_workers(); }
    std::size_t prefetch_depth() const noexcept { return tokens_ ? tokens_->prefetch_depth() : text_->prefetch_depth(); }
    // Workers stop and join; batches not taken are dropped. Idempotent.
    void stop() noexcept { tokens_ ? tokens_->stop() : text_->stop(); }

    // Range-for over batches: for (auto& b : pipeline) { ... }. Ends after max_steps (or never).
    using iterator = batch_iterator<pipeline>;
    iterator begin() { return iterator(this); }
    std::default_sentinel_t end() { return {}; }

private:
    std::unique_ptr<token_pipeline> tokens_;
    std::unique_ptr<text_pipeline> text_;
};

}  // namespace feedline
