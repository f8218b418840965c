// Sampling: the permutation is a bijection with no visible structure; windows and packed rows hold
// exactly the tokens a brute-force concatenation says they should; ranks split every global batch
// disjointly; resume is exact (also elastic, across world sizes); blending keeps every prefix within
// one sample of its weights; state serialisation round-trips and refuses what does not match.
#include <doctest/doctest.h>

#include <feedline/format/dataset.hpp>
#include <feedline/sampling/state_io.hpp>
#include <feedline/storage/pread_reader.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "synthetic_lengths.hpp"
#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// The concatenated stream of an epoch, token by token, as (document, offset) pairs.
std::vector<std::pair<std::uint64_t, std::uint64_t>> brute_stream(const detail::epoch_layout& layout, const ft::synthetic_lengths& d) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (std::uint64_t k = 0; k < layout.documents(); ++k) {
        std::uint64_t doc = layout.document_at(k);
        for (std::uint64_t t = 0; t < d.lengths[doc]; ++t) out.push_back({doc, t});
    }
    return out;
}

std::vector<std::pair<std::uint64_t, std::uint64_t>> expand(const std::vector<segment>& segs) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
    for (auto& s : segs)
        for (std::uint64_t t = 0; t < s.length; ++t) out.push_back({s.document, s.offset + t});
    return out;
}

using sample_id = std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, bool>;
std::vector<sample_id> ids(const batch_plan& b) {
    std::vector<sample_id> v;
    for (auto& s : b.samples) v.emplace_back(s.dataset, s.epoch, s.index, s.padding);
    return v;
}

}  // namespace

TEST_CASE("Permutation.Bijective.ExhaustiveForSmallSizes") {
    std::vector<std::uint64_t> sizes;
    for (std::uint64_t n = 1; n <= 130; ++n) sizes.push_back(n);
    for (std::uint64_t p : {251ull, 509ull, 1021ull, 4093ull, 65521ull}) sizes.push_back(p);
    for (unsigned b = 8; b <= 16; b += 2) {
        sizes.push_back((1ull << b) - 1);
        sizes.push_back(1ull << b);
        sizes.push_back((1ull << b) + 1);
    }
    for (std::uint64_t n : sizes) {
        for (std::uint64_t key : {1ull, 99ull}) {
            feistel_permutation p(n, key);
            std::vector<char> seen(n, 0);
            bool ok = true;
            for (std::uint64_t i = 0; i < n; ++i) {
                std::uint64_t j = p(i);
                ok &= j < n && !seen[j] && p.inverse(j) == i;
                if (j < n) seen[j] = 1;
            }
            REQUIRE_MESSAGE(ok, "n = " << n);
        }
    }
}

TEST_CASE("Permutation.Map.EqualsOneAtATimeForEveryRunAndSize") {
    // map() runs the network over many values at once (the planner's fast path): it must give the
    // very images operator() gives, for sizes where most values walk once and where they walk often
    // (n just above a power of four: the domain is ~4n), from any first value, runs of 0 to 300, up to
    // the largest n (2^63: halves of 32 bits, the widest shifts of the vector rounds).
    std::vector<std::uint32_t> scratch;
    for (std::uint64_t n :
         std::vector<std::uint64_t>{1, 2, 3, 6, 17, 1000, 65537, (1ull << 20) + 3, 1'000'000'000'039ull, std::uint64_t{1} << 63}) {
        const feistel_permutation p(n, detail::permutation_key(7, n, 0));
        for (std::uint64_t first : std::vector<std::uint64_t>{0, 1, n / 3, n > 300 ? n - 300 : 0}) {
            const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(300, n - first));
            for (std::size_t run : {std::size_t{0}, std::size_t{1}, std::size_t{7}, count}) {
                if (run > count) continue;  // values at or past n are outside the permutation
                std::vector<std::uint64_t> out(run + 1, 12345);
                p.map(first, run, out.data(), scratch);
                for (std::size_t i = 0; i < run; ++i) REQUIRE_MESSAGE(out[i] == p(first + i), "n = " << n << ", value " << first + i);
                CHECK(out[run] == 12345);  // nothing past the run is written
            }
        }
    }
}

TEST_CASE("Permutation.MapEach.EqualsEachPermutationOneAtATime") {
    // map_each runs many permutations' networks side by side (a mixture's step: a sample or two from
    // each of dozens of domains): every image must be the one its own permutation gives, for small
    // sizes that rarely walk and sizes just past a power of four that walk often, for permutations
    // shared by several values and used once, and for any count around the lanes' width.
    std::vector<feistel_permutation> perms;
    for (std::uint64_t n : std::vector<std::uint64_t>{1, 2, 3, 6, 15, 17, 1000, 1562, 65537, (1ull << 20) + 3, 1'000'000'000'039ull})
        for (std::uint64_t epoch = 0; epoch < 3; ++epoch) perms.emplace_back(n, detail::permutation_key(11, epoch, n));
    std::mt19937_64 rng(5);
    std::vector<std::uint32_t> scratch;
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17}, std::size_t{40}, std::size_t{300}}) {
        std::vector<std::uint32_t> which(count);
        std::vector<std::uint64_t> in(count), out(count + 1, 777);
        for (std::size_t i = 0; i < count; ++i) {
            which[i] = static_cast<std::uint32_t>(rng() % perms.size());
            in[i] = rng() % perms[which[i]].size();
        }
        feistel_permutation::map_each(perms.data(), which.data(), in.data(), count, out.data(), scratch);
        for (std::size_t i = 0; i < count; ++i)
            REQUIRE_MESSAGE(out[i] == perms[which[i]](in[i]), "n = " << perms[which[i]].size() << ", value " << in[i]);
        CHECK(out[count] == 777);  // nothing past the count is written
    }
    // One value outside its permutation: thrown before anything is written.
    const std::vector<std::uint32_t> which{0, 3, 6};
    const std::vector<std::uint64_t> in{0, 1, perms[6].size()};
    std::vector<std::uint64_t> out(3, 777);
    CHECK_THROWS_AS(feistel_permutation::map_each(perms.data(), which.data(), in.data(), 3, out.data(), scratch), std::out_of_range);
    CHECK(out == std::vector<std::uint64_t>(3, 777));
}

TEST_CASE("Permutation.OutOfRange.ThrowsInsteadOfWalkingForever") {
    // Cycle walking from an index at or past n need never come back below n (bits above the
    // network's width stay; a cycle may lie wholly past n): such an index must fail, not hang.
    std::vector<std::uint32_t> scratch;
    for (std::uint64_t n : std::vector<std::uint64_t>{0, 1, 2, 5, 16, 17, 1000, (1ull << 20) + 3}) {
        const feistel_permutation p(n, detail::permutation_key(3, n, 0));
        for (std::uint64_t i : std::vector<std::uint64_t>{n, n + 1, 4 * n + 7, ~std::uint64_t{0}}) {
            CHECK_THROWS_AS(p(i), std::out_of_range);
            CHECK_THROWS_AS(p.inverse(i), std::out_of_range);
        }
        std::vector<std::uint64_t> out(8);
        CHECK_THROWS_AS(p.map(n, 1, out.data(), scratch), std::out_of_range);
        if (n > 0) {
            CHECK_THROWS_AS(p.map(n - 1, 2, out.data(), scratch), std::out_of_range);            // the run's last one is out
            CHECK_THROWS_AS(p.map(1, ~std::size_t{0}, out.data(), scratch), std::out_of_range);  // first + count wraps
            CHECK(p(n - 1) < n);                                                                 // the last index is in
            p.map(n - 1, 1, out.data(), scratch);
            CHECK(out[0] == p(n - 1));
        }
        p.map(n, 0, out.data(), scratch);  // an empty run anywhere is nothing to permute
    }
}

TEST_CASE("Permutation.Keys.SeedAndEpochChangeIt") {
    const std::uint64_t n = 1000;
    feistel_permutation a(n, detail::permutation_key(1, 0, 0)), b(n, detail::permutation_key(2, 0, 0)),
        c(n, detail::permutation_key(1, 1, 0));
    std::uint64_t same_ab = 0, same_ac = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        same_ab += a(i) == b(i);
        same_ac += a(i) == c(i);
    }
    CHECK(same_ab < 20);  // a random pair of permutations agrees on ~1 point
    CHECK(same_ac < 20);
}

TEST_CASE("Permutation.Statistics.UniformAndNoAdjacentRuns") {
    const std::uint64_t n = 1'000'000'000'039ull;  // large, not a power of two
    feistel_permutation p(n, detail::permutation_key(7, 3, 0));
    const int buckets = 16;
    std::vector<double> counts(buckets, 0);
    const int samples = 160'000;
    int adjacent = 0;
    std::uint64_t prev = p(0);
    for (int i = 1; i <= samples; ++i) {
        std::uint64_t v = p(static_cast<std::uint64_t>(i));
        counts[static_cast<std::size_t>(static_cast<double>(v) / static_cast<double>(n) * buckets)] += 1;
        std::uint64_t diff = v > prev ? v - prev : prev - v;
        adjacent += diff <= 1;
        prev = v;
    }
    double expected = samples / double(buckets), chi2 = 0;
    for (double c : counts) chi2 += (c - expected) * (c - expected) / expected;
    CHECK(chi2 < 50);      // 15 degrees of freedom: p < 1e-5 above 50 for a uniform source
    CHECK(adjacent == 0);  // consecutive inputs never stay neighbours
}

TEST_CASE("Windows.BlockSearch.AgreesWithStdBounds") {
    std::mt19937_64 rng(8);
    for (std::size_t n : {std::size_t(1), std::size_t(63), std::size_t(64), std::size_t(65), std::size_t(1000), std::size_t(4097)}) {
        std::vector<std::uint64_t> v(n);
        std::uint64_t x = 0;
        for (auto& e : v) e = x += rng() % 3;  // runs of equal values (empty documents)
        block_search s;
        s.build(v);
        for (std::uint64_t q = 0; q <= x + 1; ++q) {
            REQUIRE(s.upper_bound(v, q) == static_cast<std::size_t>(std::upper_bound(v.begin(), v.end(), q) - v.begin()));
            REQUIRE(s.lower_bound(v, q) == static_cast<std::size_t>(std::lower_bound(v.begin(), v.end(), q) - v.begin()));
        }
    }
}

// position_of_token looks in a bucket of about a document's length, then among the documents
// starting in it: it must agree with a binary search over all prefix sums for every token, whatever
// the lengths (empty documents, one huge document among thousands of 1-token ones, one document).
TEST_CASE("Windows.Layout.PositionOfTokenAgreesWithABinarySearchForSkewedLengths") {
    std::vector<ft::synthetic_lengths> cases;
    cases.push_back(ft::hashed_lengths(500, 40));            // short, with empty ones
    cases.push_back({std::vector<std::uint64_t>(3000, 1)});  // every document 1 token
    cases.back().lengths[1500] = 200000;                     // ... and one huge one
    cases.push_back({{0, 0, 7, 0, 0, 0, 9, 0}});             // mostly empty
    cases.push_back({{123457}});                             // one document
    auto big = ft::hashed_lengths(2000, 3000, 7);            // long, spread
    for (std::size_t i = 0; i < big.lengths.size(); i += 97) big.lengths[i] = 0;
    cases.push_back(big);
    for (const auto& data : cases)
        for (auto mode : {shuffle_mode::none, shuffle_mode::global}) {
            detail::epoch_layout layout(data, mode, 5, 1);
            std::vector<std::uint64_t> prefix;
            for (std::uint64_t k = 0; k <= layout.documents(); ++k)
                prefix.push_back(k < layout.documents() ? layout.first_token_at(k) : layout.tokens());
            std::uint64_t wrong = 0, empty = 0;  // counted, not asserted per token: 10^6 tokens
            for (std::uint64_t p = 0; p < layout.tokens(); ++p) {
                const auto want = static_cast<std::uint64_t>(std::upper_bound(prefix.begin(), prefix.end(), p) - prefix.begin()) - 1;
                wrong += layout.position_of_token(p) != want;
                empty += layout.length_at(want) == 0;  // empty documents are never the answer
            }
            CHECK(wrong == 0);
            CHECK(empty == 0);
        }
}

// A stream's layout is one allocation, its tables right after it (epoch_layout::make: a mixture keeps
// one per domain of a few shards or a Megatron pair); a layout made elsewhere keeps them in a block of
// its own. Both answer alike, with the buckets past 16 documents and a plain search below, and hold
// exactly their tables' bytes: prefix sums, the order when shuffled, and at most one bucket a
// document (plus one).
TEST_CASE("EpochLayout.OneAllocationHoldsTheLayoutAndExactlyItsTables") {
    const std::vector<ft::synthetic_lengths> cases{{{}},
                                                   {{0}},
                                                   {{7}},
                                                   {{5000}},
                                                   {{3, 4}},
                                                   {{0, 9, 2}},
                                                   {{6, 0, 1, 8}},
                                                   {{4000, 1, 70000, 3}},
                                                   {{5, 1, 9, 2, 7, 3, 8, 4, 6, 10, 2, 5}},
                                                   {{5, 1, 9, 2, 7, 3, 8, 4, 6, 10, 2, 5, 1, 1, 1, 300, 2}},
                                                   {{5, 1, 9, 2, 7, 3, 8, 4, 6, 10, 2, 5, 1, 1, 1, 300, 2, 0, 0, 17, 64, 65, 1, 2}},
                                                   // Past 2^32 tokens in a few documents, and past 256 documents: 8-byte sums.
                                                   {{3'000'000'000, 0, 2'000'000'000, 5}},
                                                   {{4'294'967'295}},
                                                   ft::hashed_lengths(300, 90, 4)};
    for (const auto& data : cases)
        for (auto mode : {shuffle_mode::none, shuffle_mode::global, shuffle_mode::shard_blocks}) {
            const std::uint64_t n = data.lengths.size();
            if (n == 0 && mode == shuffle_mode::shard_blocks) continue;  // a block needs a document
            CAPTURE(n);
            CAPTURE(static_cast<int>(mode));
            detail::epoch_layout layout(data, mode, 3, 2, std::vector<std::uint64_t>{0});
            const auto made = detail::epoch_layout::make(data, mode, 3, 2, std::vector<std::uint64_t>{0});
            REQUIRE(layout.documents() == n);
            REQUIRE(made->documents() == n);
            CHECK(made->tokens() == layout.tokens());
            CHECK(layout.tokens() == std::accumulate(data.lengths.begin(), data.lengths.end(), std::uint64_t{0}));
            std::vector<std::uint64_t> order;
            for (std::uint64_t k = 0; k < n; ++k) {
                order.push_back(layout.document_at(k));
                CHECK(made->document_at(k) == layout.document_at(k));
                CHECK(made->length_at(k) == layout.length_at(k));
            }
            std::sort(order.begin(), order.end());
            for (std::uint64_t k = 0; k < n; ++k) CHECK(order[k] == k);
            // Each document's first and last token are found in it, at their offsets.
            for (std::uint64_t k = 0; k < n; ++k) {
                if (layout.length_at(k) == 0) continue;
                for (const std::uint64_t at : {std::uint64_t{0}, layout.length_at(k) - 1}) {
                    std::vector<segment> segs;
                    made->segments(made->first_token_at(k) + at, 1, segs);
                    REQUIRE(segs.size() == 1);
                    CHECK(segs[0].document == layout.document_at(k));
                    CHECK(segs[0].offset == at);
                }
            }
            const std::uint64_t total = layout.tokens();
            if (mode != shuffle_mode::shard_blocks) {
                const bool narrow = n <= 256 && total <= 0xFFFFFFFFu;  // 4-byte prefix sums
                const std::size_t prefix = (narrow ? 4 : 8) * (n + 1), order = mode == shuffle_mode::global ? 4 * n : 0, buckets = n > 16 ? 4 * (n + 1) : 0;
                const std::size_t tables = (prefix + order + buckets + 7) / 8 * 8;
                CHECK(layout.memory_bytes() == sizeof(detail::epoch_layout) + tables);
                CHECK(made->memory_bytes() == sizeof(detail::epoch_layout) + tables);
            }
            if (total > 1'000'000) continue;  // the brute stream below holds every token
            // Every token's document, against the brute stream.
            const auto stream = brute_stream(layout, data);
            REQUIRE(stream.size() == layout.tokens());
            for (std::uint64_t p = 0; p < layout.tokens(); ++p) {
                std::vector<segment> segs;
                layout.segments(p, 1, segs);
                made->segments(p, 1, segs);
                REQUIRE(segs.size() == 2);
                CHECK(std::make_pair(segs[0].document, segs[0].offset) == stream[p]);
                CHECK(std::make_pair(segs[1].document, segs[1].offset) == stream[p]);
            }
        }
}

// A one-document dataset in windows mode keeps no epoch layout (a mixture's one-shard domains): its
// windows must be the ones the layout gives. The same tokens with an empty second document take the
// layout's path and name the same document, offsets and shuffled order, in every epoch and shuffle.
TEST_CASE("Stream.OneDocument.WindowsWithoutALayoutAreTheLayoutsWindows") {
    for (const std::uint64_t tokens : {std::uint64_t{17}, std::uint64_t{257}, std::uint64_t{1000}, std::uint64_t{4097}})
        for (auto shuffle : {shuffle_mode::none, shuffle_mode::global, shuffle_mode::shard_blocks})
            for (const bool shuffle_samples : {false, true}) {
                CAPTURE(tokens);
                CAPTURE(static_cast<int>(shuffle));
                CAPTURE(shuffle_samples);
                const sampler_config c{.seq_len = 16, .global_batch = 4, .seed = 9, .shuffle = shuffle, .shuffle_samples = shuffle_samples};
                const ft::synthetic_lengths one{{tokens}}, with_empty{{tokens, 0}};
                dataset_stream bare(one, c, 3), laid_out(with_empty, c, 3);
                REQUIRE(bare.tokens() == laid_out.tokens());
                REQUIRE(bare.samples_per_epoch() == laid_out.samples_per_epoch());
                REQUIRE(bare.samples_per_epoch() == (tokens - 1) / 16);
                CHECK(bare.memory_bytes() == 0);
                CHECK(laid_out.memory_bytes() > 0);
                plan_scratch scratch;
                for (std::uint64_t epoch : {0, 1, 5, 0, 2}) {
                    const std::uint64_t n = bare.samples_in_epoch(epoch);
                    if (epoch == 2) {  // plan() first in a new epoch: it must take the epoch's order itself
                        sample_plan first, expected;
                        bare.plan(epoch, n - 1, first);
                        laid_out.plan(epoch, n - 1, expected);
                        CHECK(first.segments == expected.segments);
                    }
                    std::vector<sample_plan> run(n), laid_out_run(n);
                    bare.plan_run(epoch, 0, n, run.data(), scratch);
                    laid_out.plan_run(epoch, 0, n, laid_out_run.data(), scratch);
                    for (std::uint64_t i = 0; i < n; ++i) {
                        sample_plan one_at_a_time;
                        bare.plan(epoch, i, one_at_a_time);
                        REQUIRE(one_at_a_time.segments.size() == 1);
                        CHECK(one_at_a_time.segments == run[i].segments);
                        CHECK(run[i].segments == laid_out_run[i].segments);
                        CHECK(run[i].epoch == epoch);
                        CHECK(run[i].dataset == 3);
                    }
                }
            }
    const sampler_config no_windows{.seq_len = 16, .global_batch = 4};
    CHECK_THROWS_AS(dataset_stream(ft::synthetic_lengths{{16}}, no_windows, 0), config_error);  // 16 tokens: no window of 17
}

// A stream of a few documents (a mixture's domain of a few shards) lays each later epoch out from the
// lengths in the epoch before's layout, not the dataset's, and every stream takes the shard blocks
// from there too (it keeps no copy of its own): every epoch's samples must still be those
// of that epoch laid out from the dataset, in windows and packed rows, under every shuffle (the
// stream's order of them aside), in epochs visited out of order. Up to 64 documents the stream keeps
// no hold on the dataset at all (its copy here is freed once the stream is made: a use after that is
// a sanitizer's error); 65 and more take the dataset's lengths each time.
TEST_CASE("Stream.FewDocuments.EveryEpochHasTheLayoutOfTheDatasetsLengths") {
    std::vector<ft::synthetic_lengths> sets{{{50, 7, 300}}, {{1, 2, 3, 400}}, {{40, 0, 90}}, {{33, 120}}, {{10, 20, 30, 40, 50}}};
    for (const std::uint64_t n : {64, 65, 90}) {
        ft::synthetic_lengths many;
        for (std::uint64_t i = 0; i < n; ++i) many.lengths.push_back((i * 37) % 50 + (i % 7 == 0 ? 0 : 3));
        sets.push_back(many);
    }
    for (const auto& data : sets)
        for (auto mode : {sample_mode::windows, sample_mode::packed})
            for (auto shuffle : {shuffle_mode::none, shuffle_mode::global, shuffle_mode::shard_blocks}) {
                CAPTURE(data.lengths.size());
                CAPTURE(static_cast<int>(mode));
                CAPTURE(static_cast<int>(shuffle));
                const sampler_config c{.seq_len = 16, .global_batch = 4, .seed = 21, .mode = mode, .shuffle = shuffle};
                const std::vector<std::uint64_t> blocks{0, 2};  // shard_blocks: two blocks
                auto owned = std::make_unique<ft::synthetic_lengths>(data);
                dataset_stream stream(*owned, c, 0, blocks);
                if (data.lengths.size() <= 64) owned.reset();
                plan_scratch scratch;
                auto sorted = [](std::vector<std::vector<segment>> v) {
                    auto key = [](const std::vector<segment>& x) {
                        std::vector<std::uint64_t> k;
                        for (const segment& g : x) k.insert(k.end(), {g.document, g.offset, g.length});
                        return k;
                    };
                    std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
                    return v;
                };
                for (std::uint64_t epoch : {0, 1, 2, 5, 3, 1, 6}) {
                    CAPTURE(epoch);
                    const detail::epoch_layout layout(data, shuffle, c.seed, epoch, blocks);
                    std::vector<std::vector<segment>> want;
                    if (mode == sample_mode::windows) {
                        const detail::gpt_windows w(layout, c.seq_len);
                        for (std::uint64_t i = 0; i < w.count(); ++i) w.segments(i, want.emplace_back());
                    } else {
                        const detail::packed_rows rows(layout, c.seq_len);
                        for (std::uint64_t i = 0; i < rows.count(); ++i) rows.segments(i, want.emplace_back());
                    }
                    const std::uint64_t n = stream.samples_in_epoch(epoch);
                    REQUIRE(n == want.size());
                    std::vector<sample_plan> run(n);
                    stream.plan_run(epoch, 0, n, run.data(), scratch);
                    std::vector<std::vector<segment>> got;
                    for (const auto& p : run) got.push_back(p.segments);
                    CHECK(sorted(got) == sorted(want));
                }
            }
}

TEST_CASE("Windows.Gpt.EveryTokenIsATargetOncePerEpoch") {
    auto data = ft::hashed_lengths(300, 40);
    data.lengths[5] = 0;
    data.lengths[6] = 1;
    for (auto mode : {shuffle_mode::none, shuffle_mode::global, shuffle_mode::shard_blocks}) {
        std::vector<std::uint64_t> blocks = {0, 100, 150, 290};
        detail::epoch_layout layout(data, mode, 11, 2, blocks);
        auto stream = brute_stream(layout, data);
        const std::uint64_t T = 17;
        detail::gpt_windows w(layout, T);
        REQUIRE(w.count() == (stream.size() - 1) / T);
        for (std::uint64_t s = 0; s < w.count(); ++s) {
            std::vector<segment> segs;
            w.segments(s, segs);
            auto got = expand(segs);
            REQUIRE(got.size() == T + 1);
            REQUIRE(std::equal(got.begin(), got.end(), stream.begin() + static_cast<std::ptrdiff_t>(s * T)));
        }
        // Orders: none keeps dataset order; every mode visits each document once.
        std::vector<std::uint64_t> order;
        for (std::uint64_t k = 0; k < layout.documents(); ++k) order.push_back(layout.document_at(k));
        auto sorted = order;
        std::sort(sorted.begin(), sorted.end());
        std::vector<std::uint64_t> all(data.lengths.size());
        std::iota(all.begin(), all.end(), 0);
        CHECK(sorted == all);
        if (mode == shuffle_mode::none) CHECK(order == all);
        if (mode == shuffle_mode::global) CHECK(order != all);
        if (mode == shuffle_mode::shard_blocks) {
            // Each block's documents are contiguous in epoch order.
            auto block_of = [&](std::uint64_t d) { return std::upper_bound(blocks.begin(), blocks.end(), d) - blocks.begin(); };
            int changes = 0;
            for (std::size_t k = 1; k < order.size(); ++k) changes += block_of(order[k]) != block_of(order[k - 1]);
            CHECK(changes == 3);
            CHECK(order != all);
        }
    }
}

TEST_CASE("Windows.Packed.WholeDocumentsSplitOnlyWhenLongerThanARow") {
    auto data = ft::hashed_lengths(400, 70);
    data.lengths[3] = 0;
    data.lengths[4] = 200;  // longer than a row: split
    detail::epoch_layout layout(data, shuffle_mode::global, 5, 0);
    const std::uint64_t T = 64;
    detail::packed_rows rows(layout, T);
    auto stream = brute_stream(layout, data);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> all;
    std::uint64_t used = 0, previous_gap = 0;
    for (std::uint64_t r = 0; r < rows.count(); ++r) {
        std::vector<segment> segs;
        rows.segments(r, segs);
        std::uint64_t in_row = 0;
        for (auto& s : segs) {
            in_row += s.length;
            // Only documents longer than a row are ever split.
            if (s.length < data.lengths[s.document]) REQUIRE(data.lengths[s.document] > T);
        }
        REQUIRE(in_row <= T);
        // Padding at the end of a row is there only because the next document did not fit in it.
        if (previous_gap > 0) REQUIRE(segs.front().length > previous_gap);
        previous_gap = T - in_row;
        used += in_row;
        auto e = expand(segs);
        all.insert(all.end(), e.begin(), e.end());
    }
    CHECK(all == stream);  // every token once, in epoch order
    CHECK(rows.padding() == rows.count() * T - used);
}

TEST_CASE("Windows.Packed.BoundariesRestartPositionsAtEveryPiece") {
    const std::uint64_t T = 16;
    std::vector<segment> pieces = {{7, 30, 5}, {2, 0, 0}, {9, 0, 8}};  // a split document's tail, an empty one, a whole one
    detail::row_boundaries b;
    detail::boundaries_of(pieces, T, b);
    CHECK(b.cu_seqlens == std::vector<std::int32_t>{0, 5, 13});
    CHECK(b.padding == 3);
    std::vector<std::int32_t> expected = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0};
    CHECK(b.position_ids == expected);
    std::vector<segment> too_many = {{1, 0, 10}, {2, 0, 7}};
    CHECK_THROWS_AS(detail::boundaries_of(too_many, T, b), config_error);

    // On real rows: cu_seqlens end where the row's tokens end, and padding adds up to the epoch's.
    auto data = ft::hashed_lengths(300, 50);
    detail::epoch_layout layout(data, shuffle_mode::global, 3, 1);
    detail::packed_rows rows(layout, 48);
    std::uint64_t padding = 0;
    for (std::uint64_t r = 0; r < rows.count(); ++r) {
        std::vector<segment> segs;
        rows.segments(r, segs);
        detail::boundaries_of(segs, 48, b);
        std::uint64_t used = 0;
        for (auto& x : segs) used += x.length;
        REQUIRE(static_cast<std::uint64_t>(b.cu_seqlens.back()) == used);
        padding += b.padding;
    }
    CHECK(padding == rows.padding());
}

TEST_CASE("Sampler.Packed.EpochsDifferInLengthAndResumeExactly") {
    auto data = ft::hashed_lengths(400, 90);
    sampler_config cfg{.seq_len = 64, .global_batch = 5, .seed = 9, .mode = sample_mode::packed, .rank = 0, .world_size = 1};
    sampler s(data, cfg);
    // Different document orders pad differently, so epochs have different row counts; every epoch
    // still gives each of its rows exactly once before the next begins.
    std::set<std::uint64_t> counts;
    std::vector<std::vector<segment>> all;
    for (std::uint64_t e = 0; e < 4; ++e) {
        const std::uint64_t steps = s.steps_in_epoch(e), rows = s.stream(0).samples_per_epoch();
        counts.insert(s.steps_in_epoch(e) * 5 + s.dropped_in_epoch(e));
        std::set<std::uint64_t> seen;
        for (std::uint64_t k = 0; k < steps; ++k) {
            auto b = s.next();
            REQUIRE(b.epoch == e);
            for (auto& x : b.samples) {
                REQUIRE(seen.insert(x.index).second);
                all.push_back(x.segments);
            }
        }
        CHECK(seen.size() == rows - rows % 5);
    }
    CHECK(counts.size() > 1);
    // plan_at walks the differing epochs to the same place, and a restored sampler continues exactly.
    sampler t(data, cfg);
    std::uint64_t step = t.steps_in_epoch(0) + t.steps_in_epoch(1) + 2;
    auto at = t.plan_at(step);
    std::vector<std::vector<segment>> from_plan;
    for (auto& x : at.samples) from_plan.push_back(x.segments);
    CHECK(std::equal(from_plan.begin(), from_plan.end(), all.begin() + static_cast<std::ptrdiff_t>(step * 5)));
    sampler u(data, cfg);
    for (std::uint64_t k = 0; k < step; ++k) u.next();
    sampler v(data, cfg);
    v.restore(detail::sampler_state_from_bytes(detail::to_bytes(u.state())));
    CHECK(v.next().samples[0].segments == all[step * 5]);
}

TEST_CASE("Sampler.RealShards.WindowsReadBackAsTheEpochStream") {
    // Three Megatron shards on disk, sampled with shard-block shuffling: every window read through a
    // real reader equals the epoch's concatenation of whole documents at that window's place.
    ft::scratch_dir dir;
    std::vector<std::string> prefixes;
    std::mt19937 rng(4);
    std::uint32_t next_doc = 0;
    for (int k = 0; k < 3; ++k) {
        prefixes.push_back(dir / ("part_" + std::to_string(k)));
        megatron_writer w(prefixes.back(), token_dtype::int32);
        std::vector<std::uint32_t> lengths(40 + 10 * k);
        for (auto& l : lengths) l = rng() % 50;
        for (auto& doc : ft::arithmetic_documents(lengths)) {
            for (auto& t : doc) t += next_doc * 1'000'000;  // globally unique tokens
            w.add_document(doc);
            ++next_doc;
        }
        w.finish();
    }
    token_dataset ds(prefixes);
    auto starts = ds.shard_document_starts();
    CHECK(starts == std::vector<std::uint64_t>{0, 40, 90});
    const std::uint64_t T = 32;
    sampler s(ds,
              {.seq_len = T,
               .global_batch = 4,
               .seed = 5,
               .shuffle = shuffle_mode::shard_blocks,
               .shuffle_samples = false,
               .rank = 0,
               .world_size = 1},
              starts);
    pread_reader reader;
    detail::epoch_layout layout(ds, shuffle_mode::shard_blocks, 5, 0, starts);
    std::vector<std::uint32_t> stream;
    for (std::uint64_t k = 0; k < layout.documents(); ++k) {
        auto span = ds.document(layout.document_at(k));
        std::vector<std::uint32_t> t(span.length);
        ds.read_tokens(reader, span, 0, span.length, t.data());
        stream.insert(stream.end(), t.begin(), t.end());
    }
    for (std::uint64_t step = 0; step < s.steps_per_epoch(); ++step)
        for (auto& x : s.next().samples) {
            std::vector<std::uint32_t> got;
            for (auto& seg : x.segments) {
                std::vector<std::uint32_t> t(seg.length);
                ds.read_tokens(reader, ds.document(seg.document), seg.offset, seg.length, t.data());
                got.insert(got.end(), t.begin(), t.end());
            }
            REQUIRE(got.size() == T + 1);
            REQUIRE(std::equal(got.begin(), got.end(), stream.begin() + static_cast<std::ptrdiff_t>(x.index * T)));
        }
}

TEST_CASE("Sampler.Sharding.RanksSplitEveryGlobalBatch") {
    auto data = ft::hashed_lengths(2000, 300);
    const std::uint64_t G = 12;
    for (auto mode : {sample_mode::windows, sample_mode::packed}) {
        sampler one(data, {.seq_len = 64, .global_batch = G, .mode = mode, .rank = 0, .world_size = 1});
        for (int world : {2, 3, 4}) {
            std::vector<sampler> ranks;
            for (int r = 0; r < world; ++r)
                ranks.emplace_back(data, sampler_config{.seq_len = 64, .global_batch = G, .mode = mode, .rank = r, .world_size = world});
            for (std::uint64_t step = 0; step < 40; ++step) {
                auto whole = ids(one.plan_at(step));
                std::vector<sample_id> joined;
                for (auto& s : ranks) {
                    auto part = ids(s.next());
                    REQUIRE(part.size() == G / static_cast<std::uint64_t>(world));
                    joined.insert(joined.end(), part.begin(), part.end());
                }
                REQUIRE(joined == whole);
            }
        }
    }
    CHECK_THROWS_AS(sampler(data, {.global_batch = 10, .rank = 0, .world_size = 3}), config_error);
}

TEST_CASE("Sampler.Epochs.EachSampleOncePerEpochAndTailsCounted") {
    auto data = ft::hashed_lengths(500, 100);
    for (auto tail : {tail_policy::drop, tail_policy::pad}) {
        sampler s(data, {.seq_len = 32, .global_batch = 7, .tail = tail, .rank = 0, .world_size = 1});
        const std::uint64_t spe = s.stream(0).samples_per_epoch();
        std::set<std::uint64_t> seen;
        std::uint64_t pads = 0;
        for (std::uint64_t step = 0; step < s.steps_per_epoch(); ++step)
            for (auto& x : s.next().samples) {
                CHECK(x.epoch == 0);
                if (x.padding)
                    ++pads;
                else
                    CHECK(seen.insert(x.index).second);
            }
        if (tail == tail_policy::drop) {
            CHECK(seen.size() == spe - spe % 7);
            CHECK(s.dropped_per_epoch() == spe % 7);
        } else {
            CHECK(seen.size() == spe);
            CHECK(pads == s.padded_per_epoch());
        }
        CHECK(s.next().samples[0].epoch == 1);
    }
}

TEST_CASE("Sampler.Resume.ExactAtRandomPointsAndEpochBoundaries") {
    auto data = ft::hashed_lengths(300, 200);
    sampler_config cfg{.seq_len = 50, .global_batch = 8, .seed = 77, .rank = 0, .world_size = 1};
    sampler reference(data, cfg);
    const std::uint64_t N = 3 * reference.steps_per_epoch() + 5;
    std::vector<std::vector<segment>> expected;
    for (std::uint64_t i = 0; i < N; ++i)
        for (auto& x : reference.next().samples) expected.push_back(x.segments);
    std::mt19937_64 rng(3);
    std::vector<std::uint64_t> points = {0, reference.steps_per_epoch(), 2 * reference.steps_per_epoch(), N - 1};
    for (int i = 0; i < 4; ++i) points.push_back(rng() % N);
    for (std::uint64_t k : points) {
        CAPTURE(k);
        sampler first(data, cfg);
        std::vector<std::vector<segment>> got;
        for (std::uint64_t i = 0; i < k; ++i)
            for (auto& x : first.next().samples) got.push_back(x.segments);
        auto bytes = detail::to_bytes(first.state());
        // "New process": a fresh sampler restored from the serialised state, restored twice in a row.
        sampler second(data, cfg);
        second.restore(detail::sampler_state_from_bytes(bytes));
        second.restore(detail::sampler_state_from_bytes(detail::to_bytes(second.state())));
        for (std::uint64_t i = k; i < N; ++i)
            for (auto& x : second.next().samples) got.push_back(x.segments);
        REQUIRE(got == expected);
    }
}

TEST_CASE("Sampler.Resume.DifferentWorkerCountAfterRestore") {
    // Workers plan steps in parallel (each with its own sampler, as pipeline workers do); a run with one
    // worker saves at step k, and a run restored from that state with three workers continues exactly.
    auto data = ft::hashed_lengths(500, 200);
    const sampler_config cfg{.seq_len = 40, .global_batch = 6, .seed = 21, .rank = 0, .world_size = 1};
    const std::uint64_t N = 60, k = 23;
    auto run = [&](unsigned workers, std::uint64_t first, std::uint64_t count) {
        std::vector<std::vector<std::vector<segment>>> steps(count);
        std::vector<std::thread> threads;
        for (unsigned w = 0; w < workers; ++w)
            threads.emplace_back([&, w] {
                sampler own(data, cfg);  // each worker plans every workers-th step with a sampler of its own
                for (std::uint64_t i = w; i < count; i += workers)
                    for (auto& x : own.plan_at(first + i).samples) steps[i].push_back(x.segments);
            });
        for (auto& t : threads) t.join();
        std::vector<std::vector<segment>> got;
        for (auto& s : steps) got.insert(got.end(), s.begin(), s.end());
        return got;
    };
    sampler reference(data, cfg);
    std::vector<std::vector<segment>> expected;
    for (std::uint64_t i = 0; i < N; ++i)
        for (auto& x : reference.next().samples) expected.push_back(x.segments);

    auto got = run(1, 0, k);
    sampler saver(data, cfg);
    for (std::uint64_t i = 0; i < k; ++i) saver.next();
    sampler restored(data, cfg);
    restored.restore(detail::sampler_state_from_bytes(detail::to_bytes(saver.state())));
    auto rest = run(3, restored.state().step, N - k);
    got.insert(got.end(), rest.begin(), rest.end());
    CHECK(got == expected);
}

TEST_CASE("Sampler.PlanAt.SameStateAsASequentialWalk") {
    // Pipeline workers plan windows with plan_at(step, plan, after) on samplers of their own and hand
    // `after` to the trainer as the resume point: both must equal next() and state() of one sampler
    // walking there, at epoch boundaries too, for both tail policies, on every rank, and from a
    // sampler restored to a later step (steps before the restore point are still right).
    auto data = ft::hashed_lengths(300, 200);
    for (auto tail : {tail_policy::drop, tail_policy::pad})
        for (int rank : {0, 2}) {
            CAPTURE(static_cast<int>(tail));
            CAPTURE(rank);
            const sampler_config cfg{.seq_len = 50, .global_batch = 9, .seed = 5, .tail = tail, .rank = rank, .world_size = 3};
            sampler walker(data, cfg);
            const std::uint64_t N = 3 * walker.steps_per_epoch() + 4, k = walker.steps_per_epoch() + 3;
            std::vector<batch_plan> plans;
            std::vector<sampler_state> states;
            for (std::uint64_t i = 0; i < N; ++i) {
                plans.push_back(walker.next());
                states.push_back(walker.state());
            }
            sampler fresh(data, cfg), restored(data, cfg);
            restored.restore(states[k - 1]);  // positioned at step k
            batch_plan plan;
            sampler_state after;
            for (sampler* s : {&fresh, &restored})
                for (std::uint64_t i = N; i-- > 0;) {  // backwards: no step depends on the one before
                    CAPTURE(i);
                    s->plan_at(i, plan, after);
                    REQUIRE(after == states[i]);
                    REQUIRE(plan.step == plans[i].step);
                    REQUIRE(plan.epoch == plans[i].epoch);
                    REQUIRE(plan.first_global_sample == plans[i].first_global_sample);
                    REQUIRE(plan.samples.size() == plans[i].samples.size());
                    for (std::size_t j = 0; j < plan.samples.size(); ++j) {
                        REQUIRE(plan.samples[j].segments == plans[i].samples[j].segments);
                        REQUIRE(plan.samples[j].padding == plans[i].samples[j].padding);
                        REQUIRE(plan.samples[j].index == plans[i].samples[j].index);
                        REQUIRE(plan.samples[j].epoch == plans[i].samples[j].epoch);
                    }
                }
            CHECK(fresh.state() == sampler(data, cfg).state());  // planning moved neither sampler
            CHECK(restored.state() == states[k - 1]);
        }
}

TEST_CASE("Sampler.Resume.ElasticAcrossWorldSizes") {
    auto data = ft::hashed_lengths(400, 150);
    const std::uint64_t G = 12, k = 9, N = 30;
    sampler one(data, {.seq_len = 40, .global_batch = G, .rank = 0, .world_size = 1});
    std::vector<sample_id> expected;
    for (std::uint64_t i = 0; i < N; ++i) {
        auto v = ids(one.next());
        if (i >= k) expected.insert(expected.end(), v.begin(), v.end());
    }
    // Two ranks run k steps and save; three ranks restore that state and continue.
    sampler_state saved;
    for (int r = 0; r < 2; ++r) {
        sampler s(data, {.seq_len = 40, .global_batch = G, .rank = r, .world_size = 2});
        for (std::uint64_t i = 0; i < k; ++i) s.next();
        if (r == 0)
            saved = s.state();
        else
            CHECK(s.state() == saved);  // every rank holds the same state
    }
    std::vector<sampler> three;
    for (int r = 0; r < 3; ++r) {
        three.emplace_back(data, sampler_config{.seq_len = 40, .global_batch = G, .rank = r, .world_size = 3});
        three.back().restore(saved);
    }
    std::vector<sample_id> got;
    for (std::uint64_t i = k; i < N; ++i)
        for (auto& s : three) {
            auto v = ids(s.next());
            got.insert(got.end(), v.begin(), v.end());
        }
    // Same samples, same order once each step's rank slices are joined.
    CHECK(got == expected);
}

TEST_CASE("Sampler.Restore.RefusesAnotherConfigOrDataset") {
    auto data = ft::hashed_lengths(300, 100);
    sampler a(data, {.seq_len = 32, .global_batch = 4, .rank = 0, .world_size = 1});
    a.next();
    sampler b(data, {.seq_len = 64, .global_batch = 4, .rank = 0, .world_size = 1});
    try {
        b.restore(a.state());
        FAIL("restored across seq_len");
    } catch (const config_error& e) {
        CHECK(e.field() == "state.seq_len");
        CHECK(std::string(e.what()).find("saved 32, this sampler has 64") != std::string::npos);
    }
    auto other = ft::hashed_lengths(300, 100, 2);
    sampler c(other, {.seq_len = 32, .global_batch = 4, .rank = 0, .world_size = 1});
    CHECK_THROWS_WITH_AS(c.restore(a.state()), doctest::Contains("state.dataset_tokens[0]"), config_error);
    // One dataset draws the global batch every step: counts that disagree are refused.
    sampler d(data, {.seq_len = 32, .global_batch = 4, .rank = 0, .world_size = 1});
    auto edited = a.state();
    edited.taken[0] += 1;
    CHECK_THROWS_WITH_AS(d.restore(edited), doctest::Contains("state.taken"), config_error);
    CHECK_NOTHROW(d.restore(a.state()));
}

namespace {

// What a single-dataset stream draws, step by step, from a position (epoch, index) with global batch
// g: a step that cannot start in the epoch (index past its end, or with tail = drop fewer than g
// samples left) starts the next one at 0; samples past the end (pad) wrap around and are padding.
// Written apart from the sampler, from the tail policies' definitions.
struct stream_model {
    std::function<std::uint64_t(std::uint64_t)> samples_in_epoch;
    tail_policy tail;
    std::uint64_t epoch = 0, index = 0;
    std::vector<sample_id> step(std::uint64_t g) {
        std::uint64_t spe = samples_in_epoch(epoch);
        if (tail == tail_policy::drop ? index + g > spe : index >= spe) {
            ++epoch;
            index = 0;
            spe = samples_in_epoch(epoch);
        }
        std::vector<sample_id> out;
        for (std::uint64_t i = 0; i < g; ++i) out.emplace_back(0u, epoch, (index + i) % spe, index + i >= spe);
        index += g;
        return out;
    }
};

}  // namespace

TEST_CASE("Sampler.Resume.AnotherGlobalBatchGoesOnFromTheSameSample") {
    // A run saved with global batch 8 goes on with 12 (and with 4) from the sample it would have drawn
    // next: windows and packed rows, both tail policies, saved mid-epoch and right at an epoch's end, two
    // ranks after the change. Every epoch after that is cut by the new batch; the samples are the ones
    // the stream holds at those positions (same content as the saved run's where both draw them).
    auto data = ft::hashed_lengths(300, 200);
    for (auto mode : {sample_mode::windows, sample_mode::packed})
        for (auto tail : {tail_policy::drop, tail_policy::pad})
            for (std::uint64_t g2 : {12, 4}) {
                const sampler_config old_config{
                    .seq_len = 50, .global_batch = 8, .seed = 3, .mode = mode, .tail = tail, .rank = 0, .world_size = 1};
                sampler probe(data, old_config);
                const std::uint64_t per = probe.steps_per_epoch();
                for (std::uint64_t k : {per + 3, 2 * per}) {
                    CAPTURE(static_cast<int>(mode));
                    CAPTURE(static_cast<int>(tail));
                    CAPTURE(g2);
                    CAPTURE(k);
                    sampler first(data, old_config);
                    std::map<std::tuple<std::uint64_t, std::uint64_t>, std::vector<segment>> content;
                    for (std::uint64_t i = 0; i < k; ++i)
                        for (auto& x : first.next().samples) content[{x.epoch, x.index}] = x.segments;
                    const sampler_state saved = sampler_state_from_json(to_json(first.state()));
                    sampler reference(data, old_config);  // goes on with the old batch, for the content of what both draw
                    reference.restore(saved);
                    for (std::uint64_t i = 0; i < 2 * per; ++i)
                        for (auto& x : reference.next().samples) content[{x.epoch, x.index}] = x.segments;

                    std::vector<sampler> ranks;
                    for (int r = 0; r < 2; ++r) {
                        ranks.emplace_back(
                            data,
                            sampler_config{
                                .seq_len = 50, .global_batch = g2, .seed = 3, .mode = mode, .tail = tail, .rank = r, .world_size = 2});
                        CHECK_THROWS_WITH_AS(ranks.back().restore(saved), doctest::Contains("state.global_batch"), config_error);
                        ranks.back().restore(with_global_batch(saved, g2));
                    }
                    const sampler_state rebased = ranks[0].state();
                    CHECK(rebased.version == 2);
                    CHECK(rebased.step == k);
                    CHECK(rebased.origin_drawn == 8 * k);
                    // Serialised, checked and restored like any state, by both forms.
                    CHECK(sampler_state_from_json(to_json(rebased)) == rebased);
                    CHECK(detail::sampler_state_from_bytes(detail::to_bytes(rebased)) == rebased);

                    auto samples_in = [&](std::uint64_t e) {
                        return probe.steps_in_epoch(e) * 8 + probe.dropped_in_epoch(e) - probe.padded_in_epoch(e);
                    };
                    stream_model model{samples_in, tail, saved.epoch[0], saved.index[0]};
                    const std::uint64_t steps = 3 * per * 8 / g2;  // three epochs of the old batch
                    std::vector<sampler_state> states;
                    std::vector<std::vector<sample_id>> planned;
                    for (std::uint64_t i = 0; i < steps; ++i) {
                        CAPTURE(i);
                        std::vector<sample_id> got;
                        for (auto& r : ranks) {
                            const batch_plan b = r.next();
                            REQUIRE(b.step == k + i);
                            REQUIRE(b.first_global_sample == 8 * k + g2 * i);
                            for (auto& x : b.samples) {
                                got.emplace_back(x.dataset, x.epoch, x.index, x.padding);
                                const auto known = content.find({x.epoch, x.index});
                                if (known != content.end()) REQUIRE(x.segments == known->second);
                            }
                        }
                        REQUIRE(ranks[0].state() == ranks[1].state());
                        REQUIRE(got == model.step(g2));
                        planned.push_back(got);
                        states.push_back(ranks[0].state());
                    }
                    // Workers plan any later step on samplers of their own, restored to the changed state,
                    // and hand on the state a sequential walk leaves; a save later on resumes exactly.
                    sampler worker(
                        data, sampler_config{
                                  .seq_len = 50, .global_batch = g2, .seed = 3, .mode = mode, .tail = tail, .rank = 0, .world_size = 1});
                    worker.restore(rebased);
                    batch_plan plan;
                    sampler_state after;
                    for (std::uint64_t i = steps; i-- > 0;) {
                        worker.plan_at(k + i, plan, after);
                        REQUIRE(after == states[i]);
                        REQUIRE(ids(plan) == planned[i]);
                    }
                    CHECK_THROWS_WITH_AS(worker.plan_at(k - 1, plan, after), doctest::Contains("another global batch"), config_error);
                    sampler later(
                        data, sampler_config{
                                  .seq_len = 50, .global_batch = g2, .seed = 3, .mode = mode, .tail = tail, .rank = 0, .world_size = 1});
                    later.restore(sampler_state_from_json(to_json(states[per])));
                    CHECK(ids(later.next()) == planned[per + 1]);
                    // set_epoch's state is a walk from the start with the new batch: no origin any more.
                    sampler fresh(
                        data, sampler_config{
                                  .seq_len = 50, .global_batch = g2, .seed = 3, .mode = mode, .tail = tail, .rank = 0, .world_size = 1});
                    const sampler_state epoch_start = later.state_at_epoch(3);
                    CHECK(epoch_start.version == 1);
                    CHECK(epoch_start == fresh.state_at_epoch(3));
                    // Where each later epoch begins, counted from the change (the model's first step in it).
                    for (std::uint64_t e = saved.epoch[0] + 1; e < saved.epoch[0] + 3; ++e) {
                        std::uint64_t first_in = 0;
                        while (first_in < planned.size() && std::get<1>(planned[first_in][0]) < e) ++first_in;
                        REQUIRE(first_in < planned.size());
                        CHECK(later.first_step_of_epoch(e) == k + first_in);
                    }
                    CHECK(later.first_step_of_epoch(saved.epoch[0]) == k);
                }
            }
}

TEST_CASE("Sampler.Resume.AnotherGlobalBatchKeepsABlendsStreamAndRefusesEdits") {
    // The largest-deficit rule looks only at what was drawn: a blend saved with global batch 10 and
    // continued with 6 draws exactly the stream a run with 10 throughout draws.
    auto a = ft::hashed_lengths(200, 100, 1), b = ft::hashed_lengths(300, 100, 2);
    std::vector<const ft::synthetic_lengths*> sets = {&a, &b};
    sampler ten(sets, {0.7, 0.3}, {.seq_len = 16, .global_batch = 10, .rank = 0, .world_size = 1});
    std::vector<sample_id> expected;
    for (int i = 0; i < 60; ++i) {
        const auto v = ids(ten.next());
        expected.insert(expected.end(), v.begin(), v.end());
    }
    sampler first(sets, {0.7, 0.3}, {.seq_len = 16, .global_batch = 10, .rank = 0, .world_size = 1});
    std::vector<sample_id> got;
    for (int i = 0; i < 21; ++i) {
        const auto v = ids(first.next());
        got.insert(got.end(), v.begin(), v.end());
    }
    sampler six(sets, {0.7, 0.3}, {.seq_len = 16, .global_batch = 6, .rank = 0, .world_size = 1});
    six.restore(sampler_state_from_json(to_json(with_global_batch(first.state(), 6))));
    while (got.size() < expected.size()) {
        const auto v = ids(six.next());
        got.insert(got.end(), v.begin(), v.end());
    }
    CHECK(got == expected);
    CHECK(with_global_batch(six.state(), 6) == six.state());  // the same batch: nothing to change

    // Edits of a changed state are refused: its origin moved, or the counts disagree with it.
    sampler one(a, {.seq_len = 16, .global_batch = 8, .rank = 0, .world_size = 1});
    for (int i = 0; i < 7; ++i) one.next();
    const sampler_state rebased = with_global_batch(one.state(), 4);
    sampler four(a, {.seq_len = 16, .global_batch = 4, .rank = 0, .world_size = 1});
    auto edited = rebased;
    edited.origin_index += 1;
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.index"), config_error);
    edited = rebased;
    edited.origin_drawn += 4;
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.taken"), config_error);
    edited = rebased;
    edited.origin_step = edited.step + 1;
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.origin_step"), config_error);
    edited = rebased;  // an origin no run of 56 samples can reach, however large its batch
    edited.origin_index = edited.index[0] = std::uint64_t(1) << 62;
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.origin_index"), config_error);
    edited = rebased;
    edited.origin_epoch = edited.epoch[0] = 57;
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.origin_index"), config_error);
    edited = one.state();
    edited.origin_step = 1;  // a version-1 state has no origin
    CHECK_THROWS_WITH_AS(four.restore(edited), doctest::Contains("state.origin_step"), config_error);
#if FEEDLINE_HAS_JSON
    auto j = nlohmann::json::parse(to_json(rebased));
    j["origin_index"] = j["origin_index"].get<std::uint64_t>() + 1;
    CHECK_THROWS_WITH_AS(sampler_state_from_json(j.dump()), doctest::Contains("check does not match"), format_error);
    j.erase("origin_index");
    CHECK_THROWS_AS(sampler_state_from_json(j.dump()), format_error);
    j = nlohmann::json::parse(to_json(rebased));
    j.erase("check");  // version 1 states older than the check have none; a version 2 one always has it
    CHECK_THROWS_WITH_AS(sampler_state_from_json(j.dump()), doctest::Contains("without its check"), format_error);
#endif
    CHECK_NOTHROW(four.restore(rebased));
}

TEST_CASE("Sampler.Blend.EveryPrefixWithinOneSampleOfItsShare") {
    auto a = ft::hashed_lengths(200, 100, 1), b = ft::hashed_lengths(300, 100, 2), c = ft::hashed_lengths(100, 100, 3);
    std::vector<const ft::synthetic_lengths*> sets = {&a, &b, &c};
    std::vector<double> w = {5, 3, 2};
    sampler s(sets, w, {.seq_len = 16, .global_batch = 10, .rank = 0, .world_size = 1});
    std::vector<std::uint64_t> counts(3, 0);
    std::uint64_t n = 0;
    bool within = true;
    std::map<std::pair<std::uint32_t, std::pair<std::uint64_t, std::uint64_t>>, int> repeats;
    for (int step = 0; step < 300; ++step)
        for (auto& x : s.next().samples) {
            ++counts[x.dataset];
            ++n;
            for (int d = 0; d < 3; ++d) within &= std::abs(static_cast<double>(counts[d]) - w[d] / 10.0 * static_cast<double>(n)) <= 1.0;
            repeats[{x.dataset, {x.epoch, x.index}}]++;
        }
    CHECK(within);
    for (auto& [k, v] : repeats) REQUIRE(v == 1);  // each dataset walks its own epochs without repeats
    // Blended streams resume exactly from the counts.
    auto saved = s.state();
    auto expected = ids(s.next());
    sampler t(sets, w, {.seq_len = 16, .global_batch = 10, .rank = 0, .world_size = 1});
    t.restore(saved);
    CHECK(ids(t.next()) == expected);
}

TEST_CASE("Sampler.Restore.EditsThatKeepTheCountsSumAreRefusedInBlendsAndPackedRows") {
    auto a = ft::hashed_lengths(200, 100, 1), b = ft::hashed_lengths(300, 100, 2);
    std::vector<const ft::synthetic_lengths*> sets = {&a, &b};
    const sampler_config blend_config{.seq_len = 16, .global_batch = 10, .rank = 0, .world_size = 1};
    sampler s(sets, {0.6, 0.4}, blend_config);
    for (int i = 0; i < 40; ++i) s.next();  // past the first epoch of both
    // One dataset's count up, the other's down: the sum still matches the steps.
    auto edited = s.state();
    edited.taken[0] += 1;
    edited.taken[1] -= 1;
    sampler t(sets, {0.6, 0.4}, blend_config);
    CHECK_THROWS_WITH_AS(t.restore(edited), doctest::Contains("state.taken[0]"), config_error);
    // The position moved with the counts, consistently: the state's checksum still refuses it.
    edited = s.state();
    CHECK_NOTHROW(t.restore(sampler_state_from_json(to_json(edited))));
#if FEEDLINE_HAS_JSON
    auto j = nlohmann::json::parse(to_json(edited));
    j["taken"][0] = j["taken"][0].get<std::uint64_t>() + 1;
    j["taken"][1] = j["taken"][1].get<std::uint64_t>() - 1;
    j["index"][0] = j["index"][0].get<std::uint64_t>() + 1;
    j["index"][1] = j["index"][1].get<std::uint64_t>() - 1;
    CHECK_THROWS_WITH_AS(sampler_state_from_json(j.dump()), doctest::Contains("check does not match"), format_error);
#endif
    // Packed rows, one dataset: epoch and index follow from the step, even where epochs differ in length.
    const sampler_config packed_config{.seq_len = 64, .global_batch = 4, .mode = sample_mode::packed, .rank = 0, .world_size = 1};
    sampler p(a, packed_config);
    for (int i = 0; i < 30; ++i) p.next();
    auto moved = p.state();
    moved.index[0] -= 4;  // a step's samples taken off the position, not the counts
    sampler q(a, packed_config);
    CHECK_THROWS_WITH_AS(q.restore(moved), doctest::Contains("state.index"), config_error);
    moved = p.state();
    moved.epoch[0] += 1;
    CHECK_THROWS_WITH_AS(q.restore(moved), doctest::Contains("state.index"), config_error);
    CHECK_NOTHROW(q.restore(p.state()));
    CHECK(ids(q.next()) == ids(p.next()));
}

TEST_CASE("Sampler.Weights.HugeWeightsKeepTheirSharesAndRefusalsPrintExactValues") {
    auto a = ft::hashed_lengths(200, 100, 1), b = ft::hashed_lengths(300, 100, 2);
    std::vector<const ft::synthetic_lengths*> sets = {&a, &b};
    const sampler_config config{.seq_len = 16, .global_batch = 9, .rank = 0, .world_size = 1};
    // Their sum overflows a double: the blend used to turn uniform.
    sampler huge(sets, {1e308, 0.5e308}, config);
    CHECK(huge.state().weights[0] == doctest::Approx(2.0 / 3));
    CHECK(huge.state().weights[1] == doctest::Approx(1.0 / 3));
    std::uint64_t first = 0;
    for (auto& x : huge.next().samples) first += x.dataset == 0;
    CHECK(first == 6);
    // A weight whose share rounds to nothing is refused rather than silently never drawn.
    CHECK_THROWS_WITH_AS(sampler(sets, {1e300, 1e-300}, config), doctest::Contains("rounds to 0"), config_error);
    // Weights that differ in the last bit, and enums, are told apart by the message.
    sampler x(sets, {0.6, 0.4}, config), y(sets, {0.6000000000000001, 0.4}, config);
    try {
        y.restore(x.state());
        FAIL("restored across weights");
    } catch (const config_error& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find("saved ") != std::string::npos, what);
        CHECK_MESSAGE(what.find(", this sampler has ") != std::string::npos, what);
        const auto saved = what.substr(what.find("saved ") + 6, what.find(", this") - what.find("saved ") - 6);
        const auto mine = what.substr(what.find("has ") + 4);
        CHECK_MESSAGE(saved != mine, what);
        CHECK(std::stod(saved) == x.state().weights[0]);
        CHECK(std::stod(mine) == y.state().weights[0]);
    }
    auto windows = ft::hashed_lengths(300, 100);
    sampler w(windows, {.seq_len = 16, .global_batch = 4, .rank = 0, .world_size = 1});
    sampler p(windows, {.seq_len = 16, .global_batch = 4, .mode = sample_mode::packed, .rank = 0, .world_size = 1});
    CHECK_THROWS_WITH_AS(p.restore(w.state()), doctest::Contains("saved windows, this sampler has packed"), config_error);
}

TEST_CASE("Sampler.Environment.TorchrunThenOpenMpi") {
    auto data = ft::hashed_lengths(300, 100);
    ::setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    sampler mpi(data, {.seq_len = 16, .global_batch = 8});
    CHECK(mpi.rank() == 2);
    CHECK(mpi.world_size() == 4);
    ::setenv("RANK", "1", 1);
    ::setenv("WORLD_SIZE", "2", 1);
    auto info = launch_from_environment();
    CHECK(info.rank == 1);
    CHECK(info.source.find("torchrun") != std::string::npos);
    ::setenv("RANK", "5", 1);
    CHECK_THROWS_AS(launch_from_environment(), config_error);
    ::setenv("RANK", "x", 1);
    CHECK_THROWS_AS(launch_from_environment(), config_error);
    for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) ::unsetenv(v);
    CHECK(launch_from_environment().world_size == 1);
}

TEST_CASE("State.Serialisation.RoundTripsAndRejectsCorruption") {
    auto data = ft::hashed_lengths(300, 100);
    sampler s(data, {.seq_len = 16, .global_batch = 4, .rank = 0, .world_size = 1});
    for (int i = 0; i < 5; ++i) s.next();
    auto bytes = detail::to_bytes(s.state());
    CHECK(detail::sampler_state_from_bytes(bytes) == s.state());
    auto cut = bytes;
    cut.resize(cut.size() - 3);
    CHECK_THROWS_AS(detail::sampler_state_from_bytes(cut), format_error);
    auto bad = bytes;
    bad[0] = std::byte{'X'};
    CHECK_THROWS_AS(detail::sampler_state_from_bytes(bad), format_error);
#if FEEDLINE_HAS_JSON
    auto json = to_json(s.state());
    CHECK(sampler_state_from_json(json) == s.state());
    CHECK(json.find("\"step\":5") != std::string::npos);
    CHECK_THROWS_AS(sampler_state_from_json("{\"format\": \"feedline.sampler_state\", \"version\": 1}"), format_error);
    CHECK_THROWS_AS(sampler_state_from_json("{\"format\": 1}"), format_error);
    // Hand-edited numbers: a negative position would wrap to 2^64 - 5, a float seed would be cast
    // (undefined when out of range), a mode past 32 bits truncated. Each is refused by name.
    // (Without the checksum, as states saved before it had none: the fields' own checks are under test.)
    auto edited = [&](const std::string& field, const std::string& value) {
        auto j = nlohmann::json::parse(json);
        j.erase("check");
        j[field] = nlohmann::json::parse(value);
        return j.dump();
    };
    CHECK(sampler_state_from_json(edited("step", "7")).step == 7);
    // With it, any edit is refused, even one every other check would pass.
    auto j = nlohmann::json::parse(json);
    REQUIRE(j.contains("check"));
    j["seed"] = j["seed"].get<std::uint64_t>() + 1;
    try {
        sampler_state_from_json(j.dump());
        FAIL("accepted an edited state");
    } catch (const format_error& e) {
        CHECK(std::string(e.what()).find("check does not match") != std::string::npos);
    }
    for (const auto& edit : {std::pair{"index", "[-5]"},
                             {"seed", "1e300"},
                             {"seed", "1.5"},
                             {"mode", "4294967296"},
                             {"step", "\"5\""},
                             {"epoch", "3"},
                             {"weights", "[null]"}}) {
        const std::string field = edit.first, value = edit.second;  // named copies: CAPTURE cannot take bindings
        CAPTURE(field);
        CAPTURE(value);
        try {
            sampler_state_from_json(edited(field, value));
            FAIL("accepted");
        } catch (const format_error& e) {
            CHECK(std::string(e.what()).find(field) != std::string::npos);
        }
    }
#endif
}

// What the pipeline's workers do with one shared sampler: draw each step under a lock (next_drawn),
// then plan its samples' segments outside it (plan_drawn), four threads at once, each reusing its
// plan's storage. Every step must equal what next() gives, sample by sample and segment by segment:
// blends, mixtures and one dataset (tail = pad), GPT windows and packed rows, over datasets small
// enough that their epochs end (and their layouts are rebuilt) while other threads plan from them.
// And next() itself, now the two halves in a row, must give what it gave before they were split: a
// hash of 400 sequential steps per case, recorded by the same code compiled against the sampler before
// the split. Run under ThreadSanitizer too (the streams' own locks).
// A mixture's one-document streams (its one-shard domains) are planned without their locks: the
// samples of short runs permuted together across streams, long runs (a heavy domain's) each on its
// own (sampler::plan_drawn); short runs of a laid-out stream with long epochs join them and are then
// placed in their epochs under the lock. Every sample must be what its stream alone plans for its
// epoch and index, with and without sample shuffling, in windows, over several epochs of the small
// domains, planned on one thread and on four at once.
TEST_CASE("Sampler.OneDocumentStreams.PlannedTogetherAsEachStreamAlonePlansThem") {
    std::vector<ft::synthetic_lengths> sets;
    for (std::uint64_t d = 0; d < 40; ++d) sets.push_back({{20 + 37 * ((d * 7919) % 23)}});  // one document of 20 to 834 tokens
    sets.push_back(ft::hashed_lengths(12, 40, 5));   // laid out every epoch, planned under its lock
    sets.push_back(ft::hashed_lengths(60, 60, 6));   // laid out, and epochs long enough to be permuted with the others
    sets.push_back({{5000}});
    std::vector<double> weights;
    for (std::size_t d = 0; d < sets.size(); ++d) weights.push_back(1.0 + static_cast<double>(d % 5));
    weights.back() = 80;  // about a third of every step: runs of ten samples and more
    const auto datasets = [&] {
        std::vector<sampler_dataset> r;
        for (const auto& s : sets) r.push_back({s.document_count(), [&s](std::uint64_t i) { return s.document_length(i); }, {}, false});
        return r;
    };
    for (const bool shuffle_samples : {true, false}) {
        CAPTURE(shuffle_samples);
        const sampler_config config{.seq_len = 8, .global_batch = 32, .seed = 3, .shuffle_samples = shuffle_samples, .rank = 0, .world_size = 1};
        constexpr int steps = 300;
        sampler one(datasets(), weights, config);
        std::vector<batch_plan> expected(steps);
        for (auto& b : expected) one.next(b);
        // Each stream alone, planned one sample at a time (plan(), under no other thread).
        std::vector<dataset_stream> alone;
        const auto data = datasets();
        for (std::uint32_t d = 0; d < data.size(); ++d) alone.emplace_back(data[d], config, d);
        std::set<std::uint64_t> small_domain_epochs;
        std::size_t in_long_runs = 0;
        for (const auto& b : expected)
            for (const auto& p : b.samples) {
                sample_plan own;
                alone[p.dataset].plan(p.epoch, p.index, own);
                REQUIRE(p.segments == own.segments);
                if (p.dataset == 0) small_domain_epochs.insert(p.epoch);
                if (p.dataset == sets.size() - 1) ++in_long_runs;
            }
        CHECK(small_domain_epochs.size() >= 3);  // the small domains went through several epochs
        CHECK(in_long_runs > steps * 32 / 4);    // and the heavy one's runs were long

        sampler shared(datasets(), weights, config);
        std::mutex lock;
        std::vector<batch_plan> got(steps);
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t)
            threads.emplace_back([&] {
                batch_plan b;
                sampler_step_delta delta;
                for (;;) {
                    {
                        const std::lock_guard hold(lock);
                        if (shared.state().step >= steps) return;
                        shared.next_drawn(b, delta);
                    }
                    shared.plan_drawn(b);
                    got[b.step] = b;
                }
            });
        for (auto& t : threads) t.join();
        for (int step = 0; step < steps; ++step) {
            CAPTURE(step);
            REQUIRE(got[step].samples.size() == expected[step].samples.size());
            for (std::size_t i = 0; i < got[step].samples.size(); ++i) {
                REQUIRE(got[step].samples[i].dataset == expected[step].samples[i].dataset);
                REQUIRE(got[step].samples[i].segments == expected[step].samples[i].segments);
            }
        }
    }
}

TEST_CASE("Sampler.Threads.StepsDrawnUnderALockAndPlannedOnFourThreadsEqualNext") {
    const std::vector<ft::synthetic_lengths> sets{ft::hashed_lengths(30, 50, 11), ft::hashed_lengths(9, 40, 12),
                                                  ft::hashed_lengths(60, 30, 13), ft::hashed_lengths(5, 70, 14)};
    const auto datasets = [&] {
        std::vector<sampler_dataset> r;
        for (const auto& s : sets) r.push_back({s.document_count(), [&s](std::uint64_t i) { return s.document_length(i); }, {}, false});
        return r;
    };
    const auto schedule = std::make_shared<const mixture_schedule>(
        std::vector<std::string>{"a", "b", "c", "d"},
        std::vector<mixture_stage>{{0, {5, 1, 3, 1}, 0, ""}, {20, {1, 4, 0, 2}, 10, ""}, {60, {2, 2, 2, 1}, 0, ""}});
    enum kind { blend, mixture, single };
    // FNV-1a over each step's number and each sample's dataset, epoch, index, padding and segments.
    const std::map<std::pair<sample_mode, kind>, std::uint64_t> recorded{
        {{sample_mode::windows, blend}, 952119434903224392ull},    {{sample_mode::windows, mixture}, 17532962155198875468ull},
        {{sample_mode::windows, single}, 2750517582527357504ull},  {{sample_mode::packed, blend}, 17592688258219979607ull},
        {{sample_mode::packed, mixture}, 11374655210000739745ull}, {{sample_mode::packed, single}, 12416114317664612004ull}};
    for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
        for (const kind k : {blend, mixture, single}) {
            CAPTURE(static_cast<int>(mode));
            CAPTURE(static_cast<int>(k));
            sampler_config config{.seq_len = 8, .global_batch = 16, .seed = 21, .mode = mode, .rank = 1, .world_size = 2};
            if (k == single) config.tail = tail_policy::pad;
            auto make = [&] {
                return k == blend ? std::make_unique<sampler>(datasets(), std::vector<double>{4, 1, 2, 1}, config)
                       : k == mixture
                           ? std::make_unique<sampler>(datasets(), schedule, config)
                           : std::make_unique<sampler>(std::vector<sampler_dataset>{datasets()[1]}, std::vector<double>{1.0}, config);
            };
            constexpr int steps = 400;
            std::vector<batch_plan> expected(steps);
            auto one = make();
            std::uint64_t hash = 14695981039346656037ull;
            auto mix = [&](std::uint64_t v) {
                for (int i = 0; i < 8; ++i) {
                    hash ^= (v >> (8 * i)) & 0xff;
                    hash *= 1099511628211ull;
                }
            };
            for (int step = 0; step < steps; ++step) {
                one->next(expected[step]);
                mix(expected[step].step);
                for (const auto& p : expected[step].samples) {
                    for (std::uint64_t v : {std::uint64_t(p.dataset), p.epoch, p.index, std::uint64_t(p.padding)}) mix(v);
                    for (const auto& g : p.segments)
                        for (std::uint64_t v : {g.document, g.offset, g.length}) mix(v);
                }
            }
            CHECK(hash == recorded.at({mode, k}));

            auto shared = make();
            std::mutex lock;
            std::vector<batch_plan> got(steps);
            std::vector<sampler_step_delta> got_delta(steps);
            std::vector<std::thread> threads;
            for (int t = 0; t < 4; ++t)
                threads.emplace_back([&] {
                    batch_plan b;  // reused, as a pipeline worker's is
                    sampler_step_delta delta;
                    for (;;) {
                        {
                            const std::lock_guard hold(lock);
                            if (shared->state().step >= steps) return;
                            shared->next_drawn(b, delta);
                        }
                        shared->plan_drawn(b);
                        got[b.step] = b;
                        got_delta[b.step] = delta;
                    }
                });
            for (auto& t : threads) t.join();
            std::set<std::uint32_t> drawn;
            bool padded = false;
            for (int step = 0; step < steps; ++step) {
                REQUIRE(got[step].step == expected[step].step);
                REQUIRE(got[step].samples.size() == expected[step].samples.size());
                for (std::size_t i = 0; i < got[step].samples.size(); ++i) {
                    const sample_plan &x = got[step].samples[i], &y = expected[step].samples[i];
                    CAPTURE(step);
                    CAPTURE(i);
                    REQUIRE(x.dataset == y.dataset);
                    REQUIRE(x.epoch == y.epoch);
                    REQUIRE(x.index == y.index);
                    REQUIRE(x.padding == y.padding);
                    REQUIRE(x.segments == y.segments);
                    REQUIRE(!x.segments.empty());
                    drawn.insert(x.dataset);
                    padded = padded || x.padding;
                }
            }
            // The deltas, applied in step order, give the state the sequential sampler ended with.
            sampler_state applied = make()->state();
            for (int step = 0; step < steps; ++step) got_delta[step].apply_to(applied);
            CHECK(applied == one->state());
            CHECK(shared->state() == one->state());
            // Every dataset went through several epochs, so layouts were rebuilt while others planned.
            CHECK(drawn.size() == (k == single ? 1u : 4u));
            for (std::uint64_t e : shared->state().epoch) CHECK(e >= 2);
            if (k == single) CHECK(padded);  // tail = pad completed an epoch's last batch
        }
    }
}
