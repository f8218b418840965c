// feedline/transform/feedline_tokenizer.hpp: the "feedline" tokenizer kind, feedline's own encoders for
// sentencepiece models (Unigram: transform/unigram_encoder.hpp; BPE: transform/bpe_encoder.hpp), with
// libsentencepiece's ids and without the library. Registered first (transform/tokenizers.hpp), so kind
// "auto" takes it for every model it reproduces; for one it does not (a word or char model, a model
// the library fails on) "auto" hands over to libsentencepiece where the build has it, and the
// tokenizer it returns says why (chosen_because); `kind feedline` refuses such a model, saying why.
// The model's tables are built once per process and model file and shared by every thread's tokenizer.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/transform/bpe_encoder.hpp>
#include <feedline/transform/sentencepiece_model.hpp>
#include <feedline/transform/sentencepiece_pieces.hpp>
#include <feedline/transform/tokenizer.hpp>
#include <feedline/transform/unigram_encoder.hpp>

namespace feedline {

class feedline_tokenizer final : public tokenizer {
public:
    // The longest text the encoder is given at once: its positions are 32-bit, as sentencepiece's
    // are, and normalization can lengthen text several times.
    static constexpr std::uint64_t max_piece_bytes = std::uint64_t(64) << 20;

    // The model's shared tables (their `problem` says why this encoder does not reproduce it), or
    // config_error naming `field` when the file cannot be read.
    static std::shared_ptr<const detail::sentencepiece_pieces> load(const std::string& model, const std::string& field) {
        const std::string bytes = detail::read_model_file(model, field);
        return shared_model(detail::model_checksum(bytes), bytes);
    }

    // Loads the model. Throws config_error naming `field` when it cannot be read, is not a model this
    // encoder reproduces (the reason said), or lacks a BOS/EOS piece that is asked for.
    explicit feedline_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer")
            : feedline_tokenizer(o, field, load(o.model, field)) {}
    feedline_tokenizer(const tokenizer_options& o, const std::string& field, std::shared_ptr<const detail::sentencepiece_pieces> model)
            : options_(o), model_(checked(std::move(model), o, field)), encoder_(make_encoder(model_)) {
        exact_pieces_ = model_->splits_at_spaces && model_->cuts_at_spaces;
        identity_ = std::string(model_->unigram() ? "feedline-unigram 1" : "feedline-bpe 1") + " model " + model_->checksum + " bos " +
                    std::to_string(o.add_bos) + " eos " + std::to_string(o.add_eos);
        if (o.add_bos && model_->bos_id < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && model_->eos_id < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }

    std::string_view kind() const noexcept override { return "feedline"; }
    std::string describe() const override { return std::string("feedline's ") + model_->type_name() + " encoder"; }
    std::string identity() const override { return identity_; }
    int vocab_size() const override { return static_cast<int>(model_->scores.size()); }
    int bos_id() const override { return model_->bos_id; }
    int eos_id() const override { return model_->eos_id; }
    bool pieces_are_exact() const noexcept { return exact_pieces_; }
    const detail::sentencepiece_pieces& model() const noexcept { return *model_; }
    // Memory: the model's tables (shared by the process's tokenizers of this model) and this one's buffers.
    std::size_t model_bytes() const noexcept { return model_->memory_bytes(); }
    std::size_t buffer_bytes() const noexcept {
        return std::visit([](const auto& e) { return e.buffer_bytes(); }, encoder_);
    }
    // Words found in this tokenizer's cache, and words merged or walked.
    std::uint64_t cache_hits() const noexcept {
        return std::visit([](const auto& e) { return e.cache_hits(); }, encoder_);
    }
    std::uint64_t cache_misses() const noexcept {
        return std::visit([](const auto& e) { return e.cache_misses(); }, encoder_);
    }
    // Unigram: cached words walked again, the running score too large to trust the cached walk.
    std::uint64_t cache_rewalks() const noexcept {
        const auto* unigram = std::get_if<detail::unigram_encoder>(&encoder_);
        return unigram ? unigram->cache_rewalks() : 0;
    }

    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) override {
        out.clear();
        if (options_.add_bos) out.push_back(model_->bos_id);
        if (auto problem = detail::encode_in_pieces(text, options_, exact_pieces_, cancel,
                                                    [&](std::string_view piece) -> std::string {
                                                        if (piece.size() > max_piece_bytes)
                                                            return "a text of " + std::to_string(piece.size()) +
                                                                   " bytes is longer than the " + std::to_string(max_piece_bytes) +
                                                                   " the encoder takes at once";
                                                        std::visit([&](auto& e) { e.encode(piece, out); }, encoder_);
                                                        return {};
                                                    });
            !problem.empty())
            return problem;
        if (options_.add_eos) out.push_back(model_->eos_id);
        return {};
    }

private:
    using encoder = std::variant<detail::unigram_encoder, detail::bpe_encoder>;
    static std::shared_ptr<const detail::sentencepiece_pieces> checked(std::shared_ptr<const detail::sentencepiece_pieces> model,
                                                                       const tokenizer_options& o, const std::string& field) {
        if (!model->problem.empty()) throw config_error(field, o.model + ": " + model->problem);
        return model;
    }
    static encoder make_encoder(const std::shared_ptr<const detail::sentencepiece_pieces>& model) {
        if (model->unigram()) return encoder(std::in_place_type<detail::unigram_encoder>, model);
        return encoder(std::in_place_type<detail::bpe_encoder>, model);
    }

    // One model's tables per process while a tokenizer of it lives, whatever thread made it.
    static std::shared_ptr<const detail::sentencepiece_pieces> shared_model(const std::string& checksum, const std::string& bytes) {
        static std::mutex lock;
        static std::map<std::string, std::weak_ptr<const detail::sentencepiece_pieces>> models;
        std::lock_guard hold(lock);
        if (auto kept = models[checksum].lock()) return kept;
        auto made = std::make_shared<detail::sentencepiece_pieces>(detail::read_sentencepiece_model(bytes));
        made->checksum = checksum;
        models[checksum] = made;
        return made;
    }

    tokenizer_options options_;
    std::shared_ptr<const detail::sentencepiece_pieces> model_;
    encoder encoder_;
    bool exact_pieces_ = false;
    std::string identity_;
};

namespace detail {
// Registered as "feedline", first: kind "auto" takes it for a model that looks like a sentencepiece
// model, and hands a model it does not reproduce to the next kind that recognizes it (libsentencepiece's),
// saying why; with no such kind the reason is the error.
inline const bool feedline_registered = tokenizer_registry::add(
    {.name = "feedline",
     .recognizes = [](const std::string& model) { return detail::looks_like_sentencepiece(model); },
     .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
         auto model = feedline_tokenizer::load(o.model, field);
         if (!model->problem.empty() && o.kind == "auto")
             for (const auto& k : tokenizer_registry::entries())
                 if (k->name != "feedline" && k->recognizes(o.model)) {
                     auto other = k->make(o, field);
                     other->set_chosen_because("feedline's encoder does not reproduce this model: " + model->problem);
                     return other;
                 }
         return std::make_unique<feedline_tokenizer>(o, field, std::move(model));
     }});
}  // namespace detail

}  // namespace feedline
