// feedline/transform/byte_trie.hpp: a trie over bytes for an encoder's vocabulary: which keys start a
// text, shortest first, one step per byte. The edges live in one open-addressed table (a key per
// (node, byte)); the root's 256 in a direct array, and each of its children's 256 in one more: the
// first two bytes of every lookup cost one load each (most pieces are short), and the table stays a
// single allocation whatever the vocabulary's size.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <string_view>
#include <vector>

namespace feedline::detail {

class byte_trie {
public:
    static constexpr std::int32_t none = -1;

    // Adds `key` (non-empty) with `value` (>= 0); a key added again keeps the last value.
    void insert(std::string_view key, std::int32_t value) {
        std::uint32_t node = 0;
        for (std::size_t i = 0; i < key.size(); ++i) {
            const auto c = static_cast<unsigned char>(key[i]);
            std::uint32_t child = step(node, c);
            if (child == 0) {
                child = static_cast<std::uint32_t>(values_.size());
                values_.push_back(none);
                link(node, c, child);
                if (i == 0) {  // a child of the root: its own block of 256 grandchildren
                    block_of_[c] = static_cast<std::uint32_t>(second_.size() / 256);
                    second_.resize(second_.size() + 256, 0);
                } else if (i == 1) {
                    second_[block_of_[static_cast<unsigned char>(key[0])] * 256 + c] = child;
                }
            }
            node = child;
        }
        values_[node] = value;
    }

    // Calls visit(length, value) for each key that is a prefix of `text`, shortest first.
    template <class Visit>
    void prefixes(std::string_view text, Visit&& visit) const {
        if (text.empty()) return;
        const auto first = static_cast<unsigned char>(text[0]);
        std::uint32_t node = root_[first];
        if (node == 0) return;
        if (values_[node] != none) visit(1, values_[node]);
        if (text.size() < 2) return;
        node = second_[block_of_[first] * 256 + static_cast<unsigned char>(text[1])];
        if (node == 0) return;
        if (values_[node] != none) visit(2, values_[node]);
        for (std::size_t i = 2; i < text.size(); ++i) {
            node = step(node, static_cast<unsigned char>(text[i]));
            if (node == 0) return;
            if (values_[node] != none) visit(i + 1, values_[node]);
        }
    }

    // The longest key that is a prefix of `text`: its length (0: none).
    std::size_t longest_prefix(std::string_view text) const {
        std::size_t longest = 0;
        prefixes(text, [&](std::size_t length, std::int32_t) { longest = length; });
        return longest;
    }

    std::int32_t find(std::string_view key) const {
        if (key.empty()) return none;
        const auto first = static_cast<unsigned char>(key[0]);
        std::uint32_t node = root_[first];
        if (node == 0) return none;
        if (key.size() == 1) return values_[node];
        node = second_[block_of_[first] * 256 + static_cast<unsigned char>(key[1])];
        for (std::size_t i = 2; i < key.size() && node != 0; ++i) node = step(node, static_cast<unsigned char>(key[i]));
        return node == 0 ? none : values_[node];
    }

    bool empty() const noexcept { return values_.size() == 1; }
    bool has_key_starting_with(unsigned char c) const noexcept { return root_[c] != 0; }
    std::size_t memory_bytes() const noexcept {
        return values_.capacity() * sizeof(std::int32_t) + table_.capacity() * sizeof(edge) + second_.capacity() * sizeof(std::uint32_t) +
               sizeof root_ + sizeof block_of_;
    }

private:
    struct edge {
        std::uint64_t key = 0;  // (parent << 8 | byte) + 1; 0: an empty slot
        std::uint32_t child = 0;
    };

    static std::uint64_t hash(std::uint64_t key) noexcept { return key * 0x9E3779B97F4A7C15ull; }

    // The child of `node` along byte `c`; 0 (the root, never a child) when there is none.
    std::uint32_t step(std::uint32_t node, unsigned char c) const noexcept {
        if (node == 0) return root_[c];
        if (table_.empty()) return 0;
        const std::uint64_t key = ((std::uint64_t(node) << 8) | c) + 1;
        for (std::size_t i = hash(key) >> shift_;; i = (i + 1) & (table_.size() - 1)) {
            if (table_[i].key == key) return table_[i].child;
            if (table_[i].key == 0) return 0;
        }
    }

    void link(std::uint32_t node, unsigned char c, std::uint32_t child) {
        if (node == 0) {
            root_[c] = child;
            return;
        }
        if ((edges_ + 1) * 2 > table_.size()) grow();
        place({((std::uint64_t(node) << 8) | c) + 1, child});
        ++edges_;
    }

    void place(edge e) {
        for (std::size_t i = hash(e.key) >> shift_;; i = (i + 1) & (table_.size() - 1))
            if (table_[i].key == 0) {
                table_[i] = e;
                return;
            }
    }

    void grow() {  // twice the slots, at most half of them used
        std::vector<edge> old = std::move(table_);
        const std::size_t slots = old.empty() ? 1024 : old.size() * 2;
        table_.assign(slots, edge{});
        shift_ = 64 - static_cast<unsigned>(std::countr_zero(slots));
        for (const edge& e : old)
            if (e.key) place(e);
    }

    std::vector<std::int32_t> values_ = {none};  // per node; node 0 is the root
    std::array<std::uint32_t, 256> root_{};
    std::array<std::uint32_t, 256> block_of_{};  // a child of the root: where its grandchildren's block starts in second_, / 256
    std::vector<std::uint32_t> second_;          // the root's grandchildren, 256 per child
    std::vector<edge> table_;
    std::size_t edges_ = 0;
    unsigned shift_ = 64;
};

}  // namespace feedline::detail
