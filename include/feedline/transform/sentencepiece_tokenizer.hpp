// feedline/transform/sentencepiece_tokenizer.hpp: the tokenizer interface over libsentencepiece (the
// "sentencepiece" kind). The model is read by feedline (a regular file, bounded) and given to
// sentencepiece as bytes; what the model says about how it splits text is read from its protobuf, so a
// long document can be encoded in exact pieces. Ids equal `spm_encode --output_format=id` plus the
// BOS/EOS asked for. Registers itself; absent (and unregistered) without sentencepiece.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/transform/sentencepiece_model.hpp>
#include <feedline/transform/tokenizer.hpp>

#if FEEDLINE_HAS_SENTENCEPIECE
#include <sentencepiece_processor.h>

namespace feedline {

class sentencepiece_tokenizer final : public tokenizer {
public:
    // Loads the model. Throws config_error naming `field` (the config field that named the model)
    // when it cannot be loaded or lacks a BOS/EOS piece that is asked for.
    explicit sentencepiece_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") : options_(o) {
        const std::string bytes = detail::read_model_file(o.model, field);
        if (auto st = spm_.LoadFromSerializedProto(bytes); !st.ok())
            throw config_error(field, o.model + ": not a sentencepiece model (" + st.ToString() + ")");
        identity_ = "sentencepiece model " + detail::model_checksum(bytes) + " bos " + std::to_string(o.add_bos) + " eos " +
                    std::to_string(o.add_eos);
        exact_pieces_ = detail::splits_at_spaces(detail::read_sentencepiece_model(bytes));
        if (o.add_bos && spm_.bos_id() < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && spm_.eos_id() < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }
    sentencepiece_tokenizer(const sentencepiece_tokenizer&) = delete;
    sentencepiece_tokenizer& operator=(const sentencepiece_tokenizer&) = delete;

    std::string_view kind() const noexcept override { return "sentencepiece"; }
    std::string describe() const override { return "libsentencepiece"; }
    std::string identity() const override { return identity_; }
    int vocab_size() const override { return spm_.GetPieceSize(); }
    int bos_id() const override { return spm_.bos_id(); }
    int eos_id() const override { return spm_.eos_id(); }
    // Whether a long document may be encoded a piece at a time with the same ids as whole
    // (detail::splits_at_spaces).
    bool pieces_are_exact() const noexcept { return exact_pieces_; }

    // Replaces `out` with the document's ids (BOS/EOS added as configured). Returns an error text
    // (sentencepiece's, or why the document is too long to encode in bounded memory), empty on
    // success. A document longer than piece_bytes is encoded in pieces split before a space
    // (detail::encode_in_pieces). Allocates nothing once `out` and the buffers have grown.
    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) override {
        out.clear();
        if (options_.add_bos) out.push_back(spm_.bos_id());
        if (auto problem = detail::encode_in_pieces(text, options_, exact_pieces_, cancel,
                                                    [&](std::string_view piece) { return encode_piece(piece, out); });
            !problem.empty())
            return problem;
        if (options_.add_eos) out.push_back(spm_.eos_id());
        return {};
    }

private:
    std::string encode_piece(std::string_view text, std::vector<std::int32_t>& out) {
        if (auto st = spm_.Encode(text, &ids_); !st.ok()) return st.ToString();
        out.insert(out.end(), ids_.begin(), ids_.end());
        return {};
    }

    tokenizer_options options_;
    sentencepiece::SentencePieceProcessor spm_;
    std::vector<int> ids_;
    bool exact_pieces_ = false;
    std::string identity_;
};

namespace detail {
// Registered as "sentencepiece"; with kind "auto" it takes a model that looks like one.
inline const bool sentencepiece_registered =
    tokenizer_registry::add({.name = "sentencepiece",
                             .recognizes = [](const std::string& model) { return detail::looks_like_sentencepiece(model); },
                             .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
                                 return std::make_unique<sentencepiece_tokenizer>(o, field);
                             }});

}  // namespace detail

}  // namespace feedline
#endif
