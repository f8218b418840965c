// feedline/transform/tokenizer.hpp: text to token ids with a sentencepiece model, one instance per
// thread (sentencepiece does not document its processor as thread-safe, and a processor per worker
// keeps its buffers on that worker's NUMA node). Adds the model's BOS before and EOS after every
// document when asked, as feedline-pack does, so ids equal `spm_encode --output_format=id` plus those.
// Used by the text source's workers (pipeline/text_source.hpp), its token-length pass, and
// transform/tokenize_in_order.hpp (feedline-pack).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#if FEEDLINE_HAS_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include <feedline/error.hpp>

namespace feedline {

// What to tokenize with and what to add around each document.
struct tokenizer_options {
    std::string model;  // a sentencepiece .model file
    bool add_bos = false, add_eos = true;
};

#if FEEDLINE_HAS_SENTENCEPIECE
class tokenizer {
public:
    // Loads the model. Throws config_error naming `field` (the config field that named the model)
    // when it cannot be loaded or lacks a BOS/EOS piece that is asked for.
    explicit tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") : options_(o) {
        if (o.model.empty()) throw config_error(field, "text input needs a sentencepiece model");
        if (auto st = spm_.Load(o.model); !st.ok()) throw config_error(field, o.model + ": " + st.ToString());
        if (o.add_bos && spm_.bos_id() < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && spm_.eos_id() < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }
    tokenizer(const tokenizer&) = delete;
    tokenizer& operator=(const tokenizer&) = delete;

    int vocab_size() const { return spm_.GetPieceSize(); }
    int bos_id() const { return spm_.bos_id(); }  // -1: the model has none
    int eos_id() const { return spm_.eos_id(); }

    // Replaces `out` with the document's ids (BOS/EOS added as configured). Returns sentencepiece's
    // error text, empty on success. Allocates nothing once `out` and the internal buffer have grown.
    std::string encode(std::string_view text, std::vector<std::int32_t>& out) {
        out.clear();
        if (auto st = spm_.Encode(text, &ids_); !st.ok()) return st.ToString();
        out.reserve(ids_.size() + 2);
        if (options_.add_bos) out.push_back(spm_.bos_id());
        out.insert(out.end(), ids_.begin(), ids_.end());
        if (options_.add_eos) out.push_back(spm_.eos_id());
        return {};
    }

private:
    tokenizer_options options_;
    sentencepiece::SentencePieceProcessor spm_;
    std::vector<int> ids_;
};
#endif

}  // namespace feedline
