// feedline/transform/sentencepiece_pieces.hpp: a sentencepiece model's tables as feedline's encoders
// use them (transform/unigram_encoder.hpp, transform/bpe_encoder.hpp), built once per process and model
// and shared by every thread's encoder: the normalizer, the pieces text can match (a byte trie), the
// reserved ones (control, unknown, byte), scores and types; and the library's last step, turning the
// model's pieces into ids (unknown runs merged, or spelled as bytes with byte_fallback).
#pragma once

#include <algorithm>
#include <array>
#include <cfloat>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/transform/byte_trie.hpp>
#include <feedline/transform/sentencepiece_model.hpp>
#include <feedline/transform/sentencepiece_normalizer.hpp>

namespace feedline::detail {

// A piece of an encoded text: its id and where it lies in the normalized text.
struct piece_span {
    std::int32_t id;
    std::uint32_t start, end;
};

// Immutable once built. `problem` (empty when feedline's encoders reproduce the model) says why they
// do not: a model type they do not read, or a model libsentencepiece refuses or fails on too.
struct sentencepiece_pieces {
    explicit sentencepiece_pieces(const sentencepiece_model& m)
            : normalizer(m), byte_fallback(m.byte_fallback), model_type(m.model_type), splits_at_spaces(detail::splits_at_spaces(m)) {
        if (!m.parsed) {
            problem = "not a sentencepiece model";
            return;
        }
        if (m.model_type != 1 && m.model_type != 2) {
            problem = std::string("a ") + m.model_type_name() +
                      " model (feedline's encoder reads Unigram and BPE models; kind sentencepiece reads every kind)";
            return;
        }
        if (!normalizer.problem().empty()) {
            problem = normalizer.problem();
            return;
        }
        // model_interface.cc InitializePieces: the same tables, the same refusals.
        const std::size_t n = m.pieces.size();
        scores.resize(n);
        types.resize(n);
        std::array<bool, 256> byte_found{};
        byte_ids.fill(-1);
        for (std::size_t i = 0; i < n; ++i) {
            const auto& p = m.pieces[i];
            const auto id = static_cast<std::int32_t>(i);
            if (p.text.empty() || p.text.find('\0') != std::string::npos) {
                problem = "piece " + std::to_string(i) + " is empty or holds a NUL byte";
                return;
            }
            if (p.type < piece_type::normal || p.type > piece_type::byte) {
                problem = "piece " + std::to_string(i) + " has an unknown type " + std::to_string(static_cast<int>(p.type));
                return;
            }
            scores[i] = p.score;
            types[i] = p.type;
            byte_trie& table = matchable(p.type) ? pieces : reserved;
            if (table.find(p.text) != byte_trie::none) {
                problem = "piece '" + p.text + "' is defined twice";
                return;
            }
            table.insert(p.text, id);
            has_unused = has_unused || p.type == piece_type::unused;
            if (p.type == piece_type::normal) min_score = std::min(min_score, p.score), max_score = std::max(max_score, p.score);
            if (p.type == piece_type::unknown) {
                if (unk_id >= 0) {
                    problem = "more than one unknown piece";
                    return;
                }
                unk_id = id;
            }
            if (p.type == piece_type::byte) {
                const int b = byte_of(p.text);
                if (!m.byte_fallback || b < 0) {
                    problem = "byte piece " + p.text + (b < 0 ? " is invalid" : " without byte_fallback");
                    return;
                }
                byte_found[static_cast<std::size_t>(b)] = true;
                byte_ids[static_cast<std::size_t>(b)] = id;
            }
        }
        if (unk_id < 0) {
            problem = "no unknown piece";
            return;
        }
        if (m.byte_fallback && std::find(byte_found.begin(), byte_found.end(), false) != byte_found.end()) {
            problem = "byte_fallback without all 256 byte pieces";
            return;
        }
        for (const auto& p : m.pieces)
            // PieceToId looks among the reserved pieces first: one whose text a symbol can be (one
            // character, or the text of a piece text can match) names that symbol instead. For BPE,
            // whose final pieces are named so, a control piece there would come out of the encoder, and
            // the library then fails on the text (its pieces no longer cover it).
            if (!matchable(p.type) &&
                (pieces.find(p.text) != byte_trie::none || one_char_length(static_cast<unsigned char>(p.text[0])) >= p.text.size())) {
                if (m.model_type == 2 && p.type == piece_type::control) {
                    problem = "its control piece '" + p.text + "' can be matched in text";
                    return;
                }
                reserved_can_match = true;
            }
        // sentencepiece_processor.cc: bos_id() is the BOS piece's id when that piece is a control symbol.
        const auto control = [&](const std::string& name) {
            const std::int32_t id = reserved.find(name);
            return id >= 0 && types[static_cast<std::size_t>(id)] == piece_type::control ? id : -1;
        };
        bos_id = control(m.bos_piece);
        eos_id = control(m.eos_piece);
        // Segments cut before each U+2581 encode independently when no piece the text can match holds
        // one after its first character (split_by_whitespace models; checked, not assumed) and every
        // such piece is whole UTF-8, so no piece can end or start inside the space symbol. BPE with
        // unused pieces does not: the library resegments them by what it saw anywhere in the text.
        cuts_at_spaces = m.escape_whitespaces && !m.treat_whitespace_as_suffix && !(m.model_type == 2 && has_unused);
        for (const auto& p : m.pieces)
            if (matchable(p.type) && (p.text.find(space_symbol, 1) != std::string::npos || !is_valid_utf8(p.text))) cuts_at_spaces = false;
        unk_score = min_score - 10.0f;  // unigram_model.cc: kUnkPenalty
    }

    bool unigram() const noexcept { return model_type == 1; }
    const char* type_name() const noexcept { return model_type == 2 ? "BPE" : "Unigram"; }

    // model_interface.cc PieceToId: a reserved piece's id, else a matchable piece's, else the unknown's.
    std::int32_t id_of(std::string_view piece) const {
        if (const std::int32_t id = reserved.find(piece); id != byte_trie::none) return id;
        if (const std::int32_t id = pieces.find(piece); id != byte_trie::none) return id;
        return unk_id;
    }

    // sentencepiece_processor.cc PopulateSentencePieceText: appends the ids of `path` (pieces of the
    // normalized text `s`): a run of unknown pieces is one <unk>, or with byte_fallback each unknown
    // piece is its UTF-8 bytes.
    void emit(std::span<const piece_span> path, std::string_view s, std::vector<std::int32_t>& out) const {
        bool previous_unknown = false;
        for (const piece_span& p : path) {
            const bool unknown = p.id == unk_id;
            if (unknown && byte_fallback) {
                for (std::uint32_t i = p.start; i < p.end; ++i) out.push_back(byte_ids[static_cast<unsigned char>(s[i])]);
            } else if (!(unknown && previous_unknown)) {
                out.push_back(p.id);
            }
            previous_unknown = unknown;
        }
    }

    // "<0x41>" -> 0x41 (model_interface.cc PieceToByte: exactly the form ByteToPiece writes).
    static int byte_of(std::string_view piece) {
        const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
        if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
        const int hi = hex(piece[3]), lo = hex(piece[4]);
        return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
    }
    // Normal, user-defined and unused pieces are what text can match; the others are named only.
    static bool matchable(piece_type t) noexcept {
        return t == piece_type::normal || t == piece_type::user_defined || t == piece_type::unused;
    }

    std::size_t memory_bytes() const noexcept {
        return pieces.memory_bytes() + reserved.memory_bytes() + normalizer.memory_bytes() + scores.capacity() * sizeof(float) +
               types.capacity();
    }

    sentencepiece_normalizer normalizer;
    byte_trie pieces;    // normal, user-defined and unused pieces: what text can match
    byte_trie reserved;  // control, unknown and byte pieces
    std::vector<float> scores;
    std::vector<piece_type> types;
    std::array<std::int32_t, 256> byte_ids{};
    bool byte_fallback = false;
    int model_type = 1;  // 1 Unigram, 2 BPE
    std::int32_t unk_id = -1, bos_id = -1, eos_id = -1;
    float min_score = FLT_MAX, max_score = FLT_MIN;  // as unigram_model.cc starts them (FLT_MIN: the smallest positive float)
    float unk_score = 0;                             // Unigram: an unknown character's score
    bool has_unused = false;
    bool reserved_can_match = false;  // a reserved piece's text is one a symbol can be (see the constructor)
    bool cuts_at_spaces = false;
    bool splits_at_spaces = false;  // detail::splits_at_spaces: a long text may be given in pieces cut before a space
    std::string checksum;           // of the model file (model_checksum), where the loader set it
    std::string problem;
};

// The frame both encoders share: normalizes `text` into `normalized`, clears `path`, then encodes the
// whole text with whole(s) or, where the model cuts at spaces, the word cache is on and the text is
// well-formed, word by word with word(w, start, hash) (transform/word_cache.hpp's words()); then
// appends the ids of the pieces `path` holds to `out`.
template <class Cache, class Whole, class Word>
void encode_by_words(const sentencepiece_pieces& m, std::string_view text, std::string& normalized, std::vector<piece_span>& path,
                     const Cache& cache, std::size_t max_word_bytes, std::vector<std::int32_t>& out, Whole&& whole, Word&& word) {
    const bool valid = m.normalizer.normalize(text, normalized);
    const std::string_view s = normalized;
    path.clear();
    if (s.empty()) return;
    if (!m.cuts_at_spaces || !cache.enabled() || !valid)
        whole(s);
    else
        cache.words(s, space_symbol, max_word_bytes, word);
    m.emit(path, s, out);
}

}  // namespace feedline::detail
