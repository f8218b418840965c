// feedline/transform/unigram_encoder.hpp: feedline's encoder for sentencepiece Unigram models, with
// libsentencepiece's ids (0.1.9x, the optimized Viterbi of unigram_model.cc that has been its default
// since 0.1.97): the same normalizer (transform/sentencepiece_normalizer.hpp), the same lattice walked
// in the same order with the same float and double arithmetic, so ties and near-ties resolve the same
// way; runs of unknown characters merged into one <unk>, or spelled as byte pieces with byte_fallback.
// The model's tables (transform/sentencepiece_pieces.hpp) are built once and shared by every thread's
// encoder; an encoder holds only its buffers, which grow with the longest text it is given, and its
// word cache (transform/word_cache.hpp).
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

#include <feedline/transform/sentencepiece_pieces.hpp>
#include <feedline/transform/word_cache.hpp>

namespace feedline::detail {

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
    static constexpr std::size_t default_cache_bytes = word_cache<int>::default_bytes;
    static constexpr std::size_t max_cached_word_bytes = 96;

    // `model` must be a Unigram model's tables without a problem.
    explicit unigram_encoder(std::shared_ptr<const sentencepiece_pieces> model, std::size_t cache_bytes = default_cache_bytes)
            : model_(std::move(model)), cache_(cache_bytes) {}

    // Appends the ids of `text` to `out`.
    void encode(std::string_view text, std::vector<std::int32_t>& out) {
        float score = 0;  // the running score, word to word
        encode_by_words(
            *model_, text, normalized_, path_, cache_, max_cached_word_bytes, out, [&](std::string_view s) { walk(s, 0, 0.0f, nullptr); },
            [&](std::string_view w, std::size_t start, std::uint64_t h) { score = word(w, start, score, h); });
    }

    const sentencepiece_pieces& model() const noexcept { return *model_; }
    // This encoder's own memory (its buffers and word cache), beside the shared model's.
    std::size_t buffer_bytes() const noexcept {
        return normalized_.capacity() + best_.capacity() * sizeof(path_end) + path_.capacity() * sizeof(piece_span) + cache_.memory_bytes();
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
    struct walk_margins {              // kept with a cached word, as floats: the margin rounded down, the largest value up
        float margin = 0;              // the smallest gap between compared candidates, walked from 0
        float largest = 0;             // the largest magnitude of a value the walk from 0 met
        std::uint32_t characters = 0;  // bounds how many roundings a value's path holds
        static walk_margins of(double margin, double largest, std::uint32_t characters) {
            float m = static_cast<float>(margin), l = static_cast<float>(largest);
            if (m > margin) m = std::nextafter(m, 0.0f);
            if (l < largest) l = std::nextafter(l, HUGE_VALF);
            return {m, l, characters};
        }
    };
    struct margins {
        double margin = HUGE_VAL, largest = 0;
        std::uint32_t characters = 0;
        void compared(double a, double b) { margin = std::min(margin, std::abs(a - b)); }
        void met(double v) { largest = std::max(largest, std::abs(v)); }
    };

    // One word at `base` in the normalized text (its hash `h`), its path starting from `score`: from the cache when
    // its margin allows, else walked. Returns the score at its end.
    float word(std::string_view w, std::size_t base, float score, std::uint64_t h) {
        if (h == 0) return ++misses_, walk(w, base, score, nullptr);  // too long to cache
        const auto* found = cache_.find(w, h);
        if (!found) {
            ++misses_;
            if (!cache_.admit(w.size())) return walk(w, base, score, nullptr);
            margins seen;
            const std::size_t from = path_.size();
            walk(w, 0, 0.0f, &seen);
            found = &cache_.insert(w, h, std::span<const piece_span>(path_).subspan(from),
                                   walk_margins::of(seen.margin, seen.largest, seen.characters));
            path_.resize(from);
        }
        const walk_margins& c = found->extra;
        // A value k pieces into the word is k roundings (unit 2^-24 of at most |score| + largest) from
        // its walk from 0, in each of the two walks; a compared pair is two such values, one of them
        // perhaps a rounded unknown candidate: 4 (k + 1) 2^-24 (|score| + largest + 1) covers it.
        const double bound = 4.0 * (c.characters + 1.0) * (std::abs(static_cast<double>(score)) + c.largest + 1.0) * 0x1p-24;
        if (!(c.margin > bound)) {
            ++rewalks_;
            return walk(w, base, score, nullptr);
        }
        ++hits_;
        const sentencepiece_pieces& m = *model_;
        std::uint32_t at = static_cast<std::uint32_t>(base);
        for (const cached_piece p : cache_.pieces(*found)) {
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

    // unigram_model.cc EncodeOptimized over `w` (at `base` in the normalized text), the best path's
    // score starting at `score`: appends the path's pieces to path_ and returns the score at its end.
    // `seen`, when given, gets the smallest gap between compared candidates and the largest value.
    float walk(std::string_view w, std::size_t base, float score, margins* seen) {
        const sentencepiece_pieces& m = *model_;
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

    std::shared_ptr<const sentencepiece_pieces> model_;
    word_cache<walk_margins> cache_;
    std::string normalized_;
    std::vector<path_end> best_;
    std::vector<piece_span> path_;
    std::uint64_t hits_ = 0, rewalks_ = 0, misses_ = 0;
};

}  // namespace feedline::detail
