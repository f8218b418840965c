// feedline/transform/sentencepiece_normalizer.hpp: a sentencepiece model's normalizer, reproducing
// libsentencepiece's (normalizer.cc) byte for byte: user-defined symbols kept as they are, then the
// longest rule of the precompiled character map (nmt_nfkc and the others; a darts-clone double array
// followed by the NUL-terminated replacements), else one UTF-8 character, else U+FFFD for one invalid
// byte; leading, trailing and repeated spaces removed (remove_extra_whitespaces), spaces escaped as
// U+2581, and the dummy prefix (or suffix, treat_whitespace_as_suffix) added.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <feedline/transform/byte_trie.hpp>
#include <feedline/transform/sentencepiece_model.hpp>

namespace feedline::detail {

inline constexpr std::string_view space_symbol = "\xe2\x96\x81";  // U+2581, sentencepiece's escaped space

// The byte length sentencepiece assumes for a character from its first byte (util.h OneCharLen).
inline std::size_t one_char_length(unsigned char c) noexcept { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[c >> 4]; }

// sentencepiece's UTF-8 check (util.cc DecodeUTF8 / IsValidDecodeUTF8): the length of a well-formed
// character at the start of `s`, or 0 for an invalid byte (overlong forms and surrogates included).
inline std::size_t valid_utf8_length(std::string_view s) noexcept {
    const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    const auto trail = [&](std::size_t i) { return (b(i) & 0xC0) == 0x80; };
    const auto valid = [](std::uint32_t cp) { return cp < 0xD800 || (cp >= 0xE000 && cp <= 0x10FFFF); };
    if (b(0) < 0x80) return 1;
    if (s.size() >= 2 && (b(0) & 0xE0) == 0xC0) {
        const std::uint32_t cp = ((b(0) & 0x1Fu) << 6) | (b(1) & 0x3Fu);
        if (trail(1) && cp >= 0x80 && valid(cp)) return 2;
    } else if (s.size() >= 3 && (b(0) & 0xF0) == 0xE0) {
        const std::uint32_t cp = ((b(0) & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
        if (trail(1) && trail(2) && cp >= 0x800 && valid(cp)) return 3;
    } else if (s.size() >= 4 && (b(0) & 0xF8) == 0xF0) {
        const std::uint32_t cp = ((b(0) & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
        if (trail(1) && trail(2) && trail(3) && cp >= 0x10000 && valid(cp)) return 4;
    }
    return 0;
}

inline bool is_valid_utf8(std::string_view s) noexcept {
    for (std::size_t i = 0; i < s.size();) {
        const std::size_t n = valid_utf8_length(s.substr(i));
        if (n == 0) return false;
        i += n;
    }
    return true;
}

class sentencepiece_normalizer {
public:
    // `problem()` says why the model's character map cannot be read (then sentencepiece cannot load the
    // model either).
    explicit sentencepiece_normalizer(const sentencepiece_model& m)
            : add_dummy_prefix_(m.add_dummy_prefix),
              remove_extra_whitespaces_(m.remove_extra_whitespaces),
              escape_whitespaces_(m.escape_whitespaces),
              suffix_(m.treat_whitespace_as_suffix) {
        for (const auto& p : m.pieces)
            if (p.type == piece_type::user_defined) user_symbols_.insert(p.text, 1);
        const std::string_view blob = m.precompiled_charsmap;
        if (blob.empty()) {
            mark_plain_leads();
            return;
        }
        std::uint32_t trie_bytes = 0;
        if (blob.size() <= sizeof trie_bytes) {
            problem_ = "its precompiled character map is broken (shorter than its header)";
            return;
        }
        std::memcpy(&trie_bytes, blob.data(), sizeof trie_bytes);  // little-endian, as sentencepiece writes it on x86 and ARM
        if (trie_bytes >= blob.size()) {
            problem_ = "its precompiled character map's trie is larger than the map";
            return;
        }
        units_.resize(trie_bytes / sizeof(std::uint32_t));
        std::memcpy(units_.data(), blob.data() + sizeof trie_bytes, units_.size() * sizeof(std::uint32_t));
        replacements_ = blob.substr(sizeof trie_bytes + trie_bytes);
        mark_plain_leads();
    }

    const std::string& problem() const noexcept { return problem_; }

    // Replaces `out` with `in` normalized. Returns whether `out` is well-formed UTF-8 (the library's
    // rules): always, unless a user-defined symbol or a rule of the map writes bytes that are not.
    bool normalize(std::string_view in, std::string& out) const {
        out.clear();
        if (remove_extra_whitespaces_)
            while (!in.empty()) {
                const auto [replacement, consumed] = prefix(in);
                if (replacement != " ") break;
                in.remove_prefix(consumed);
            }
        if (in.empty()) return true;
        const auto add_space = [&] { out += escape_whitespaces_ ? space_symbol : std::string_view(" "); };
        if (!suffix_ && add_dummy_prefix_) add_space();
        bool previous_space = remove_extra_whitespaces_, valid = true;
        while (!in.empty()) {
            // A run of characters that no rule or user-defined symbol starts with, none a space and
            // each well-formed: each is its own normalization, and nothing before it is stripped.
            std::size_t n = 0;
            while (n < in.size()) {
                const auto c = static_cast<unsigned char>(in[n]);
                if (!plain_lead_[c]) {
                    // An ASCII character that starts rules only together with what follows it (a letter
                    // composed with a combining mark) is plain when the next byte continues none of them.
                    if (c >= 0x80 || !ascii_plain_alone_[c]) break;
                    if (n + 1 < in.size() && ascii_continues_[c][static_cast<unsigned char>(in[n + 1])]) break;
                    ++n;
                    continue;
                }
                if (c < 0x80) {
                    ++n;
                    continue;
                }
                const std::size_t length = valid_utf8_length(in.substr(n));
                if (length == 0) break;
                n += length;
            }
            if (n > 0) {
                out.append(in.data(), n);
                in.remove_prefix(n);
                previous_space = false;
                continue;
            }
            if (in[0] == ' ' && plain_space_) {  // a space no rule starts with: what the general path does with " "
                if (!previous_space) out += escape_whitespaces_ ? space_symbol : std::string_view(" ");
                previous_space = remove_extra_whitespaces_;
                in.remove_prefix(1);
                continue;
            }
            auto [piece, consumed] = prefix(in);
            valid = valid && is_valid_utf8(piece);
            while (previous_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
            if (!piece.empty()) {
                for (char c : piece)
                    if (escape_whitespaces_ && c == ' ')
                        out += space_symbol;
                    else
                        out += c;
                previous_space = piece.back() == ' ';
            }
            in.remove_prefix(consumed);
            if (!remove_extra_whitespaces_) previous_space = false;
        }
        if (remove_extra_whitespaces_) {
            const std::string_view space = escape_whitespaces_ ? space_symbol : std::string_view(" ");
            while (std::string_view(out).ends_with(space)) out.resize(out.size() - space.size());
        }
        if (suffix_ && add_dummy_prefix_) add_space();
        return valid;
    }

    std::size_t memory_bytes() const noexcept {
        return units_.capacity() * sizeof(std::uint32_t) + replacements_.capacity() + user_symbols_.memory_bytes();
    }
    // The model's user-defined symbols (value 1 each): BPE's encoder keeps them whole too.
    const byte_trie& user_symbols() const noexcept { return user_symbols_; }

private:
    // What the start of `in` normalizes to, and how many bytes of `in` that consumes (Normalizer::NormalizePrefix).
    std::pair<std::string_view, std::size_t> prefix(std::string_view in) const {
        if (const auto c = static_cast<unsigned char>(in[0]);
            c < 0x80 && ascii_known_[c] && (in.size() == 1 || !ascii_continues_[c][static_cast<unsigned char>(in[1])]))
            // The longest rule is the character alone, or there is none.
            return {ascii_plain_alone_[c]
                        ? in.substr(0, 1)
                        : std::string_view(replacements_).substr(ascii_replacement_[c].first, ascii_replacement_[c].second),
                    1};
        if (!user_symbols_.empty()) {
            if (const std::size_t n = user_symbols_.longest_prefix(in)) return {in.substr(0, n), n};
        }
        if (!units_.empty()) {
            std::size_t longest = 0;
            std::uint32_t value = 0;
            charsmap_prefixes(in, [&](std::size_t length, std::uint32_t v) {
                if (length > longest) longest = length, value = v;
            });
            if (longest > 0) {
                if (value >= replacements_.size()) return {std::string_view(), longest};  // past the map: a broken map maps to nothing
                const std::string_view rest = std::string_view(replacements_).substr(value);
                return {rest.substr(0, std::min(rest.find('\0'), rest.size())), longest};
            }
        }
        if (const std::size_t n = valid_utf8_length(in)) return {in.substr(0, n), n};
        return {"\xEF\xBF\xBD", 1};  // U+FFFD for the one invalid byte
    }

    // Which bytes start a character that normalizes to itself whatever follows (when well-formed): no
    // user-defined symbol and no rule of the map starts with them (the map's root has no child
    // labelled with the byte), and not a space.
    void mark_plain_leads() {
        for (unsigned c = 1; c < 256; ++c) {
            plain_lead_[c] = c != ' ' && !starts_a_rule(static_cast<unsigned char>(c));
        }
        plain_space_ = !starts_a_rule(' ');
        // ASCII characters no user-defined symbol starts with, that start rules of the map: whether the
        // character alone is one (and what it becomes), and which bytes continue a longer one.
        for (unsigned c = 1; c < 0x80; ++c) {
            if (plain_lead_[c] || user_symbols_.has_key_starting_with(static_cast<unsigned char>(c)) || units_.empty()) continue;
            const auto offset = [](std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
            const auto label = [](std::uint32_t u) { return u & ((1u << 31) | 0xFFu); };
            std::size_t node = offset(units_[0]) ^ c;
            if (node >= units_.size() || label(units_[node]) != c) continue;
            const bool alone_is_a_rule = (units_[node] >> 8) & 1;
            node ^= offset(units_[node]);
            if (alone_is_a_rule) {
                if (node >= units_.size()) continue;
                const std::uint32_t value = units_[node] & ((1u << 31) - 1);
                if (value >= replacements_.size()) continue;  // a broken map: left to the general path
                const std::string_view rest = std::string_view(replacements_).substr(value);
                ascii_replacement_[c] = {value, static_cast<std::uint32_t>(std::min(rest.find('\0'), rest.size()))};
            } else {
                ascii_plain_alone_[c] = true;
            }
            ascii_known_[c] = true;
            for (unsigned b = 0; b < 256; ++b) {
                const std::size_t child = node ^ b;
                ascii_continues_[c][b] = child < units_.size() && label(units_[child]) == b;
            }
        }
    }
    bool starts_a_rule(unsigned char c) const {  // a user-defined symbol, or the map's root has a child labelled c
        if (user_symbols_.has_key_starting_with(c)) return true;
        if (units_.empty()) return false;
        const std::size_t node = ((units_[0] >> 10) << ((units_[0] & (1u << 9)) >> 6)) ^ c;
        return node >= units_.size() || (units_[node] & ((1u << 31) | 0xFFu)) == c;
    }

    // darts-clone's commonPrefixSearch over the map's double array, as the normalizer calls it: at
    // most 32 matches reported (kMaxTrieResultsSize), each visit(length, value). Reads stay inside
    // the array whatever the map holds.
    template <class Visit>
    void charsmap_prefixes(std::string_view key, Visit&& visit) const {
        const auto offset = [](std::uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
        const auto label = [](std::uint32_t u) { return u & ((1u << 31) | 0xFFu); };
        const auto has_leaf = [](std::uint32_t u) { return ((u >> 8) & 1) == 1; };
        std::size_t node = offset(units_[0]), found = 0;
        for (std::size_t i = 0; i < key.size(); ++i) {
            const auto c = static_cast<unsigned char>(key[i]);
            node ^= c;
            if (node >= units_.size()) return;
            const std::uint32_t unit = units_[node];
            if (label(unit) != c) return;
            node ^= offset(unit);
            if (has_leaf(unit)) {
                if (node >= units_.size()) return;
                if (found++ < 32) visit(i + 1, units_[node] & ((1u << 31) - 1));
            }
        }
    }

    bool add_dummy_prefix_, remove_extra_whitespaces_, escape_whitespaces_, suffix_;
    byte_trie user_symbols_;            // matched before the map, and kept as they are
    std::vector<std::uint32_t> units_;  // the map's double array
    std::string replacements_;          // NUL-terminated replacements, at the values the array holds
    std::string problem_;
    std::array<bool, 256> plain_lead_{};  // see mark_plain_leads
    bool plain_space_ = false;            // no rule or user-defined symbol starts with a space
    // ASCII characters that start rules of the map and no user-defined symbol: what the character
    // alone becomes (itself where it is no rule alone), and which bytes continue a longer rule.
    std::array<bool, 128> ascii_known_{}, ascii_plain_alone_{};
    std::array<std::pair<std::uint32_t, std::uint32_t>, 128> ascii_replacement_{};  // in replacements_: where, how long
    std::array<std::bitset<256>, 128> ascii_continues_{};
};

}  // namespace feedline::detail
