// A dataset described only by its document lengths: what the sampler needs, with no files.
#pragma once

#include <cstdint>
#include <vector>

namespace feedline::test {

struct synthetic_lengths {
    std::vector<std::uint64_t> lengths;
    std::uint64_t document_count() const { return lengths.size(); }
    std::uint64_t document_length(std::uint64_t i) const { return lengths[i]; }
};

// n documents with lengths 0..max-1 from a fixed hash (so empty and 1-token documents occur).
inline synthetic_lengths hashed_lengths(std::uint64_t n, std::uint64_t max, std::uint64_t seed = 1) {
    synthetic_lengths s;
    std::uint64_t x = seed;
    for (std::uint64_t i = 0; i < n; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        s.lengths.push_back((x >> 33) % max);
    }
    return s;
}

}  // namespace feedline::test
