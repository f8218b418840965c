// bench_sampling: can a 10^11-token dataset open in seconds and little memory?
//
// A synthetic description of 10^7 documents / ~10^11 tokens (lengths computed from a hash: no data, no
// files). feedline's sampler opens it (prefix sums of the shuffled epoch: O(documents)), plans the first
// batch, then plans random batches to time a lookup. Baseline in the same run: the O(samples) index
// arrays a Megatron-style GPT dataset builds (document order, sample -> (document, offset) index,
// shuffled sample order), built for the same 10^11 tokens (about 0.8 GiB).
// Peak RSS per phase from VmHWM, reset between phases through /proc/self/clear_refs.
// Then planning as a worker does it (256 x 128 windows in step order) with 6, 10^5 and 10^7 documents,
// and the shuffle alone (feistel_permutation::map over short and long runs, map_each over a mixture's
// step of 32 domains).
// Last line: one JSON object with open_seconds, open_peak_rss_mib, lookup_ns, speedup_vs_index_array,
// plan_ns_per_window_*, map_ns_run*, map_each_ns_32.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <feedline/sampling/sampler.hpp>

#include "bench_common.hpp"

using namespace feedline;
using namespace feedline::bench;

namespace {

struct synthetic_dataset {
    std::uint64_t docs;
    std::uint64_t mean;
    std::uint64_t document_count() const { return docs; }
    std::uint64_t document_length(std::uint64_t i) const { return 1 + mix64(i) % (2 * mean - 1); }  // mean ~ `mean`
};

// A "Key:   N kB" line of /proc/self/status, in MiB: VmHWM (peak resident set) or VmRSS (now).
double status_mib(const std::string& key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
    return 0;
}
double peak_rss_mib() { return status_mib("VmHWM"); }
double rss_mib() { return status_mib("VmRSS"); }
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// What a Megatron-style GPT dataset builds before the first sample: O(documents + samples) arrays.
struct index_arrays {
    std::vector<std::int32_t> doc_idx;
    std::vector<std::int32_t> sample_idx;  // (samples + 1) x (doc position, offset)
    std::vector<std::int64_t> shuffle_idx;
};
index_arrays build_index_arrays(const synthetic_dataset& d, std::uint64_t seq_len, std::uint64_t seed) {
    index_arrays a;
    a.doc_idx.resize(d.docs);
    for (std::uint64_t i = 0; i < d.docs; ++i) a.doc_idx[i] = static_cast<std::int32_t>(i);
    std::mt19937_64 rng(seed);
    std::shuffle(a.doc_idx.begin(), a.doc_idx.end(), rng);
    std::uint64_t tokens = 0;
    for (std::uint64_t i = 0; i < d.docs; ++i) tokens += d.document_length(i);
    const std::uint64_t samples = (tokens - 1) / seq_len;
    a.sample_idx.resize(2 * (samples + 1));
    std::uint64_t doc = 0, offset = 0;
    for (std::uint64_t s = 0; s <= samples; ++s) {
        a.sample_idx[2 * s] = static_cast<std::int32_t>(doc);
        a.sample_idx[2 * s + 1] = static_cast<std::int32_t>(offset);
        std::uint64_t remaining = seq_len;
        while (remaining > 0 && doc < d.docs) {
            std::uint64_t len = d.document_length(static_cast<std::uint64_t>(a.doc_idx[doc]));
            std::uint64_t take = std::min(remaining, len - offset);
            remaining -= take;
            offset += take;
            if (offset == len) {
                ++doc;
                offset = 0;
            }
        }
    }
    a.shuffle_idx.resize(samples);
    for (std::uint64_t i = 0; i < samples; ++i) a.shuffle_idx[i] = static_cast<std::int64_t>(i);
    std::shuffle(a.shuffle_idx.begin(), a.shuffle_idx.end(), rng);
    return a;
}

// Planning as a worker does it: batches of 256 windows of 128 tokens in step order, ns per window, for
// `docs` documents of `tokens` in all (a few: llm.c shards read as streams; many: a Megatron corpus).
double plan_ns_per_window(std::uint64_t docs, std::uint64_t tokens) {
    synthetic_dataset d{docs, std::max<std::uint64_t>(1, tokens / docs)};
    sampler s(d, {.seq_len = 128, .global_batch = 256, .seed = 1, .rank = 0, .world_size = 1});
    batch_plan b;
    for (int i = 0; i < 100; ++i) s.next(b);
    const int steps = 5000;
    std::uint64_t sink = 0;
    const auto t0 = clock_type::now();
    for (int i = 0; i < steps; ++i) {
        s.next(b);
        sink += b.samples[static_cast<std::size_t>(i) % b.samples.size()].segments.size();
    }
    const double ns = seconds_since(t0) * 1e9 / (double(steps) * 256);
    return sink == 0 ? -1 : ns;
}

// The shuffle alone: ns per value of feistel_permutation::map over runs of `run` consecutive indices
// (a stream's samples in one step: 16 of each dataset in a 2-dataset blend of 32, 256 in one of
// 256 x 128), medians of 7 timings; on n just under 4^10 (its network holds ~n values: most walk
// once) and just over (~4n: they walk four times on average, the slowest of a run of 16 a dozen).
double map_ns_per_value(std::uint64_t n, std::size_t run) {
    const feistel_permutation p(n, detail::permutation_key(1, 0, n));
    std::vector<std::uint64_t> out(run);
    std::vector<std::uint32_t> pending;
    std::vector<double> ns;
    std::uint64_t sink = 0;
    const std::uint64_t runs = 2'000'000 / run;
    for (int t = 0; t < 7; ++t) {
        std::uint64_t first = 0;
        const auto t0 = clock_type::now();
        for (std::uint64_t i = 0; i < runs; ++i) {
            p.map(first, run, out.data(), pending);
            sink += out[i % run];
            first = first + 2 * run <= n ? first + run : 0;  // the next run, from 0 again at the end
        }
        ns.push_back(seconds_since(t0) * 1e9 / double(runs * run));
    }
    std::sort(ns.begin(), ns.end());
    return sink == 0 ? -1 : ns[ns.size() / 2];
}

// The same for a mixture's step: `count` values, each of its own permutation (a domain each, sizes
// 1,000-99,999 at random, so both kinds of network), through map_each.
double map_each_ns_per_value(std::size_t count) {
    std::mt19937_64 rng(3);
    std::vector<feistel_permutation> perms;
    for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t size = 1000 + rng() % 99'000;  // before the key: the same domains from any compiler
        perms.emplace_back(size, rng());
    }
    std::vector<std::uint32_t> which(count), pending;
    for (std::size_t i = 0; i < count; ++i) which[i] = static_cast<std::uint32_t>(i);
    std::vector<std::uint64_t> in(count), out(count);
    std::vector<double> ns;
    std::uint64_t sink = 0;
    const std::uint64_t steps = 2'000'000 / count;
    for (int t = 0; t < 7; ++t) {
        std::fill(in.begin(), in.end(), 0);
        const auto t0 = clock_type::now();
        for (std::uint64_t i = 0; i < steps; ++i) {
            for (std::size_t k = 0; k < count; ++k) in[k] = in[k] + 1 < perms[k].size() ? in[k] + 1 : 0;  // each domain's next sample
            feistel_permutation::map_each(perms.data(), which.data(), in.data(), count, out.data(), pending);
            sink += out[i % count];
        }
        ns.push_back(seconds_since(t0) * 1e9 / double(steps * count));
    }
    std::sort(ns.begin(), ns.end());
    return sink == 0 ? -1 : ns[ns.size() / 2];
}

}  // namespace

int main() {
    const std::uint64_t seq_len = 2048, global_batch = 32;
    synthetic_dataset big{10'000'000, 10'000};
    std::printf("bench_sampling: %llu documents, mean length %llu tokens (~%.2g tokens), seq_len %llu, global batch %llu\n",
                static_cast<unsigned long long>(big.docs), static_cast<unsigned long long>(big.mean),
                static_cast<double>(big.docs * big.mean), static_cast<unsigned long long>(seq_len),
                static_cast<unsigned long long>(global_batch));

    // feedline: open + first batch.
    double base_rss = rss_mib();
    reset_peak();
    auto t0 = clock_type::now();
    sampler s(big, {.seq_len = seq_len, .global_batch = global_batch, .seed = 1, .rank = 0, .world_size = 1});
    double open_s = seconds_since(t0);
    t0 = clock_type::now();
    auto first = s.next();
    double first_s = seconds_since(t0);
    double open_peak = peak_rss_mib() - base_rss;
    std::printf("feedline open: %.3f s, first batch %.1f us, peak RSS +%.0f MiB (index %.0f MiB), %llu tokens, %llu samples/epoch\n",
                open_s, first_s * 1e6, open_peak, static_cast<double>(s.stream(0).memory_bytes()) / (1 << 20),
                static_cast<unsigned long long>(s.stream(0).tokens()), static_cast<unsigned long long>(s.stream(0).samples_per_epoch()));

    // Lookup: random steps within the epoch (no epoch change), ns per sample.
    std::mt19937_64 rng(5);
    const int lookups = 20000;
    std::uint64_t segs = 0;
    t0 = clock_type::now();
    for (int i = 0; i < lookups; ++i) segs += s.plan_at(rng() % s.steps_per_epoch()).samples.size();
    double lookup_ns = seconds_since(t0) * 1e9 / (static_cast<double>(lookups) * global_batch);
    std::printf("lookup: %.0f ns per sample (random steps, %llu samples)\n", lookup_ns, static_cast<unsigned long long>(segs));

    // Packed rows open: one more O(documents) pass and 8 bytes per document.
    t0 = clock_type::now();
    sampler packed(big,
                   {.seq_len = seq_len, .global_batch = global_batch, .seed = 1, .mode = sample_mode::packed, .rank = 0, .world_size = 1});
    packed.next();
    double packed_s = seconds_since(t0);
    std::printf("feedline packed open + first batch: %.3f s (index %.0f MiB, %llu padding tokens/epoch)\n", packed_s,
                static_cast<double>(packed.stream(0).memory_bytes()) / (1 << 20),
                static_cast<unsigned long long>(packed.stream(0).padding_tokens_per_epoch()));

    // Baseline: Megatron-style index arrays for the same 10^11 tokens, built in this run.
    double base_before = rss_mib();
    reset_peak();
    t0 = clock_type::now();
    auto arrays = build_index_arrays(big, seq_len, 1);
    double index_s = seconds_since(t0);
    double index_peak = peak_rss_mib() - base_before;
    double index_bytes = static_cast<double>(arrays.doc_idx.size() * 4 + arrays.sample_idx.size() * 4 + arrays.shuffle_idx.size() * 8);
    std::printf("index arrays (10^11 tokens): %.2f s, %.0f MiB arrays, peak RSS +%.0f MiB\n", index_s, index_bytes / (1 << 20), index_peak);

    // The same batch from a second sampler: opening is deterministic.
    sampler again(big, {.seq_len = seq_len, .global_batch = global_batch, .seed = 1, .rank = 0, .world_size = 1});
    bool same = again.next().samples[0].segments == first.samples[0].segments;
    std::printf("deterministic reopen: %s\n", same ? "yes" : "NO");
    // Planning 256 x 128 windows, 2*10^7 tokens (2*10^9 for 10^7 documents) of mean-200-token documents
    // but for the first case: 6 documents (shards) of ~3.3*10^6.
    const double plan_few = plan_ns_per_window(6, 20'000'000), plan_1e5 = plan_ns_per_window(100'000, 20'000'000),
                 plan_1e7 = plan_ns_per_window(10'000'000, 2'000'000'000);
    std::printf("planning 256 x 128 windows: %.1f ns per window with 6 documents, %.1f with 10^5, %.1f with 10^7\n", plan_few, plan_1e5,
                plan_1e7);
    const std::uint64_t tight = (std::uint64_t{1} << 20) - 3, loose = (std::uint64_t{1} << 20) + 3;
    const double map16_tight = map_ns_per_value(tight, 16), map16_loose = map_ns_per_value(loose, 16);
    const double map256_tight = map_ns_per_value(tight, 256), map256_loose = map_ns_per_value(loose, 256);
    const double each32 = map_each_ns_per_value(32);
    std::printf("shuffling, ns per value: runs of 16 %.1f (network ~n) %.1f (~4n), runs of 256 %.1f %.1f; 32 domains' own: %.1f\n",
                map16_tight, map16_loose, map256_tight, map256_loose, each32);
    std::printf(
        "{\"open_seconds\": %.3f, \"open_peak_rss_mib\": %.0f, \"lookup_ns\": %.0f, \"speedup_vs_index_array\": %.2f, "
        "\"index_array_seconds\": %.2f, \"index_array_peak_rss_mib\": %.0f, \"packed_open_seconds\": %.3f, "
        "\"plan_ns_per_window_6_documents\": %.1f, \"plan_ns_per_window_1e5_documents\": %.1f, \"plan_ns_per_window_1e7_documents\": "
        "%.1f, \"map_ns_run16_tight\": %.1f, \"map_ns_run16_loose\": %.1f, \"map_ns_run256_tight\": %.1f, \"map_ns_run256_loose\": %.1f, "
        "\"map_each_ns_32\": %.1f}\n",
        open_s + first_s, open_peak, lookup_ns, index_s / (open_s + first_s), index_s, index_peak, packed_s, plan_few, plan_1e5, plan_1e7,
        map16_tight, map16_loose, map256_tight, map256_loose, each32);
    return same ? 0 : 1;
}
