// feedline/transform/bpe_encoder.hpp: feedline's encoder for sentencepiece BPE models, with
// libsentencepiece's ids (bpe_model.cc, 0.1.9x): the same normalizer, the text split into characters and
// user-defined symbols (kept whole, never merged), then pairs of neighbours merged while any pair is a
// piece, the best-scoring first and of equal scores the leftmost; unused pieces split again into what
// they were made of. Where a model cuts at spaces (sentencepiece_pieces::cuts_at_spaces) no merge crosses
// a U+2581, so each word ("▁the") merges on its own, the same way wherever it stands: a word's pieces are
// cached (transform/word_cache.hpp) and most words of natural text are found there, not merged again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <feedline/transform/sentencepiece_pieces.hpp>
#include <feedline/transform/word_cache.hpp>

namespace feedline::detail {

class bpe_encoder {
public:
    static constexpr std::size_t default_cache_bytes = word_cache<int>::default_bytes;
    static constexpr std::size_t max_cached_word_bytes = 96;

    // `model` must be a BPE model's tables without a problem.
    explicit bpe_encoder(std::shared_ptr<const sentencepiece_pieces> model, std::size_t cache_bytes = default_cache_bytes)
            : model_(std::move(model)), cache_(cache_bytes) {}

    // Appends the ids of `text` to `out`.
    void encode(std::string_view text, std::vector<std::int32_t>& out) {
        encode_by_words(
            *model_, text, normalized_, path_, cache_, max_cached_word_bytes, out, [&](std::string_view s) { merge(s, 0); },
            [&](std::string_view w, std::size_t start, std::uint64_t h) { word(w, start, h); });
    }

    const sentencepiece_pieces& model() const noexcept { return *model_; }
    // This encoder's own memory (its buffers and word cache), beside the shared model's.
    std::size_t buffer_bytes() const noexcept {
        return normalized_.capacity() + path_.capacity() * sizeof(piece_span) + symbols_.capacity() * sizeof(symbol) +
               agenda_.capacity() * sizeof(candidate) + cache_.memory_bytes();
    }
    std::uint64_t cache_hits() const noexcept { return hits_; }
    std::uint64_t cache_misses() const noexcept { return misses_; }  // words merged the first time, or too long to cache

private:
    struct symbol {
        std::uint32_t start, length;  // in the text merged; length 0: merged into its left neighbour
        std::int32_t prev, next;      // neighbours' indices, -1 at the ends
        std::int32_t id;              // the piece it is, or byte_trie::none
        bool frozen;                  // a user-defined symbol: never merged
    };
    struct candidate {  // a merge of two neighbours into a piece
        float score;
        std::int32_t left, right;
        std::uint32_t length;  // the two's lengths when it was found: stale once either changed
        std::int32_t id;
    };
    // The agenda's order (bpe_model.cc SymbolPairComparator): the highest score on top, of equal
    // scores the leftmost.
    static bool below(const candidate& a, const candidate& b) noexcept {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }

    void word(std::string_view w, std::size_t base, std::uint64_t h) {
        if (h == 0) return ++misses_, merge(w, base);  // too long to cache
        const auto* found = cache_.find(w, h);
        if (!found) {
            ++misses_;
            if (!cache_.admit(w.size())) return merge(w, base);
            const std::size_t from = path_.size();
            merge(w, 0);
            found = &cache_.insert(w, h, std::span<const piece_span>(path_).subspan(from), 0);
            path_.resize(from);
        } else {
            ++hits_;
        }
        std::uint32_t at = static_cast<std::uint32_t>(base);
        for (const cached_piece p : cache_.pieces(*found)) {
            path_.push_back({p.id, at, at + p.length});
            at += p.length;
        }
    }

    // bpe_model.cc Encode over `w` (at `base` in the normalized text): appends its pieces to path_.
    void merge(std::string_view w, std::size_t base) {
        const sentencepiece_pieces& m = *model_;
        symbols_.clear();
        agenda_.clear();
        rev_merge_.clear();
        const byte_trie& user = m.normalizer.user_symbols();
        for (std::size_t i = 0; i < w.size();) {
            std::size_t n = user.empty() ? 0 : user.longest_prefix(w.substr(i));
            const bool frozen = n > 0;
            if (!frozen) n = std::min(one_char_length(static_cast<unsigned char>(w[i])), w.size() - i);
            const auto index = static_cast<std::int32_t>(symbols_.size());
            symbols_.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(n), index - 1, i + n < w.size() ? index + 1 : -1,
                                m.pieces.find(w.substr(i, n)), frozen});
            i += n;
        }
        for (std::size_t i = 1; i < symbols_.size(); ++i) consider(w, static_cast<std::int32_t>(i - 1), static_cast<std::int32_t>(i));
        while (!agenda_.empty()) {
            std::pop_heap(agenda_.begin(), agenda_.end(), below);
            const candidate top = agenda_.back();
            agenda_.pop_back();
            symbol& left = symbols_[static_cast<std::size_t>(top.left)];
            symbol& right = symbols_[static_cast<std::size_t>(top.right)];
            if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) continue;
            left.length += right.length;
            left.id = top.id;
            left.next = right.next;
            if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = top.left;
            right.length = 0;
            consider(w, left.prev, top.left);
            consider(w, top.left, left.next);
        }
        std::uint32_t at = static_cast<std::uint32_t>(base);
        for (std::int32_t i = 0; i >= 0; i = symbols_[static_cast<std::size_t>(i)].next) {
            const symbol& sym = symbols_[static_cast<std::size_t>(i)];
            const std::string_view piece = w.substr(sym.start, sym.length);
            // The merges' ids are the answer unless a reserved piece can name a symbol or unused
            // pieces are split again.
            if (m.reserved_can_match || m.has_unused)
                resegment(piece, at);
            else
                path_.push_back({sym.id >= 0 ? sym.id : m.unk_id, at, at + sym.length}), at += sym.length;
        }
    }

    // MaybeAddNewSymbolPair: whether neighbours `left` and `right` together are a piece.
    void consider(std::string_view w, std::int32_t left, std::int32_t right) {
        if (left < 0 || right < 0) return;
        const symbol& a = symbols_[static_cast<std::size_t>(left)];
        const symbol& b = symbols_[static_cast<std::size_t>(right)];
        if (a.frozen || b.frozen) return;
        const std::string_view piece = w.substr(a.start, a.length + b.length);
        const std::int32_t id = model_->pieces.find(piece);
        if (id == byte_trie::none) return;
        agenda_.push_back({model_->scores[static_cast<std::size_t>(id)], left, right, a.length + b.length, id});
        std::push_heap(agenda_.begin(), agenda_.end(), below);
        // The library remembers, by the piece's text, the last pair seen making an unused piece.
        if (model_->types[static_cast<std::size_t>(id)] == piece_type::unused)
            rev_merge_[piece] = {w.substr(a.start, a.length), w.substr(b.start, b.length)};
    }

    // The resegment step: a piece is named by PieceToId; an unused one is replaced by the two it was
    // last seen made of, in turn.
    void resegment(std::string_view piece, std::uint32_t& at) {
        const sentencepiece_pieces& m = *model_;
        const std::int32_t id = m.id_of(piece);
        if (m.types[static_cast<std::size_t>(id)] == piece_type::unused) {
            if (const auto made = rev_merge_.find(piece); made != rev_merge_.end()) {
                const auto [first, second] = made->second;
                resegment(first, at);
                resegment(second, at);
                return;
            }
        }
        const auto length = static_cast<std::uint32_t>(piece.size());
        path_.push_back({id, at, at + length});
        at += length;
    }

    std::shared_ptr<const sentencepiece_pieces> model_;
    word_cache<char> cache_;
    std::string normalized_;
    std::vector<piece_span> path_;
    std::vector<symbol> symbols_;
    std::vector<candidate> agenda_;
    std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> rev_merge_;
    std::uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace feedline::detail
