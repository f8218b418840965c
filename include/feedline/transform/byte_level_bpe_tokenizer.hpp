// feedline/transform/byte_level_bpe_tokenizer.hpp: the "byte-level-bpe" tokenizer kind: a tokenizer.json
// (GPT-2, Llama-3 style) encoded by feedline (transform/byte_level_bpe.hpp) with the `tokenizers`
// package's ids. Kind "auto" takes it for a model file that is a JSON object. BOS/EOS are the model's
// special tokens by the usual names (tokenizer_json.hpp); a model without one refuses add_bos/add_eos.
// The model's tables are built once per process and model file and shared by every thread's tokenizer.
// Needs PCRE2 and nlohmann_json; without them the kind is absent and a tokenizer.json is refused with
// that reason.
#pragma once

#include <string>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/transform/tokenizer.hpp>

#if FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON

#include <map>
#include <memory>
#include <mutex>

#include <feedline/error.hpp>
#include <feedline/transform/byte_level_bpe.hpp>
#include <feedline/transform/sentencepiece_model.hpp>  // read_model_file, model_checksum
#include <feedline/transform/tokenizer_json.hpp>

#endif

namespace feedline {

namespace detail {
// Does `model` look like a tokenizer.json: a regular file whose first byte that is not white space is
// '{'. Never blocks.
inline bool looks_like_tokenizer_json(const std::string& model) {
    const auto head = regular_file_head(model, 64);
    if (!head) return false;
    for (const char c : *head)
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return c == '{';
    return false;
}
}  // namespace detail

#if FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON

class byte_level_bpe_tokenizer final : public tokenizer {
public:
    // The model's shared tables; config_error naming `field` when the file cannot be read or is not a
    // byte-level BPE tokenizer.json feedline reproduces (the reason said).
    static std::shared_ptr<const detail::byte_level_bpe_model> load(const std::string& model, const std::string& field) {
        const std::string bytes = detail::read_model_file(model, field);
        const std::string checksum = detail::model_checksum(bytes);
        static std::mutex lock;
        static std::map<std::string, std::weak_ptr<const detail::byte_level_bpe_model>> models;
        std::lock_guard hold(lock);
        if (auto kept = models[checksum].lock()) return kept;
        auto made = std::make_shared<detail::byte_level_bpe_model>(detail::read_tokenizer_json(bytes, model, field));
        made->checksum = checksum;
        models[checksum] = made;
        return made;
    }

    explicit byte_level_bpe_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer")
            : options_(o), model_(load(o.model, field)), encoder_(model_, o.max_unsplit_bytes) {
        identity_ =
            "byte-level-bpe 1 model " + model_->checksum + " bos " + std::to_string(o.add_bos) + " eos " + std::to_string(o.add_eos);
        if (o.add_bos && model_->bos_id < 0)
            throw config_error("text.add_bos",
                               o.model + " has no BOS token (none of <|begin_of_text|>, <s>, <bos>, nor the post-processor's first)");
        if (o.add_eos && model_->eos_id < 0)
            throw config_error("text.add_eos", o.model + " has no EOS token (none of <|endoftext|>, <|end_of_text|>, </s>, <eos>)");
    }

    std::string_view kind() const noexcept override { return "byte-level-bpe"; }
    std::string describe() const override { return "feedline's byte-level BPE encoder"; }
    std::string identity() const override { return identity_; }
    int vocab_size() const override { return model_->vocab_size; }
    int bos_id() const override { return model_->bos_id; }
    int eos_id() const override { return model_->eos_id; }
    const detail::byte_level_bpe_model& model() const noexcept { return *model_; }
    std::size_t model_bytes() const noexcept { return model_->memory_bytes(); }
    std::size_t buffer_bytes() const noexcept { return encoder_.buffer_bytes(); }
    std::uint64_t cache_hits() const noexcept { return encoder_.cache_hits(); }
    std::uint64_t cache_misses() const noexcept { return encoder_.cache_misses(); }

    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) override {
        out.clear();
        if (options_.add_bos) out.push_back(model_->bos_id);
        if (auto problem = encoder_.encode(text, out, cancel); !problem.empty()) return problem;
        if (options_.add_eos) out.push_back(model_->eos_id);
        return {};
    }

private:
    tokenizer_options options_;
    std::shared_ptr<const detail::byte_level_bpe_model> model_;
    detail::byte_level_bpe_encoder encoder_;
    std::string identity_;
};

namespace detail {
inline const bool byte_level_bpe_registered =
    tokenizer_registry::add({.name = "byte-level-bpe",
                             .recognizes = [](const std::string& model) { return looks_like_tokenizer_json(model); },
                             .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
                                 return std::make_unique<byte_level_bpe_tokenizer>(o, field);
                             }});
}  // namespace detail

#else

namespace detail {
inline constexpr const char* byte_level_bpe_missing =
#if FEEDLINE_HAS_JSON
    "PCRE2; install libpcre2-dev";
#else
    "nlohmann_json; install nlohmann-json3-dev";
#endif
// Without PCRE2 or nlohmann_json a tokenizer.json is still recognized, and refused saying why.
inline const bool byte_level_bpe_registered = tokenizer_registry::add(
    {.name = "byte-level-bpe",
     .recognizes = [](const std::string& model) { return looks_like_tokenizer_json(model); },
     .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
         throw config_error(field, o.model + ": this build of feedline reads no tokenizer.json (it was configured without " +
                                       std::string(byte_level_bpe_missing) + " and build again)");
     }});
}  // namespace detail

#endif  // FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON

}  // namespace feedline
