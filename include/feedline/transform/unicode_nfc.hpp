// feedline/transform/unicode_nfc.hpp: Unicode Normalization Form C (UAX #15) of UTF-8 text, with the
// tables of the `tokenizers` package's NFC normalizer (transform/unicode_nfc_tables.hpp, generated from
// it), for tokenizer.json models that ask for it (Qwen2's). Text that is already NFC is returned as it
// is, found by one pass that reads ASCII eight bytes at a time and looks each other code point up in a
// bitmap; only the stretches around code points that may change (those that decompose, combining marks,
// the second halves of compositions) are decomposed, put in canonical order and composed again, and the
// text is copied only where one of them comes out different.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/transform/unicode_nfc_tables.hpp>
#include <feedline/transform/utf8.hpp>

namespace feedline::detail {

class unicode_nfc {
public:
    // `text` (valid UTF-8) in NFC: `text` itself when it already is, else `buffer` holding it.
    std::string_view normalize(std::string_view text, std::string& buffer) {
        const tables& t = shared();
        std::size_t i = 0, segment = 0, copied = 0;
        bool changed = false;
        while (i < text.size()) {
            if (i + 8 <= text.size()) {  // ASCII, eight bytes at a time: every ASCII character is a boundary
                std::uint64_t v;
                std::memcpy(&v, text.data() + i, 8);
                if (!(v & 0x8080808080808080ull)) {
                    segment = i + 7;
                    i += 8;
                    continue;
                }
            }
            std::size_t length;
            const std::uint32_t c = decode(text, i, length);
            if (t.is_boundary(c)) {
                segment = i;
                i += length;
                continue;
            }
            // A code point that may change: normalize from the last boundary to the next.
            std::size_t end = i + length;
            while (end < text.size()) {
                std::size_t n;
                if (t.is_boundary(decode(text, end, n))) break;
                end += n;
            }
            // Precomposed letters and Hangul syllables are usually NFC already: copy only on a change.
            segment_.clear();
            const std::string_view before = text.substr(segment, end - segment);
            normalize_segment(before, segment_);
            if (segment_ != before) {
                if (!changed) buffer.clear();
                changed = true;
                buffer.append(text.substr(copied, segment - copied));
                buffer.append(segment_);
                copied = end;
            }
            segment = i = end;
        }
        if (!changed) return text;
        buffer.append(text.substr(copied));
        return buffer;
    }

    std::size_t buffer_bytes() const noexcept { return points_.capacity() * 5 + segment_.capacity(); }

private:
    struct tables {
        // One bit per code point: set where it is not a boundary, i.e. it decomposes, has a combining
        // class, or is the second half of a composition (Hangul's included). Normalization never
        // crosses the start of a boundary, so text is normalized from one to the next independently.
        std::vector<std::uint64_t> not_boundary = std::vector<std::uint64_t>(0x110000 / 64);

        void mark(std::uint32_t c) { not_boundary[c >> 6] |= std::uint64_t(1) << (c & 63); }
        bool is_boundary(std::uint32_t c) const noexcept { return c < 0x80 || !(not_boundary[c >> 6] >> (c & 63) & 1); }

        tables() {
            namespace n = unicode_nfc_tables;
            for (const auto& d : n::decompositions) mark(d.code_point);
            for (const auto& k : n::combining_classes) mark(k.code_point);
            for (const auto& p : n::compositions) mark(p.second);
            for (std::uint32_t c = hangul_first; c <= hangul_last; ++c) mark(c);
            for (std::uint32_t c = jamo_v_first; c < jamo_v_first + jamo_v_count; ++c) mark(c);
            for (std::uint32_t c = jamo_t_first + 1; c < jamo_t_first + jamo_t_count; ++c) mark(c);
        }
    };
    static const tables& shared() {
        static const tables t;
        return t;
    }

    // Hangul syllables (Unicode chapter 3.12): S = first + (L * V count + V) * T count + T.
    static constexpr std::uint32_t hangul_first = 0xAC00, hangul_last = 0xD7A3;
    static constexpr std::uint32_t jamo_l_first = 0x1100, jamo_v_first = 0x1161, jamo_t_first = 0x11A7;
    static constexpr std::uint32_t jamo_l_count = 19, jamo_v_count = 21, jamo_t_count = 28;

    // The code point at text[i] (valid UTF-8) and its length in bytes.
    static std::uint32_t decode(std::string_view text, std::size_t i, std::size_t& length) noexcept {
        const auto b = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(text[i + k])); };
        const std::uint32_t c = b(0);
        if (c < 0x80) return length = 1, c;
        if (c < 0xE0) return length = 2, (c & 0x1F) << 6 | (b(1) & 0x3F);
        if (c < 0xF0) return length = 3, (c & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
        return length = 4, (c & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    }

    static std::uint8_t combining_class(std::uint32_t c) noexcept {
        const auto& all = unicode_nfc_tables::combining_classes;
        const auto* found =
            std::lower_bound(std::begin(all), std::end(all), c, [](const auto& k, std::uint32_t v) { return k.code_point < v; });
        return found != std::end(all) && found->code_point == c ? found->value : 0;
    }

    // The primary composite of `first` and `second`, or 0.
    static std::uint32_t compose(std::uint32_t first, std::uint32_t second) noexcept {
        if (first >= jamo_l_first && first < jamo_l_first + jamo_l_count && second >= jamo_v_first && second < jamo_v_first + jamo_v_count)
            return hangul_first + ((first - jamo_l_first) * jamo_v_count + (second - jamo_v_first)) * jamo_t_count;
        if (first >= hangul_first && first <= hangul_last && (first - hangul_first) % jamo_t_count == 0 && second > jamo_t_first &&
            second < jamo_t_first + jamo_t_count)
            return first + (second - jamo_t_first);
        const auto& all = unicode_nfc_tables::compositions;
        const auto* found = std::lower_bound(std::begin(all), std::end(all), std::pair{first, second}, [](const auto& p, const auto& key) {
            return p.first != key.first ? p.first < key.first : p.second < key.second;
        });
        return found != std::end(all) && found->first == first && found->second == second ? found->composite : 0;
    }

    void decompose(std::uint32_t c) {
        if (c >= hangul_first && c <= hangul_last) {
            const std::uint32_t s = c - hangul_first;
            points_.push_back(jamo_l_first + s / (jamo_v_count * jamo_t_count));
            points_.push_back(jamo_v_first + s % (jamo_v_count * jamo_t_count) / jamo_t_count);
            if (s % jamo_t_count) points_.push_back(jamo_t_first + s % jamo_t_count);
            return;
        }
        const auto& all = unicode_nfc_tables::decompositions;
        const auto* found =
            std::lower_bound(std::begin(all), std::end(all), c, [](const auto& d, std::uint32_t v) { return d.code_point < v; });
        if (found == std::end(all) || found->code_point != c) return points_.push_back(c);
        points_.insert(points_.end(), unicode_nfc_tables::decomposed_points + found->offset,
                       unicode_nfc_tables::decomposed_points + found->offset + found->length);
    }

    // Appends the NFC of `segment` (a boundary code point, or the text's start, and what follows it up
    // to the next boundary) to `out`: decompose, order marks by class (stably), compose.
    void normalize_segment(std::string_view segment, std::string& out) {
        points_.clear();
        for (std::size_t i = 0, n; i < segment.size(); i += n) decompose(decode(segment, i, n));
        classes_.resize(points_.size());
        for (std::size_t i = 0; i < points_.size(); ++i) {
            classes_[i] = combining_class(points_[i]);
            for (std::size_t j = i; classes_[j] && j > 0 && classes_[j - 1] > classes_[j]; --j) {
                std::swap(points_[j], points_[j - 1]);
                std::swap(classes_[j], classes_[j - 1]);
            }
        }
        // Compose: each code point joins the last starter unless a code point kept between them blocks
        // it (a starter, or a mark of the same class or higher). `last` is the class of the last code
        // point kept: 0 when that is the starter itself.
        std::size_t kept = 0, starter = 0;
        bool have_starter = false;
        int last = 0;
        for (std::size_t i = 0; i < points_.size(); ++i) {
            const std::uint32_t c = points_[i];
            const int k = classes_[i];
            if (have_starter && (last < k || last == 0))
                if (const std::uint32_t composite = compose(points_[starter], c)) {
                    points_[starter] = composite;
                    continue;
                }
            if (k == 0) starter = kept, have_starter = true;
            last = k;
            points_[kept++] = c;
        }
        for (std::size_t i = 0; i < kept; ++i) append_utf8(out, points_[i]);
    }

    std::vector<std::uint32_t> points_;
    std::vector<std::uint8_t> classes_;
    std::string segment_;
};

}  // namespace feedline::detail
