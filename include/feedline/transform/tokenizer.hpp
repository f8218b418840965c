// feedline/transform/tokenizer.hpp: text to token ids with a sentencepiece model, one instance per
// thread (sentencepiece does not document its processor as thread-safe, and a processor per worker
// keeps its buffers on that worker's NUMA node). Adds the model's BOS before and EOS after every
// document when asked, as feedline-pack does, so ids equal `spm_encode --output_format=id` plus those.
// Used by the text source's workers (pipeline/text_source.hpp), its token-length pass, and
// transform/tokenize_in_order.hpp (feedline-pack).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#if FEEDLINE_HAS_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

#include <feedline/detail/paths.hpp>
#include <feedline/error.hpp>

namespace feedline {

// What to tokenize with and what to add around each document.
struct tokenizer_options {
    std::string model;  // a sentencepiece .model file
    bool add_bos = false, add_eos = true;
    // Documents longer than this are encoded a piece at a time, split before a space, where the model
    // makes that exact (see tokenizer::pieces_are_exact): sentencepiece's memory grows ~110x the text
    // it is given, so this bounds one tokenizer's to ~110 MiB whatever the document.
    std::uint64_t piece_bytes = std::uint64_t(1) << 20;
    // The longest text given to sentencepiece at once: a document (of a model that cannot be split
    // exactly) or a run without a space longer than this is refused (~900 MiB of tokenizer memory).
    std::uint64_t max_unsplit_bytes = std::uint64_t(8) << 20;
};

namespace detail {

// What a sentencepiece model file says about how it splits text, read from its protobuf bytes
// (sentencepiece_model.proto: ModelProto.pieces = 1, .trainer_spec = 2, .normalizer_spec = 3;
// TrainerSpec.split_by_whitespace = 22, .treat_whitespace_as_suffix = 24; NormalizerSpec
// .add_dummy_prefix = 3, .remove_extra_whitespaces = 4, .escape_whitespaces = 5; SentencePiece.piece
// = 1, .type = 3, USER_DEFINED = 4). Fields absent take proto2's declared defaults.
struct model_splitting {
    bool split_by_whitespace = true, treat_whitespace_as_suffix = false;
    bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
    bool user_symbol_with_space = false;  // a user-defined piece that holds a space (U+2581 or ' ')
    bool parsed = false;
};

// A protobuf message's fields, one at a time. Malformed input ends the walk (parsed stays false).
class proto_reader {
public:
    explicit proto_reader(std::string_view bytes) : p_(bytes) {}
    // The next field: its number, wire type, varint value or length-delimited bytes. False at the end
    // or on malformed input (`ok()` tells which).
    bool next(std::uint32_t& field, std::uint32_t& wire, std::uint64_t& value, std::string_view& bytes) {
        if (at_ >= p_.size()) return false;
        std::uint64_t key = 0;
        if (!varint(key)) return fail();
        field = static_cast<std::uint32_t>(key >> 3);
        wire = static_cast<std::uint32_t>(key & 7);
        switch (wire) {
            case 0: return varint(value) || fail();
            case 1: return skip(8);
            case 5: return skip(4);
            case 2: {
                std::uint64_t n = 0;
                if (!varint(n) || n > p_.size() - at_) return fail();
                bytes = p_.substr(at_, n);
                at_ += n;
                return true;
            }
            default: return fail();
        }
    }
    bool ok() const noexcept { return ok_; }

private:
    bool varint(std::uint64_t& v) {
        v = 0;
        for (int shift = 0; shift < 64 && at_ < p_.size(); shift += 7) {
            const auto b = static_cast<unsigned char>(p_[at_++]);
            v |= std::uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return true;
        }
        return false;
    }
    bool skip(std::size_t n) {
        if (n > p_.size() - at_) return fail();
        at_ += n;
        return true;
    }
    bool fail() {
        ok_ = false;
        at_ = p_.size();
        return false;
    }
    std::string_view p_;
    std::size_t at_ = 0;
    bool ok_ = true;
};

inline model_splitting read_model_splitting(std::string_view model) {
    model_splitting m;
    proto_reader top(model);
    std::uint32_t field = 0, wire = 0;
    std::uint64_t value = 0;
    std::string_view bytes;
    while (top.next(field, wire, value, bytes)) {
        if (wire != 2) continue;
        proto_reader inner(bytes);
        std::uint32_t f = 0, w = 0;
        std::uint64_t v = 0;
        std::string_view b;
        if (field == 1) {  // a piece: user-defined ones holding a space would be cut by a split
            std::string_view piece;
            std::uint64_t type = 1;
            while (inner.next(f, w, v, b)) {
                if (f == 1 && w == 2) piece = b;
                if (f == 3 && w == 0) type = v;
            }
            if (type == 4 && (piece.find(' ') != std::string_view::npos || piece.find("\xe2\x96\x81") != std::string_view::npos))
                m.user_symbol_with_space = true;
        } else if (field == 2) {
            while (inner.next(f, w, v, b))
                if (w == 0 && f == 22) m.split_by_whitespace = v != 0;
                else if (w == 0 && f == 24) m.treat_whitespace_as_suffix = v != 0;
        } else if (field == 3) {
            while (inner.next(f, w, v, b))
                if (w == 0 && f == 3) m.add_dummy_prefix = v != 0;
                else if (w == 0 && f == 4) m.remove_extra_whitespaces = v != 0;
                else if (w == 0 && f == 5) m.escape_whitespaces = v != 0;
        }
        if (!inner.ok()) return {};
    }
    m.parsed = top.ok();
    return m;
}

}  // namespace detail

#if FEEDLINE_HAS_SENTENCEPIECE
// The largest sentencepiece model file feedline reads (real ones are 0.2-5 MB).
inline constexpr std::uint64_t max_model_bytes = std::uint64_t(1) << 30;

// Loads a sentencepiece model from `path`, which must be a regular file (a FIFO or a directory is
// refused at once instead of hanging or aborting inside sentencepiece). Throws config_error naming
// `field` and the path.
inline void load_sentencepiece_model(sentencepiece::SentencePieceProcessor& spm, const std::string& path, const std::string& field) {
    std::string bytes;
    try {
        bytes = read_regular_file(path, max_model_bytes);
    } catch (const io_error& e) {
        throw config_error(field, e.what());
    }
    if (auto st = spm.LoadFromSerializedProto(bytes); !st.ok()) throw config_error(field, path + ": not a sentencepiece model (" + st.ToString() + ")");
}

class tokenizer {
public:
    // Loads the model. Throws config_error naming `field` (the config field that named the model)
    // when it cannot be loaded or lacks a BOS/EOS piece that is asked for.
    explicit tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") : options_(o) {
        if (o.model.empty()) throw config_error(field, "text input needs a sentencepiece model");
        std::string bytes;
        try {
            bytes = read_regular_file(o.model, max_model_bytes);
        } catch (const io_error& e) {
            throw config_error(field, e.what());
        }
        if (auto st = spm_.LoadFromSerializedProto(bytes); !st.ok()) throw config_error(field, o.model + ": not a sentencepiece model (" + st.ToString() + ")");
        const auto m = detail::read_model_splitting(bytes);
        exact_pieces_ = m.parsed && m.split_by_whitespace && !m.treat_whitespace_as_suffix && m.add_dummy_prefix && m.remove_extra_whitespaces &&
                        m.escape_whitespaces && !m.user_symbol_with_space;
        if (o.add_bos && spm_.bos_id() < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && spm_.eos_id() < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }
    tokenizer(const tokenizer&) = delete;
    tokenizer& operator=(const tokenizer&) = delete;

    int vocab_size() const { return spm_.GetPieceSize(); }
    int bos_id() const { return spm_.bos_id(); }  // -1: the model has none
    int eos_id() const { return spm_.eos_id(); }
    // Whether a long document may be encoded a piece at a time with the same ids as whole: the model
    // splits at every space anyway (split_by_whitespace, the space starting the next piece), collapses
    // runs of spaces and adds the dummy prefix, so a piece that starts with a space encodes as it would
    // in place; and no user-defined symbol holds a space.
    bool pieces_are_exact() const noexcept { return exact_pieces_; }

    // Replaces `out` with the document's ids (BOS/EOS added as configured). Returns an error text
    // (sentencepiece's, or why the document is too long to encode in bounded memory), empty on
    // success. A document longer than piece_bytes is encoded in pieces split before a space (ids equal
    // the whole document's; see pieces_are_exact); `cancel`, when given and set, stops between pieces
    // (an "interrupted" error). Allocates nothing once `out` and the buffers have grown.
    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) {
        out.clear();
        if (options_.add_bos) out.push_back(spm_.bos_id());
        if (text.size() <= options_.piece_bytes) {
            if (auto problem = encode_piece(text, out); !problem.empty()) return problem;
        } else if (!exact_pieces_) {
            if (text.size() > options_.max_unsplit_bytes)
                return "a document of " + std::to_string(text.size()) + " bytes is longer than the " + std::to_string(options_.max_unsplit_bytes) +
                       " this model may be given at once (its normalizer or a user-defined symbol keeps it from being split exactly at spaces)";
            if (auto problem = encode_piece(text, out); !problem.empty()) return problem;
        } else {
            for (std::size_t start = 0; start < text.size();) {
                std::size_t end = text.size();
                if (text.size() - start > options_.piece_bytes) {
                    // Before the last space within the piece, else the first one after it.
                    std::size_t at = text.rfind(' ', start + options_.piece_bytes);
                    if (at == std::string_view::npos || at <= start) at = text.find(' ', start + options_.piece_bytes);
                    if (at != std::string_view::npos) end = at;
                    if (end - start > options_.max_unsplit_bytes)
                        return "a run of " + std::to_string(end - start) + " bytes without a space at byte " + std::to_string(start) +
                               " is longer than the " + std::to_string(options_.max_unsplit_bytes) + " sentencepiece may be given at once";
                }
                if (auto problem = encode_piece(text.substr(start, end - start), out); !problem.empty()) return problem;
                start = end;
                if (cancel && cancel->load(std::memory_order_relaxed) && start < text.size()) return "interrupted";
            }
        }
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
};
#endif

}  // namespace feedline
