// feedline/transform/unigram_tokenizer.hpp: the "feedline" tokenizer kind, feedline's own encoder for
// sentencepiece Unigram models (transform/unigram_encoder.hpp), with libsentencepiece's ids and without
// the library. Registered after "sentencepiece" (transform/tokenizers.hpp): kind "auto" keeps the
// library where the build has it and takes this encoder where it does not; `--tokenizer-kind feedline`
// asks for it by name. A model it does not reproduce (BPE so far) is a config_error saying why.
// The model's tables are built once per process and model file and shared by every thread's tokenizer.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/transform/sentencepiece_model.hpp>
#include <feedline/transform/tokenizer.hpp>
#include <feedline/transform/unigram_encoder.hpp>

namespace feedline {

class unigram_tokenizer final : public tokenizer {
public:
    // The longest text the encoder is given at once: its lattice positions are 32-bit, as
    // sentencepiece's are, and normalization can lengthen text several times.
    static constexpr std::uint64_t max_piece_bytes = std::uint64_t(64) << 20;

    // Loads the model. Throws config_error naming `field` when it cannot be read, is not a Unigram
    // model this encoder reproduces (the reason said), or lacks a BOS/EOS piece that is asked for.
    explicit unigram_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") : options_(o) {
        const std::string bytes = detail::read_model_file(o.model, field);
        const std::string checksum = detail::model_checksum(bytes);
        model_ = shared_model(checksum, bytes);
        if (!model_->problem.empty()) throw config_error(field, o.model + ": " + model_->problem);
        encoder_.emplace(model_);
        exact_pieces_ = detail::splits_at_spaces(detail::read_sentencepiece_model(bytes));
        identity_ = "feedline-unigram 1 model " + checksum + " bos " + std::to_string(o.add_bos) + " eos " + std::to_string(o.add_eos);
        if (o.add_bos && model_->bos_id < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && model_->eos_id < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }

    std::string_view kind() const noexcept override { return "feedline"; }
    std::string identity() const override { return identity_; }
    int vocab_size() const override { return static_cast<int>(model_->scores.size()); }
    int bos_id() const override { return model_->bos_id; }
    int eos_id() const override { return model_->eos_id; }
    bool pieces_are_exact() const noexcept { return exact_pieces_; }
    // Memory: the model's tables (shared by the process's tokenizers of this model) and this one's buffers.
    std::size_t model_bytes() const noexcept { return model_->memory_bytes(); }
    std::size_t buffer_bytes() const noexcept { return encoder_->buffer_bytes(); }
    const detail::unigram_encoder& encoder() const noexcept { return *encoder_; }  // its word cache's counts

    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) override {
        out.clear();
        if (options_.add_bos) out.push_back(model_->bos_id);
        if (auto problem = detail::encode_in_pieces(text, options_, exact_pieces_, cancel,
                                                    [&](std::string_view piece) -> std::string {
                                                        if (piece.size() > max_piece_bytes)
                                                            return "a text of " + std::to_string(piece.size()) +
                                                                   " bytes is longer than the " + std::to_string(max_piece_bytes) +
                                                                   " the encoder takes at once";
                                                        encoder_->encode(piece, out);
                                                        return {};
                                                    });
            !problem.empty())
            return problem;
        if (options_.add_eos) out.push_back(model_->eos_id);
        return {};
    }

private:
    // One model's tables per process while a tokenizer of it lives, whatever thread made it.
    static std::shared_ptr<const detail::unigram_model> shared_model(const std::string& checksum, const std::string& bytes) {
        static std::mutex lock;
        static std::map<std::string, std::weak_ptr<const detail::unigram_model>> models;
        std::lock_guard hold(lock);
        if (auto kept = models[checksum].lock()) return kept;
        auto made = std::make_shared<const detail::unigram_model>(detail::read_sentencepiece_model(bytes));
        models[checksum] = made;
        return made;
    }

    tokenizer_options options_;
    std::shared_ptr<const detail::unigram_model> model_;
    std::optional<detail::unigram_encoder> encoder_;
    bool exact_pieces_ = false;
    std::string identity_;
};

namespace detail {
// Registered as "feedline"; with kind "auto" it takes a model that looks like a sentencepiece model
// when no kind registered before it (libsentencepiece's) did.
inline const bool unigram_registered =
    tokenizer_registry::add({.name = "feedline",
                             .recognizes = [](const std::string& model) { return detail::looks_like_sentencepiece(model); },
                             .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
                                 return std::make_unique<unigram_tokenizer>(o, field);
                             }});
}  // namespace detail

}  // namespace feedline
