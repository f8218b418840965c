// feedline/sampling/permutation.hpp: a seeded bijection over [0, n) in O(1) memory and O(1) time.
// A balanced Feistel network permutes [0, 2^(2h)) for the smallest even bit width covering n; values
// that land outside [0, n) are fed through again ("cycle walking") until they land inside, which keeps
// it a bijection on [0, n) and takes fewer than 4 rounds of the network on average (2^(2h) < 4n).
// Replaces the O(n) shuffled index arrays of Megatron-style samplers. Feeds sampling/windows.hpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <feedline/error.hpp>

namespace feedline {

// splitmix64's finaliser: a fast 64-bit mixer with full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

class feistel_permutation {
public:
    // Six rounds: four make a Feistel network a strong pseudo-random permutation in theory; the
    // extra two cost ~2 ns and remove any measurable structure at small n (tests check runs and
    // uniformity).
    static constexpr int rounds = 6;

    feistel_permutation() = default;
    // A permutation of [0, n) chosen by `key` (derive it from seed and epoch with mix64). n may be
    // anything up to 2^63. Throws config_error beyond that.
    // Inlined: a mixture's planner makes one for nearly every sample, and out of line its six keys
    // could not overlap the code around the call (perf).
    [[gnu::always_inline]] feistel_permutation(std::uint64_t n, std::uint64_t key) : n_(n) {
        if (n > (std::uint64_t(1) << 63)) [[unlikely]]
            too_large(n);
        unsigned bits = n <= 1 ? 2 : static_cast<unsigned>(std::bit_width(n - 1));
        half_bits_ = (bits + 1) / 2;
        half_mask_ = (std::uint64_t(1) << half_bits_) - 1;
        for (int r = 0; r < rounds; ++r) keys_[r] = mix64(key ^ mix64(static_cast<std::uint64_t>(r) + 0x5851F42D4C957F2Dull));
    }

    std::uint64_t size() const noexcept { return n_; }

    // The image of i. Constant time on average; allocates only to throw; thread-safe. Throws std::out_of_range
    // for i >= size(): cycle walking from outside [0, size()) need never come back into it (the
    // network keeps bits above its width, and a cycle may lie wholly past size()), so an index out of
    // range would loop without end where it now fails.
    std::uint64_t operator()(std::uint64_t i) const {
        check_range(i, 1);
        if (n_ <= 1) return i;
        std::uint64_t x = i;
        do x = encrypt(x);
        while (x >= n_);
        return x;
    }

    // The images of first, first + 1, ..., first + count - 1 into out[0, count): the same values as
    // operator() one at a time, about 4x faster. One at a time, each image is a chain of ~25
    // dependent multiplies (6 rounds, 1-2 walks on average), so the CPU waits on each multiply's
    // latency; here every pass runs the network over all values still outside [0, n), `lanes` of them
    // round by round (encrypt_lanes), so the chains are independent and the multiplies overlap (or
    // vectorise); a last group of fewer values goes through just those (encrypt_some). A batch of 256
    // short windows spent ~40 ns per window in the permutation before, most of its planning
    // (bench_end_to_end). `pending` is scratch (reused: no allocation once warm).
    // Throws std::out_of_range unless [first, first + count) lies in [0, size()).
    void map(std::uint64_t first, std::size_t count, std::uint64_t* out, std::vector<std::uint32_t>& pending) const {
        check_range(first, count);
        for (std::size_t i = 0; i < count; ++i) out[i] = first + i;
        if (n_ <= 1) return;
        pending.resize(count);
        for (std::size_t i = 0; i < count; ++i) pending[i] = static_cast<std::uint32_t>(i);
        std::size_t left = count;
        while (left > 0) {
            for (std::size_t j = 0; j < left; j += lanes) {
                // A last group short of the lanes' width only through those in it: where the network
                // is ~4n, most passes after the first few are a handful of values walking again; a
                // full 16-lane pass for each cost runs of 16 ~85 ns a value, these ~55 (bench_sampling).
                if (const std::size_t m = left - j; m < lanes) {
                    encrypt_some(out, pending.data() + j, m);
                    continue;
                }
                std::uint64_t x[lanes];
                for (std::size_t l = 0; l < lanes; ++l) x[l] = out[pending[j + l]];
                encrypt_lanes(x);
                for (std::size_t l = 0; l < lanes; ++l) out[pending[j + l]] = x[l];
            }
            std::size_t kept = 0;
            for (std::size_t j = 0; j < left; ++j)
                if (out[pending[j]] >= n_) pending[kept++] = pending[j];
            left = kept;
        }
    }

    // The images of in[i] under perms[which[i]] into out[i], i < count: many permutations at once (a
    // mixture's step takes a row or two from each of dozens of domains, each with its epoch's own
    // permutation). The same values as perms[which[i]](in[i]); as map(), every pass runs the network
    // over the values still outside their permutation's range, `lanes` at a time, each lane with its
    // own keys, so the chains are independent: one at a time, each sample was ~25 dependent
    // multiplies, a third of a 100-domain mixture's planning (perf, bench_mixture). `pending` is
    // scratch. Throws std::out_of_range when some in[i] lies outside its permutation, writing nothing.
    static void map_each(const feistel_permutation* perms, const std::uint32_t* which, const std::uint64_t* in, std::size_t count,
                         std::uint64_t* out, std::vector<std::uint32_t>& pending) {
        for (std::size_t i = 0; i < count; ++i) perms[which[i]].check_range(in[i], 1);
        pending.clear();
        for (std::size_t i = 0; i < count; ++i) {
            out[i] = in[i];
            if (perms[which[i]].n_ > 1) pending.push_back(static_cast<std::uint32_t>(i));
        }
        std::size_t left = pending.size();
        while (left > 0) {
            for (std::size_t j = 0; j < left; j += lanes) {
                // Only the lanes in use: the values left to walk again are often a few (a mixture's
                // small epochs walk rarely), and a full width for them cost a third more.
                const std::size_t m = std::min(lanes, left - j);
                const feistel_permutation* p[lanes];
                std::uint64_t l[lanes], r[lanes];
                for (std::size_t k = 0; k < m; ++k) {
                    const std::uint32_t i = pending[j + k];
                    p[k] = &perms[which[i]];
                    l[k] = out[i] >> p[k]->half_bits_;
                    r[k] = out[i] & p[k]->half_mask_;
                }
                for (int round = 0; round < rounds; ++round)
                    for (std::size_t k = 0; k < m; ++k) {
                        const std::uint64_t next = l[k] ^ (mix64(r[k] ^ p[k]->keys_[round]) & p[k]->half_mask_);
                        l[k] = r[k];
                        r[k] = next;
                    }
                for (std::size_t k = 0; k < m; ++k) out[pending[j + k]] = (l[k] << p[k]->half_bits_) | r[k];
            }
            std::size_t kept = 0;
            for (std::size_t j = 0; j < left; ++j)
                if (out[pending[j]] >= perms[which[pending[j]]].n_) pending[kept++] = pending[j];
            left = kept;
        }
    }

    // The inverse: (*this)(inverse(j)) == j. Throws std::out_of_range for j >= size(), as operator().
    std::uint64_t inverse(std::uint64_t j) const {
        check_range(j, 1);
        if (n_ <= 1) return j;
        std::uint64_t x = j;
        do x = decrypt(x);
        while (x >= n_);
        return x;
    }

private:
    // [first, first + count) inside [0, n_) (count 0: anything goes).
    void check_range(std::uint64_t first, std::uint64_t count) const {
        if (count != 0 && (count > n_ || first > n_ - count)) [[unlikely]]
            out_of_range(first, count);
    }
    // The throws, out of line: a mixture's planner makes a permutation and checks an index for every
    // sample, and the strings built inline kept the constructor from being inlined (perf).
    [[noreturn, gnu::noinline, gnu::cold]] static void too_large(std::uint64_t n) {
        throw config_error("permutation size", "must be at most 2^63, got " + std::to_string(n));
    }
    [[noreturn, gnu::noinline, gnu::cold]] void out_of_range(std::uint64_t first, std::uint64_t count) const {
        throw std::out_of_range("permutation of " + std::to_string(n_) + " asked for index " + std::to_string(first) +
                                (count > 1 ? " and the " + std::to_string(count - 1) + " after it" : std::string()));
    }
    std::uint64_t f(int r, std::uint64_t half) const noexcept { return mix64(half ^ keys_[r]) & half_mask_; }

    std::uint64_t encrypt(std::uint64_t x) const noexcept {
        std::uint64_t left = x >> half_bits_, right = x & half_mask_;
        for (int r = 0; r < rounds; ++r) {
            std::uint64_t next = left ^ f(r, right);
            left = right;
            right = next;
        }
        return (left << half_bits_) | right;
    }
    // encrypt() of `lanes` values at once, round by round: independent chains the CPU overlaps. As
    // vectors of four, written out: left to the auto-vectoriser, the same loops came out as vector code
    // or as scalar code depending on what the caller around them looked like (1.3-1.8x apart, perf).
    static constexpr std::size_t lanes = 16;
    using u64x4 = std::uint64_t __attribute__((vector_size(32)));
    // mix64 of each lane, in place (a vector by reference: no vector crosses a call's ABI). Its steps
    // are mix64's, written again for vectors: Permutation.Map.* checks map() against operator().
    [[gnu::always_inline]] static void mix64_lanes(u64x4& x) noexcept {
        x += 0x9E3779B97F4A7C15ull;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
    }
    void encrypt_lanes(std::uint64_t (&x)[lanes]) const noexcept {
        constexpr std::size_t vectors = lanes / 4;
        u64x4 left[vectors], right[vectors];
        for (std::size_t v = 0; v < vectors; ++v) {
            u64x4 value;
            std::memcpy(&value, x + 4 * v, sizeof value);
            left[v] = value >> half_bits_;
            right[v] = value & half_mask_;
        }
        for (int r = 0; r < rounds; ++r)
            for (std::size_t v = 0; v < vectors; ++v) {
                u64x4 mixed = right[v] ^ keys_[r];
                mix64_lanes(mixed);
                const u64x4 next = left[v] ^ (mixed & half_mask_);
                left[v] = right[v];
                right[v] = next;
            }
        for (std::size_t v = 0; v < vectors; ++v) {
            const u64x4 value = (left[v] << half_bits_) | right[v];
            std::memcpy(x + 4 * v, &value, sizeof value);
        }
    }
    // encrypt() of out[at[0..m)], m < lanes, round by round over just those: the few values left to
    // walk again after the first passes (most passes of an epoch whose network is 2-4x its size).
    // Scalar: a handful of chains waits on the multiplies' latency, which vectors do not shorten.
    // Out of line, so map()'s loop around encrypt_lanes stays as small as it was.
    [[gnu::noinline]] void encrypt_some(std::uint64_t* out, const std::uint32_t* at, std::size_t m) const noexcept {
        std::uint64_t left[lanes], right[lanes];
        for (std::size_t l = 0; l < m; ++l) left[l] = out[at[l]] >> half_bits_, right[l] = out[at[l]] & half_mask_;
        for (int r = 0; r < rounds; ++r)
            for (std::size_t l = 0; l < m; ++l) {
                const std::uint64_t next = left[l] ^ f(r, right[l]);
                left[l] = right[l];
                right[l] = next;
            }
        for (std::size_t l = 0; l < m; ++l) out[at[l]] = (left[l] << half_bits_) | right[l];
    }
    std::uint64_t decrypt(std::uint64_t x) const noexcept {
        std::uint64_t left = x >> half_bits_, right = x & half_mask_;
        for (int r = rounds - 1; r >= 0; --r) {
            std::uint64_t prev = right ^ f(r, left);
            right = left;
            left = prev;
        }
        return (left << half_bits_) | right;
    }

    std::uint64_t n_ = 0;
    unsigned half_bits_ = 1;
    std::uint64_t half_mask_ = 1;
    std::uint64_t keys_[rounds] = {};
};

namespace detail {

// The key for (seed, epoch, stream): distinct streams (documents, samples, shard blocks) of the same
// epoch get independent permutations.
[[gnu::always_inline]] constexpr std::uint64_t permutation_key(std::uint64_t seed, std::uint64_t epoch, std::uint64_t stream) noexcept {
    return mix64(mix64(mix64(seed) ^ epoch) ^ (stream * 0xD1342543DE82EF95ull));
}

}  // namespace detail

}  // namespace feedline
