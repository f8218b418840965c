// feedline/transform/byte_level_bpe.hpp: feedline's encoder for byte-level BPE models read from a
// tokenizer.json (transform/tokenizer_json.hpp), with the ids of the `tokenizers` package's
// Tokenizer.encode(text, add_special_tokens=False). It follows that library step by step:
//   1. added tokens are cut out of the text, leftmost first and longest there, those matched on the raw
//      text before those matched on normalized text (NFC, transform/unicode_nfc.hpp, where the model
//      asks for it, as Qwen2's does);
//   2. each stretch between them is pre-tokenized: Split patterns, then ByteLevel (a leading space
//      where asked, GPT-2's pattern where asked), every piece in the byte-level alphabet;
//   3. each piece (a word) is merged as `tokenizers`' Word::merge_all does: a heap of pairs, the lowest
//      rank first and the leftmost of equal ranks, a pair that no longer exists skipped; with
//      ignore_merges a word that is itself in the vocabulary is taken whole.
// Words are cached per thread (transform/word_cache.hpp). Text that is not valid UTF-8 is read as
// Python reads bytes.decode("utf-8", errors="replace"): each maximal invalid subpart becomes U+FFFD.
#pragma once

#if FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/transform/tokenizer_json.hpp>
#include <feedline/transform/tokenizer_regex.hpp>
#include <feedline/transform/word_cache.hpp>

namespace feedline::detail {

// The length of the valid UTF-8 sequence at `s[i]`, or 0 with `bad` set to the bytes of its maximal
// invalid subpart (what one U+FFFD replaces).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i, std::size_t& bad) noexcept {
    const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = at(i);
    if (c < 0x80) return 1;
    std::size_t need;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 2, low = c == 0xE0 ? 0xA0 : 0x80, high = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 3, low = c == 0xF0 ? 0x90 : 0x80, high = c == 0xF4 ? 0x8F : 0xBF;
    else {
        bad = 1;
        return 0;
    }
    for (std::size_t k = 1; k <= need; ++k) {
        const bool in_range = i + k < s.size() && at(i + k) >= (k == 1 ? low : 0x80) && at(i + k) <= (k == 1 ? high : 0xBF);
        if (!in_range) {
            bad = k;
            return 0;
        }
    }
    return need + 1;
}

// `text` if it is valid UTF-8, else a copy in `buffer` with each maximal invalid subpart replaced by U+FFFD.
inline std::string_view valid_utf8(std::string_view text, std::string& buffer) {
    std::size_t i = 0;
    for (std::size_t bad = 0; i < text.size();) {
        while (i + 8 <= text.size()) {  // ASCII eight bytes at a time
            std::uint64_t v;
            std::memcpy(&v, text.data() + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= text.size()) break;
        const std::size_t n = utf8_sequence(text, i, bad);
        if (n == 0) break;
        i += n;
    }
    if (i >= text.size()) return text;
    buffer.assign(text.substr(0, i));
    for (std::size_t bad = 0; i < text.size();) {
        const std::size_t n = utf8_sequence(text, i, bad);
        if (n) {
            buffer.append(text.substr(i, n));
            i += n;
        } else {
            buffer.append("\xEF\xBF\xBD");
            i += bad;
        }
    }
    return buffer;
}

class byte_level_bpe_encoder {
public:
    // `max_word_bytes`: the longest word (pre-token) merged; merging takes memory in proportion to it
    // (about 32 bytes a byte), so a longer one (a megabytes-long run of letters or of spaces) is refused.
    explicit byte_level_bpe_encoder(std::shared_ptr<const byte_level_bpe_model> model, std::size_t max_word_bytes = std::size_t(8) << 20,
                                    std::size_t cache_bytes = word_cache<none>::default_bytes)
            : max_word_bytes_(max_word_bytes),
              model_(std::move(model)),
              added_raw_(index_of(model_->added_raw)),
              added_normalized_(index_of(model_->added_normalized)),
              cache_(cache_bytes),
              depth_buffers_(model_->steps.size()) {}

    // Appends the ids of `text` to `out`. Returns an error text, empty on success; `cancel`, when set,
    // stops between words ("interrupted").
    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) {
        cancel_ = cancel;
        problem_.clear();
        const std::string_view valid = valid_utf8(text, utf8_buffer_);
        split_added(
            valid, added_raw_, !model_->added_raw.empty(),
            [&](std::string_view stretch) {
                if (model_->nfc) stretch = nfc_.normalize(stretch, nfc_buffer_);
                split_added(
                    stretch, added_normalized_, !model_->added_normalized.empty(),
                    [&](std::string_view plain) { pre_tokenize(0, plain, out); }, out);
            },
            out);
        // A huge document's copies are given back, not kept per thread.
        for (auto* b : {&utf8_buffer_, &nfc_buffer_})
            if (b->capacity() > (std::size_t(16) << 20)) std::string().swap(*b);
        for (auto& b : depth_buffers_)
            if (b.capacity() > (std::size_t(16) << 20)) std::string().swap(b);
        return problem_;
    }

    std::uint64_t cache_hits() const noexcept { return hits_; }
    std::uint64_t cache_misses() const noexcept { return misses_; }
    std::size_t buffer_bytes() const noexcept {
        return cache_.memory_bytes() + symbols_.capacity() * sizeof(symbol) + agenda_.capacity() * sizeof(pending) +
               utf8_buffer_.capacity() + nfc_buffer_.capacity() + nfc_.buffer_bytes();
    }

private:
    struct none {};
    struct symbol {
        std::int32_t id, prev, next;
        std::uint32_t start, length;  // bytes of the word; length 0: merged into the symbol before
    };
    struct pending {  // a pair that may merge: the left symbol's place, its merge's rank and new id
        std::int32_t rank, pos, id;
    };
    struct span {  // a piece of a word, for the cache
        std::int32_t id;
        std::uint32_t start, end;
    };

    // Added tokens by their first byte, the longest first: what may start a match at a byte.
    using added_index = std::array<std::vector<const byte_level_bpe_model::added_token*>, 256>;
    static added_index index_of(const std::vector<byte_level_bpe_model::added_token>& tokens) {
        added_index index;
        for (const auto& t : tokens) index[static_cast<unsigned char>(t.content[0])].push_back(&t);
        for (auto& list : index)
            std::stable_sort(list.begin(), list.end(), [](const auto* a, const auto* b) { return a->content.size() > b->content.size(); });
        return index;
    }

    // Calls plain(stretch) for the text between `tokens`' matches, appending a match's id to `out`.
    template <class Plain>
    void split_added(std::string_view text, const added_index& tokens, bool any, Plain&& plain, std::vector<std::int32_t>& out) {
        std::size_t done = 0;
        for (std::size_t i = 0; any && i < text.size() && problem_.empty(); ++i) {
            const auto& candidates = tokens[static_cast<unsigned char>(text[i])];
            if (candidates.empty()) continue;
            const byte_level_bpe_model::added_token* found = nullptr;
            for (const auto* t : candidates)
                if (text.compare(i, t->content.size(), t->content) == 0) {
                    found = t;
                    break;
                }
            if (!found) continue;
            if (i > done) plain(text.substr(done, i - done));
            out.push_back(found->id);
            done = i + found->content.size();
            i = done - 1;
        }
        if (done < text.size() && problem_.empty()) plain(text.substr(done));
    }

    // Pre-tokenizer step `depth` on `piece`; past the last step, the piece is a word.
    void pre_tokenize(std::size_t depth, std::string_view piece, std::vector<std::int32_t>& out) {
        if (!problem_.empty()) return;
        if (depth == model_->steps.size()) return encode_word(piece, out);
        const auto& step = model_->steps[depth];
        if (!step.regex) {  // ByteLevel's add_prefix_space
            if (!piece.empty() && piece[0] == ' ') return pre_tokenize(depth + 1, piece, out);
            std::string& spaced = depth_buffers_[depth];
            spaced.assign(1, ' ');
            spaced.append(piece);
            return pre_tokenize(depth + 1, spaced, out);
        }
        if (auto failed = matcher_.split(*step.regex, piece, [&](std::string_view p) { pre_tokenize(depth + 1, p, out); }); !failed.empty())
            problem_ = std::move(failed);
    }

    void encode_word(std::string_view word, std::vector<std::int32_t>& out) {
        if (cancel_ && (words_++ & 1023) == 0 && cancel_->load(std::memory_order_relaxed)) {
            problem_ = "interrupted";
            return;
        }
        const bool cacheable = word.size() <= word_cache<none>::max_word_bytes && cache_.enabled();
        std::uint64_t h = 0;
        if (cacheable) {
            h = word_cache<none>::hash(word);
            if (const auto* e = cache_.find(word, h)) {
                ++hits_;
                for (const auto& p : cache_.pieces(*e)) out.push_back(p.id);
                return;
            }
        }
        ++misses_;
        if (word.size() > max_word_bytes_) {
            problem_ = "a word of " + std::to_string(word.size()) + " bytes (one pre-token) is longer than the " +
                       std::to_string(max_word_bytes_) + " the encoder merges at once (max_unsplit_bytes)";
            return;
        }
        spans_.clear();
        if (const auto whole = model_->ignore_merges ? model_->by_bytes.find(word) : model_->by_bytes.end();
            whole != model_->by_bytes.end())
            spans_.push_back({whole->second, 0, static_cast<std::uint32_t>(word.size())});
        else
            merge(word);
        for (const auto& s : spans_) out.push_back(s.id);
        if (cacheable && cache_.admit(word.size())) cache_.insert(word, h, std::span<const span>(spans_), none{});
    }

    // Word::merge_all of `tokenizers`, over the word's bytes.
    void merge(std::string_view word) {
        symbols_.clear();
        bool pending_unk = false;
        for (std::uint32_t i = 0; i < word.size(); ++i) {
            std::int32_t id = model_->byte_ids[static_cast<unsigned char>(word[i])];
            if (id < 0) {
                if (model_->unk_id < 0) continue;  // dropped, as `tokenizers` drops it without an unknown token
                if (model_->fuse_unk && pending_unk) {
                    ++symbols_.back().length;
                    continue;
                }
                id = model_->unk_id;
                pending_unk = true;
            } else {
                pending_unk = false;
            }
            const auto n = static_cast<std::int32_t>(symbols_.size());
            symbols_.push_back({id, n - 1, n + 1, i, 1});
        }
        if (symbols_.empty()) return;
        symbols_.back().next = -1;

        // The lowest rank on top, then the leftmost.
        const auto later = [](const pending& a, const pending& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
        agenda_.clear();
        for (std::size_t i = 0; i + 1 < symbols_.size(); ++i)
            if (const auto* m = model_->merges.find(symbols_[i].id, symbols_[i + 1].id))
                agenda_.push_back({m->rank, static_cast<std::int32_t>(i), m->id});
        std::make_heap(agenda_.begin(), agenda_.end(), later);
        while (!agenda_.empty()) {
            std::pop_heap(agenda_.begin(), agenda_.end(), later);
            const pending top = agenda_.back();
            agenda_.pop_back();
            symbol& left = symbols_[top.pos];
            if (left.length == 0 || left.next < 0) continue;
            const std::int32_t next_pos = left.next;
            const symbol right = symbols_[next_pos];
            const auto* now = model_->merges.find(left.id, right.id);
            if (!now || now->id != top.id) continue;  // stale: the pair changed since
            left.id = top.id;
            left.length += right.length;
            left.next = right.next;
            symbols_[next_pos].length = 0;
            if (right.next >= 0) symbols_[right.next].prev = top.pos;
            if (left.prev >= 0)
                if (const auto* m = model_->merges.find(symbols_[left.prev].id, left.id)) {
                    agenda_.push_back({m->rank, left.prev, m->id});
                    std::push_heap(agenda_.begin(), agenda_.end(), later);
                }
            if (left.next >= 0)
                if (const auto* m = model_->merges.find(left.id, symbols_[left.next].id)) {
                    agenda_.push_back({m->rank, top.pos, m->id});
                    std::push_heap(agenda_.begin(), agenda_.end(), later);
                }
        }
        for (std::int32_t i = 0; i >= 0; i = symbols_[i].next)
            spans_.push_back({symbols_[i].id, symbols_[i].start, symbols_[i].start + symbols_[i].length});
        if (symbols_.capacity() > (std::size_t(1) << 20)) {  // a huge word: give its memory back
            std::vector<symbol>().swap(symbols_);
            std::vector<pending>().swap(agenda_);
        }
    }

    std::size_t max_word_bytes_;
    std::shared_ptr<const byte_level_bpe_model> model_;
    added_index added_raw_, added_normalized_;
    word_cache<none> cache_;
    regex_matcher matcher_;
    std::vector<std::string> depth_buffers_;
    std::vector<symbol> symbols_;
    std::vector<pending> agenda_;
    std::vector<span> spans_;
    std::string utf8_buffer_, nfc_buffer_;
    unicode_nfc nfc_;
    std::string problem_;
    const std::atomic<bool>* cancel_ = nullptr;
    std::uint64_t hits_ = 0, misses_ = 0, words_ = 0;
};

}  // namespace feedline::detail

#endif  // FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON
