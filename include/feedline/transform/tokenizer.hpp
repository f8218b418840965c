// feedline/transform/tokenizer.hpp: text to token ids, behind one interface, whatever does the encoding.
// A tokenizer is made per thread (make_tokenizer): implementations need not be thread-safe, and one per
// worker keeps its buffers on that worker's NUMA node. Implementations register themselves with the
// tokenizer registry under a kind name ("sentencepiece"); a model file picks its kind by itself (kind
// "auto") or is given one. Adding a tokenizer is one new header that registers itself, plus its
// #include line in transform/tokenizers.hpp (docs/architecture.md, "Adding a tokenizer").
// Used by the text source's workers (pipeline/text_source.hpp), its token-length pass, and
// transform/tokenize_in_order.hpp (feedline-pack).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/detail/registry.hpp>
#include <feedline/error.hpp>

namespace feedline {

// What to tokenize with and what to add around each document.
struct tokenizer_options {
    std::string model;          // the model file (a sentencepiece .model, ...)
    std::string kind = "auto";  // a registered kind ("sentencepiece"), or "auto": the first that recognizes the model
    bool add_bos = false, add_eos = true;
    // Documents longer than this are encoded a piece at a time where the tokenizer can do so exactly
    // (sentencepiece: split before a space; see sentencepiece_tokenizer): encoders take memory in
    // proportion to the text they are given (sentencepiece ~110x), so this bounds one tokenizer's.
    std::uint64_t piece_bytes = std::uint64_t(1) << 20;
    // The longest text given to the encoder at once: a document that cannot be split exactly, or a
    // run that has no split point, longer than this is refused.
    std::uint64_t max_unsplit_bytes = std::uint64_t(8) << 20;
};

// One encoder. Not thread-safe: make one per thread.
class tokenizer {
public:
    virtual ~tokenizer() = default;

    // The kind that made it ("sentencepiece").
    virtual std::string_view kind() const noexcept = 0;
    // What encodes, in words, for stats and tools ("feedline's Unigram encoder").
    virtual std::string describe() const { return std::string(kind()); }
    // Why kind "auto" chose this tokenizer where another kind came first ("feedline's encoder does not
    // reproduce this model: ..."); empty otherwise.
    const std::string& chosen_because() const noexcept { return chosen_because_; }
    void set_chosen_because(std::string why) { chosen_because_ = std::move(why); }
    // What its ids depend on, for caches and stats: the kind, its version and the model's contents
    // (a checksum), and the options that change ids. Two tokenizers with one identity give the same ids.
    virtual std::string identity() const = 0;
    virtual int vocab_size() const = 0;
    virtual int bos_id() const = 0;  // -1: the model has none
    virtual int eos_id() const = 0;

    // Replaces `out` with one document's ids (BOS/EOS added as configured). Returns an error text (the
    // encoder's, or why the document is too long to encode in bounded memory), empty on success.
    // `cancel`, when given and set, stops a long document between pieces ("interrupted").
    virtual std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) = 0;

    // Several documents: out[i] gets texts[i]'s ids. Returns the first error with its document's
    // position ("document 3: ..."), empty on success. Encoders that batch better override it.
    virtual std::string encode_batch(std::span<const std::string> texts, std::vector<std::vector<std::int32_t>>& out,
                                     const std::atomic<bool>* cancel = nullptr) {
        out.resize(texts.size());
        for (std::size_t i = 0; i < texts.size(); ++i)
            if (std::string problem = encode(texts[i], out[i], cancel); !problem.empty())
                return "document " + std::to_string(i) + ": " + problem;
        return {};
    }

private:
    std::string chosen_because_;
};

namespace detail {

// Encodes `text` with `encode_piece` (std::string(std::string_view), an error text or empty), bounding
// what one call is given: a text longer than o.piece_bytes goes in pieces split before a space when
// `exact` (the model splits there anyway, so the ids equal the whole text's: splits_at_spaces in
// transform/sentencepiece_model.hpp), and is refused past o.max_unsplit_bytes otherwise. `cancel`,
// when given and set, stops between pieces ("interrupted").
template <class EncodePiece>
std::string encode_in_pieces(std::string_view text, const tokenizer_options& o, bool exact, const std::atomic<bool>* cancel,
                             EncodePiece&& encode_piece) {
    if (text.size() <= o.piece_bytes) return encode_piece(text);
    if (!exact) {
        if (text.size() > o.max_unsplit_bytes)
            return "a document of " + std::to_string(text.size()) + " bytes is longer than the " + std::to_string(o.max_unsplit_bytes) +
                   " this model may be given at once (its normalizer or a user-defined symbol keeps it from being split exactly at "
                   "spaces)";
        return encode_piece(text);
    }
    for (std::size_t start = 0; start < text.size();) {
        std::size_t end = text.size();
        if (text.size() - start > o.piece_bytes) {
            // Before the last space within the piece, else the first one after it.
            std::size_t at = text.rfind(' ', start + o.piece_bytes);
            if (at == std::string_view::npos || at <= start) at = text.find(' ', start + o.piece_bytes);
            if (at != std::string_view::npos) end = at;
            if (end - start > o.max_unsplit_bytes)
                return "a run of " + std::to_string(end - start) + " bytes without a space at byte " + std::to_string(start) +
                       " is longer than the " + std::to_string(o.max_unsplit_bytes) + " the encoder may be given at once";
        }
        if (auto problem = encode_piece(text.substr(start, end - start)); !problem.empty()) return problem;
        start = end;
        if (cancel && cancel->load(std::memory_order_relaxed) && start < text.size()) return "interrupted";
    }
    return {};
}

}  // namespace detail

// A kind of tokenizer: its name, whether it reads a model file (for kind "auto"), and how to make one.
// `make` throws config_error naming `field` (the option that named the model) for a model it cannot load.
struct tokenizer_kind {
    std::string name;
    std::function<bool(const std::string& model)> recognizes;
    std::function<std::unique_ptr<tokenizer>(const tokenizer_options&, const std::string& field)> make;
};

// The kinds this build has, in registration order (detail/registry.hpp). A kind registered again under
// a name already taken is found after the first: the first registered wins.
using tokenizer_registry = detail::registry<tokenizer_kind>;

// A tokenizer for `o`: of kind `o.kind`, or with "auto" the first registered kind that recognizes the
// model. Throws config_error naming `field` when no model is given, the kind is unknown or not built,
// or the model cannot be loaded.
inline std::unique_ptr<tokenizer> make_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") {
    if (o.model.empty()) throw config_error(field, "text input needs a tokenizer model");
    const auto kinds = tokenizer_registry::entries();
    std::string built;
    for (const auto& k : kinds) built += (built.empty() ? "" : ", ") + k->name;
    if (kinds.empty())
        throw config_error(field, o.model +
                                      ": this build of feedline has no tokenizer (sentencepiece was not found when it was configured); "
                                      "pack the text into token shards elsewhere");
    for (const auto& k : kinds)
        if (o.kind == k->name || (o.kind == "auto" && k->recognizes(o.model))) return k->make(o, field);
    throw config_error(field, o.model + ": " +
                                  (o.kind == "auto" ? "no tokenizer recognizes this model" : "no tokenizer of kind '" + o.kind + "'") +
                                  " (this build has: " + built + ")");
}

}  // namespace feedline
