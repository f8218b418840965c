// feedline/transform/unigram_encoder.hpp: feedline's encoder for sentencepiece Unigram models, with
// libsentencepiece's ids (0.1.9x, the optimized Viterbi of unigram_model.cc that has been its default
// since 0.1.97): the same normalizer (transform/sentencepiece_normalizer.hpp), the same lattice walked
// in the same order with the same float and double arithmetic, so ties and near-ties resolve the same
// way; runs of unknown characters merged into one <unk>, or spelled as byte pieces with byte_fallback.
// The model's tables (unigram_model) are built once and shared by every thread's encoder; an encoder
// holds only its buffers, which grow with the longest text it is given.
#pragma once

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/transform/byte_trie.hpp>
#include <feedline/transform/sentencepiece_model.hpp>
#include <feedline/transform/sentencepiece_normalizer.hpp>

namespace feedline::detail {

// A Unigram model's tables, immutable once built. `problem` (empty when the encoder reproduces the
// model) says why it does not: another model type, or a model libsentencepiece refuses too.
struct unigram_model {
    explicit unigram_model(const sentencepiece_model& m) : normalizer(m), byte_fallback(m.byte_fallback) {
        if (!m.parsed) {
            problem = "not a sentencepiece model";
            return;
        }
        if (m.model_type != 1) {
            problem = std::string("a ") + m.model_type_name() +
                      " model (feedline's encoder reads Unigram models; kind sentencepiece reads every kind)";
            return;
        }
        if (!normalizer.problem().empty()) {
            problem = normalizer.problem();
            return;
        }
        const std::size_t n = m.pieces.size();
        scores.resize(n);
        types.resize(n);
        byte_trie reserved;  // control, unknown and byte pieces: looked up by name, never matched in text
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
            const bool in_text = p.type == piece_type::normal || p.type == piece_type::user_defined || p.type == piece_type::unused;
            byte_trie& table = in_text ? pieces : reserved;
            if (table.find(p.text) != byte_trie::none) {
                problem = "piece '" + p.text + "' is defined twice";
                return;
            }
            table.insert(p.text, id);
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
        // sentencepiece_processor.cc: bos_id() is the BOS piece's id when that piece is a control symbol.
        const auto control = [&](const std::string& name) {
            const std::int32_t id = reserved.find(name);
            return id >= 0 && types[static_cast<std::size_t>(id)] == piece_type::control ? id : -1;
        };
        // Segments cut before each U+2581 encode independently when no piece the text can match holds
        // one after its first character (split_by_whitespace models; checked, not assumed) and every
        // such piece is whole UTF-8, so no piece can end or start inside the space symbol.
        cuts_at_spaces = m.escape_whitespaces && !m.treat_whitespace_as_suffix;
        for (const auto& p : m.pieces)
            if (p.type == piece_type::normal || p.type == piece_type::user_defined || p.type == piece_type::unused) {
                if (p.text.find(space_symbol, 1) != std::string::npos || !is_valid_utf8(p.text)) cuts_at_spaces = false;
            }
        bos_id = control(m.bos_piece);
        eos_id = control(m.eos_piece);
        unk_score = min_score - 10.0f;  // unigram_model.cc: kUnkPenalty
    }

    // "<0x41>" -> 0x41 (model_interface.cc PieceToByte: exactly the form ByteToPiece writes).
    static int byte_of(std::string_view piece) {
        const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
        if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
        const int hi = hex(piece[3]), lo = hex(piece[4]);
        return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
    }

    std::size_t memory_bytes() const noexcept {
        return pieces.memory_bytes() + normalizer.memory_bytes() + scores.capacity() * sizeof(float) + types.capacity();
    }

    sentencepiece_normalizer normalizer;
    byte_trie pieces;  // normal, user-defined and unused pieces: what text can match
    std::vector<float> scores;
    std::vector<piece_type> types;
    std::array<std::int32_t, 256> byte_ids{};
    bool byte_fallback = false;
    std::int32_t unk_id = -1, bos_id = -1, eos_id = -1;
    float min_score = FLT_MAX, max_score = FLT_MIN;  // as unigram_model.cc starts them (FLT_MIN: the smallest positive float)
    float unk_score = 0;
    bool cuts_at_spaces = false;
    std::string problem;
};

// One thread's encoder over a shared model, with a bounded cache of the words it has seen.
//
// Why a cached word gives the library's ids: where a model cuts at spaces (cuts_at_spaces), every path
// through the lattice passes the position of each U+2581, so the best path is the best path of each
// word ("▁the") in turn, started from the score the text before it reached. Only the floating-point
// rounding depends on that starting score, and it can change a comparison only where two candidates
// are closer than the rounding can move them. So a word is walked once from 0, keeping its smallest
// margin between compared candidates; a later occurrence reuses the pieces when that margin exceeds
// the bound on the rounding from the actual starting score (4 (n + 1) u (|start| + |largest value| + 1)
// for n characters, u = 2^-24), and otherwise walks the word again from the actual score. The score the path
// reaches is then recomputed piece by piece, with the library's arithmetic, for the next word.
class unigram_encoder {
public:
    static constexpr std::size_t default_cache_bytes = std::size_t(8) << 20;
    static constexpr std::size_t max_cached_word_bytes = 96;

    explicit unigram_encoder(std::shared_ptr<const unigram_model> model, std::size_t cache_bytes = default_cache_bytes)
            : model_(std::move(model)), cache_bytes_(cache_bytes) {}

    // Appends the ids of `text` to `out`.
    void encode(std::string_view text, std::vector<std::int32_t>& out) {
        const unigram_model& m = *model_;
        const bool valid = m.normalizer.normalize(text, normalized_);
        const std::string_view s = normalized_;
        path_.clear();
        if (s.empty()) return;
        if (!m.cuts_at_spaces || cache_bytes_ == 0 || !valid) {
            walk(s, 0, 0.0f, nullptr);
        } else {
            float score = 0;
            for (std::size_t start = 0; start < s.size();) {
                const std::size_t end = std::min(s.find(space_symbol, start + 1), s.size());
                score = word(s.substr(start, end - start), start, score);
                start = end;
            }
        }
        emit(s, out);
    }

    const unigram_model& model() const noexcept { return *model_; }
    // This encoder's own memory (its buffers and word cache), beside the shared model's.
    std::size_t buffer_bytes() const noexcept {
        return normalized_.capacity() + best_.capacity() * sizeof(path_end) + path_.capacity() * sizeof(span) +
               slots_.capacity() * sizeof(slot) + keys_.capacity() + cached_pieces_.capacity() * sizeof(cached_piece);
    }
    std::uint64_t cache_hits() const noexcept { return hits_; }
    std::uint64_t cache_rewalks() const noexcept { return rewalks_; }  // cached words walked again: too close to call from the cache
    std::uint64_t cache_misses() const noexcept { return misses_; }    // words walked the first time, or too long to cache

private:
    struct path_end {
        float score = 0;
        std::int32_t start = -1;  // where the best path's last piece starts; -1: no path yet
        std::int32_t id = -1;
    };
    struct span {
        std::int32_t id;
        std::uint32_t start, end;  // in the normalized text
    };
    struct cached_piece {
        std::int32_t id;
        std::uint32_t length;
    };
    struct cached_word {
        std::uint32_t first = 0, count = 0;  // into cached_pieces_
        double margin = 0;                   // the smallest gap between compared candidates, walked from 0
        double largest = 0;                  // the largest magnitude of a value the walk from 0 met
        std::uint32_t characters = 0;        // bounds how many roundings a value's path holds
    };
    struct margins {
        double margin = HUGE_VAL, largest = 0;
        std::uint32_t characters = 0;
        void compared(double a, double b) { margin = std::min(margin, std::abs(a - b)); }
        void met(double v) { largest = std::max(largest, std::abs(v)); }
    };
    struct text_hash {  // words are short: eight bytes a step, mixed by multiplication
        std::uint64_t operator()(std::string_view s) const noexcept {
            std::uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
            const char* p = s.data();
            std::size_t n = s.size();
            for (; n >= 8; p += 8, n -= 8) {
                std::uint64_t v;
                std::memcpy(&v, p, 8);
                h = (h ^ v) * 0xBF58476D1CE4E5B9ull;
                h ^= h >> 31;
            }
            std::uint64_t v = 0;
            std::memcpy(&v, p, n);
            h = (h ^ v) * 0x94D049BB133111EBull;
            return h ^ (h >> 29);
        }
    };

    // One word at `base` in the normalized text, its path starting from `score`: from the cache when
    // its margin allows, else walked. Returns the score at its end.
    float word(std::string_view w, std::size_t base, float score) {
        if (w.size() > max_cached_word_bytes) return ++misses_, walk(w, base, score, nullptr);
        const std::uint64_t h = text_hash{}(w) | 1;  // 0 marks an empty slot
        cached_word* found = find(w, h);
        if (!found) {
            ++misses_;
            // Full, the cache keeps what it has (the words met first, in Zipfian text the frequent ones)
            // and new words are walked in place; after as many misses again as four times its words it
            // starts over, so a cache of a corpus's first domain does not stay forever.
            if (slots_.empty() || (entries_ + 1) * 4 > slots_.size() * 3 ||
                slots_.size() * sizeof(slot) + keys_.size() + w.size() + cached_pieces_.size() * sizeof(cached_piece) + 1024 >
                    cache_bytes_) {
                if (!slots_.empty() && ++misses_since_full_ <= 4 * entries_) return walk(w, base, score, nullptr);
                start_over();
            }
            margins seen;
            const std::size_t from = path_.size();
            walk(w, 0, 0.0f, &seen);
            const std::size_t count = path_.size() - from;
            cached_word c{static_cast<std::uint32_t>(cached_pieces_.size()), static_cast<std::uint32_t>(count), seen.margin, seen.largest,
                          seen.characters};
            for (std::size_t i = from; i < path_.size(); ++i) cached_pieces_.push_back({path_[i].id, path_[i].end - path_[i].start});
            path_.resize(from);
            std::size_t i = h & (slots_.size() - 1);
            while (slots_[i].hash) i = (i + 1) & (slots_.size() - 1);
            slots_[i] = {h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(w.size()), c};
            keys_.append(w);
            ++entries_;
            found = &slots_[i].word;
        }
        const cached_word& c = *found;
        // A value k pieces into the word is k roundings (unit 2^-24 of at most |score| + largest) from
        // its walk from 0, in each of the two walks; a compared pair is two such values, one of them
        // perhaps a rounded unknown candidate: 4 (k + 1) 2^-24 (|score| + largest + 1) covers it.
        const double bound = 4.0 * (c.characters + 1.0) * (std::abs(static_cast<double>(score)) + c.largest + 1.0) * 0x1p-24;
        if (!(c.margin > bound)) {
            ++rewalks_;
            return walk(w, base, score, nullptr);
        }
        ++hits_;
        const unigram_model& m = *model_;
        std::uint32_t at = static_cast<std::uint32_t>(base);
        for (std::uint32_t i = c.first; i < c.first + c.count; ++i) {
            const cached_piece p = cached_pieces_[i];
            path_.push_back({p.id, at, at + p.length});
            at += p.length;
            if (p.id == m.unk_id)
                score = m.unk_score + score;
            else if (m.types[static_cast<std::size_t>(p.id)] == piece_type::user_defined)
                score = static_cast<float>((static_cast<float>(p.length) * m.max_score - 0.1) + score);
            else
                score = static_cast<float>(static_cast<double>(m.scores[static_cast<std::size_t>(p.id)]) + score);
        }
        return score;
    }

    // The cache: open addressing over one array of slots, the words' bytes in one arena.
    struct slot {
        std::uint64_t hash = 0;  // 0: empty
        std::uint32_t key_at = 0, key_length = 0;
        cached_word word;
    };
    cached_word* find(std::string_view w, std::uint64_t h) {
        if (slots_.empty()) return nullptr;
        for (std::size_t i = h & (slots_.size() - 1); slots_[i].hash; i = (i + 1) & (slots_.size() - 1))
            if (slots_[i].hash == h && slots_[i].key_length == w.size() &&
                std::memcmp(keys_.data() + slots_[i].key_at, w.data(), w.size()) == 0)
                return &slots_[i].word;
        return nullptr;
    }
    void start_over() {
        // Slots for half of the budget, at most three quarters of them used.
        std::size_t n = 1024;
        while (n * 2 * sizeof(slot) <= cache_bytes_ / 2) n *= 2;
        slots_.assign(n, slot{});
        keys_.clear();
        cached_pieces_.clear();
        entries_ = 0;
        misses_since_full_ = 0;
    }

    // unigram_model.cc EncodeOptimized over `w` (at `base` in the normalized text), the best path's
    // score starting at `score`: appends the path's pieces to path_ and returns the score at its end.
    // `seen`, when given, gets the smallest gap between compared candidates and the largest value.
    float walk(std::string_view w, std::size_t base, float score, margins* seen) {
        const unigram_model& m = *model_;
        best_.assign(w.size() + 1, path_end{});
        best_[0].score = score;
        for (std::size_t start = 0; start < w.size();) {
            const float here = best_[start].score;
            const std::size_t char_length = std::min(one_char_length(static_cast<unsigned char>(w[start])), w.size() - start);
            bool whole_char = false;
            m.pieces.prefixes(w.substr(start), [&](std::size_t length, std::int32_t id) {
                const piece_type type = m.types[static_cast<std::size_t>(id)];
                if (type == piece_type::unused) return;
                // The same types as sentencepiece: a user-defined piece's bonus is computed in double, and
                // so is every candidate (the ternary's common type); the best is stored as a float.
                const double piece_score = type == piece_type::user_defined ? static_cast<float>(length) * m.max_score - 0.1
                                                                            : static_cast<double>(m.scores[static_cast<std::size_t>(id)]);
                const double candidate = piece_score + here;
                path_end& target = best_[start + length];
                if (seen) {
                    seen->met(candidate);
                    if (target.start >= 0) seen->compared(candidate, target.score);
                }
                if (target.start < 0 || candidate > target.score)
                    target = {static_cast<float>(candidate), static_cast<std::int32_t>(start), id};
                if (length == char_length) whole_char = true;
            });
            if (!whole_char) {
                const float candidate = m.unk_score + here;
                path_end& target = best_[start + char_length];
                if (seen) {
                    seen->met(candidate);
                    if (target.start >= 0) seen->compared(candidate, target.score);
                }
                if (target.start < 0 || candidate > target.score) target = {candidate, static_cast<std::int32_t>(start), m.unk_id};
            }
            start += char_length;
            if (seen) ++seen->characters;
        }
        const std::size_t from = path_.size();
        for (std::size_t end = w.size(); end > 0; end = static_cast<std::size_t>(best_[end].start))
            path_.push_back({best_[end].id, static_cast<std::uint32_t>(base + static_cast<std::size_t>(best_[end].start)),
                             static_cast<std::uint32_t>(base + end)});
        std::reverse(path_.begin() + static_cast<std::ptrdiff_t>(from), path_.end());
        return best_[w.size()].score;
    }

    // sentencepiece_processor.cc PopulateSentencePieceText: a run of unknown pieces is one <unk>, or
    // with byte_fallback each unknown piece is its UTF-8 bytes.
    void emit(std::string_view s, std::vector<std::int32_t>& out) const {
        const unigram_model& m = *model_;
        bool previous_unknown = false;
        for (const span& p : path_) {
            const bool unknown = p.id == m.unk_id;
            if (unknown && m.byte_fallback) {
                for (std::uint32_t i = p.start; i < p.end; ++i) out.push_back(m.byte_ids[static_cast<unsigned char>(s[i])]);
            } else if (!(unknown && previous_unknown)) {
                out.push_back(p.id);
            }
            previous_unknown = unknown;
        }
    }

    std::shared_ptr<const unigram_model> model_;
    std::size_t cache_bytes_;
    std::string normalized_;
    std::vector<path_end> best_;
    std::vector<span> path_;
    std::vector<slot> slots_;
    std::string keys_;
    std::vector<cached_piece> cached_pieces_;
    std::size_t entries_ = 0, misses_since_full_ = 0;
    std::uint64_t hits_ = 0, rewalks_ = 0, misses_ = 0;
};

}  // namespace feedline::detail
