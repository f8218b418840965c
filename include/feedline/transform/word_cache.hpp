// feedline/transform/word_cache.hpp: one thread's bounded cache of words (pre-tokens) to the pieces an
// encoder found for them. Natural text is Zipfian: a few thousand words make most of it, so most words
// are found here instead of walked. Open addressing over one array of slots, the words' bytes in one
// arena and their pieces in another: three allocations whatever it holds, reused when it starts over.
// Used by the Unigram and BPE encoders (transform/unigram_encoder.hpp, transform/bpe_encoder.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/detail/prefetch.hpp>

namespace feedline::detail {

// A piece of a cached word: its id and byte length.
struct cached_piece {
    std::int32_t id;
    std::uint32_t length;
};

// `Extra` is what an encoder keeps beside a word's pieces (the Unigram encoder: how close its walk's
// comparisons were).
template <class Extra>
class word_cache {
public:
    static constexpr std::size_t default_bytes = std::size_t(8) << 20;

    // One word: a slot of the table. Small, so a budget holds many words: 20 bytes and the encoder's extra.
    struct entry {
        std::uint64_t hash = 0;               // 0: an empty slot
        std::uint32_t key_at = 0, first = 0;  // into the words' and the pieces' arenas
        std::uint8_t key_length = 0, count = 0;
        Extra extra{};
    };
    // Words longer than this are not cached (their length and pieces fit in a byte).
    static constexpr std::size_t max_word_bytes = 255;

    explicit word_cache(std::size_t bytes = default_bytes) : bytes_(bytes) {}

    bool enabled() const noexcept { return bytes_ > 0; }
    static std::uint64_t hash(std::string_view s) noexcept {  // words are short: eight bytes a step, mixed by multiplication
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
        return (h ^ (h >> 29)) | 1;  // 0 marks an empty slot
    }

    // Calls each(word, start, hash) for the words of `s`, each cut before a `separator` (the space
    // symbol), hash 0 for a word longer than `max_bytes`. The next word is found and hashed, and its slot
    // fetched into the CPU's cache, before this one is handed over: the table is megabytes, and its
    // cache miss then overlaps the current word's work instead of following it.
    template <class Each>
    void words(std::string_view s, std::string_view separator, std::size_t max_bytes, Each&& each) const {
        const auto cut = [&](std::size_t start) { return std::min(s.find(separator, start + 1), s.size()); };
        const auto hash_of = [&](std::size_t start, std::size_t end) {
            if (end - start > max_bytes) return std::uint64_t(0);
            const std::uint64_t h = hash(s.substr(start, end - start));
            if (!slots_.empty()) detail::prefetch(&slots_[h & (slots_.size() - 1)]);
            return h;
        };
        std::size_t start = 0, end = cut(0);
        std::uint64_t h = hash_of(0, end);
        while (start < s.size()) {
            const std::size_t next_end = end < s.size() ? cut(end) : end;
            const std::uint64_t next_h = end < s.size() ? hash_of(end, next_end) : 0;
            each(s.substr(start, end - start), start, h);
            start = end, end = next_end, h = next_h;
        }
    }

    // The entry of `w` (its hash `h`), or null.
    const entry* find(std::string_view w, std::uint64_t h) const noexcept {
        if (slots_.empty()) return nullptr;
        for (std::size_t i = h & (slots_.size() - 1); slots_[i].hash; i = (i + 1) & (slots_.size() - 1))
            if (slots_[i].hash == h && slots_[i].key_length == w.size() &&
                std::memcmp(keys_.data() + slots_[i].key_at, w.data(), w.size()) == 0)
                return &slots_[i];
        return nullptr;
    }
    std::span<const cached_piece> pieces(const entry& e) const noexcept { return {pieces_.data() + e.first, e.count}; }

    // Whether a word of `bytes` that missed should be added. Full, the cache keeps what it has (the
    // words met first, in Zipfian text the frequent ones) and new words are not added; after as many
    // misses again as four times its words it starts over, so a cache of a corpus's first domain does
    // not stay forever.
    bool admit(std::size_t bytes) {
        if (!enabled()) return false;
        if (slots_.empty() || (entries_ + 1) * 4 > slots_.size() * 3 ||
            slots_.size() * sizeof(slot) + keys_.size() + bytes + pieces_.size() * sizeof(cached_piece) + 1024 > bytes_) {
            if (!slots_.empty() && ++misses_since_full_ <= 4 * entries_) return false;
            start_over();
        }
        return true;
    }

    // Adds `w` (not in the cache; admitted; at most max_word_bytes) with its pieces, given as the
    // encoder found them: spans of the word with an id, a start and an end. Returns its entry.
    template <class Span>
    const entry& insert(std::string_view w, std::uint64_t h, std::span<const Span> pieces, const Extra& extra) {
        std::size_t i = h & (slots_.size() - 1);
        while (slots_[i].hash) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = {h,
                     static_cast<std::uint32_t>(keys_.size()),
                     static_cast<std::uint32_t>(pieces_.size()),
                     static_cast<std::uint8_t>(w.size()),
                     static_cast<std::uint8_t>(pieces.size()),
                     extra};
        for (const Span& p : pieces) pieces_.push_back({p.id, static_cast<std::uint32_t>(p.end - p.start)});
        keys_.append(w);
        ++entries_;
        return slots_[i];
    }

    std::size_t memory_bytes() const noexcept {
        return slots_.capacity() * sizeof(slot) + keys_.capacity() + pieces_.capacity() * sizeof(cached_piece);
    }

private:
    using slot = entry;
    void start_over() {
        // Slots for half of the budget, at most three quarters of them used.
        std::size_t n = 1024;
        while (n * 2 * sizeof(slot) <= bytes_ / 2) n *= 2;
        slots_.assign(n, slot{});
        keys_.clear();
        pieces_.clear();
        entries_ = 0;
        misses_since_full_ = 0;
    }

    std::size_t bytes_;
    std::vector<slot> slots_;
    std::string keys_;
    std::vector<cached_piece> pieces_;
    std::size_t entries_ = 0, misses_since_full_ = 0;
};

}  // namespace feedline::detail
