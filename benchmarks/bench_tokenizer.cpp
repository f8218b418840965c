// bench_tokenizer: feedline's encoder for sentencepiece models (Unigram, BPE) against libsentencepiece on the
// same documents, interleaved in rounds (library, feedline, library, ...), one thread unless told.
// Every document's ids are compared before anything is timed; a difference is reported and the run
// says identical: false. Last line: JSON with identical, documents, bytes, feedline_mb_per_s,
// sentencepiece_mb_per_s and vs_sentencepiece (the median of the rounds' ratios).
//
//   bench_tokenizer --model m.model --input docs.jsonl [--field text] [--threads N] [--rounds 5]
#include <sentencepiece_processor.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <feedline/transform/feedline_tokenizer.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"

namespace fb = feedline::bench;

namespace {

// Encodes every document once on `threads` threads (each its own encoder, made before the clock
// starts) and returns the seconds it took.
template <class Encoder>
double encode_all(std::vector<Encoder>& encoders, const std::vector<std::string>& docs) {
    std::atomic<std::size_t> next{0};
    const auto t0 = fb::clock_type::now();
    std::vector<std::thread> pool;
    for (auto& e : encoders)
        pool.emplace_back([&] {
            for (std::size_t i; (i = next.fetch_add(64)) < docs.size();)
                for (std::size_t k = i; k < std::min(docs.size(), i + 64); ++k) e(docs[k]);
        });
    for (auto& t : pool) t.join();
    return fb::seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app("feedline's sentencepiece encoder vs libsentencepiece: identical ids, then MB/s");
    std::string model, input, field = "text";
    unsigned threads = 1;
    int rounds = 5;
    app.add_option("--model", model, "a sentencepiece .model (Unigram or BPE)")->required();
    app.add_option("--input", input, "JSONL documents")->required();
    app.add_option("--field", field, "the JSONL field holding the text")->capture_default_str();
    app.add_option("--threads", threads, "encoding threads")->capture_default_str()->check(CLI::Range(1u, 512u));
    app.add_option("--rounds", rounds, "interleaved rounds")->capture_default_str()->check(CLI::Range(1, 100));
    CLI11_PARSE(app, argc, argv);

    std::vector<std::string> docs;
    std::uint64_t bytes = 0;
    {
        std::ifstream in(input);
        if (!in) {
            std::fprintf(stderr, "cannot read %s\n", input.c_str());
            return 1;
        }
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_object() && j.contains(field) && j[field].is_string()) {
                docs.push_back(j[field].get<std::string>());
                bytes += docs.back().size();
            }
        }
    }
    if (docs.empty()) {
        std::fprintf(stderr, "%s: no documents with a string field '%s'\n", input.c_str(), field.c_str());
        return 1;
    }

    sentencepiece::SentencePieceProcessor spm;
    if (auto st = spm.Load(model); !st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return 1;
    }
    feedline::feedline_tokenizer ours({.model = model, .add_eos = false, .piece_bytes = std::uint64_t(1) << 30});

    // Identical ids first, document by document.
    std::size_t differing = 0;
    std::vector<int> want;
    std::vector<std::int32_t> got;
    for (std::size_t i = 0; i < docs.size(); ++i) {
        want.clear();
        if (!spm.Encode(docs[i], &want).ok() || !ours.encode(docs[i], got).empty() ||
            !std::equal(want.begin(), want.end(), got.begin(), got.end())) {
            if (differing++ < 5) std::fprintf(stderr, "document %zu: ids differ\n", i);
        }
    }

    struct library_encoder {
        const sentencepiece::SentencePieceProcessor* spm;
        std::vector<int> ids;
        void operator()(const std::string& d) {
            ids.clear();
            (void)spm->Encode(d, &ids);
        }
    };
    struct feedline_encoder {
        std::unique_ptr<feedline::feedline_tokenizer> tok;
        std::vector<std::int32_t> ids;
        void operator()(const std::string& d) { (void)tok->encode(d, ids); }
    };
    std::vector<library_encoder> library(threads, library_encoder{&spm, {}});
    std::vector<feedline_encoder> own;
    for (unsigned t = 0; t < threads; ++t)
        own.push_back({std::make_unique<feedline::feedline_tokenizer>(
                           feedline::tokenizer_options{.model = model, .add_eos = false, .piece_bytes = std::uint64_t(1) << 30}),
                       {}});
    encode_all(library, docs);  // warm both: page cache, allocations, the per-thread buffers
    encode_all(own, docs);

    std::vector<double> lib_s, own_s, ratios;
    for (int r = 0; r < rounds; ++r) {
        lib_s.push_back(encode_all(library, docs));
        own_s.push_back(encode_all(own, docs));
        ratios.push_back(lib_s.back() / own_s.back());
    }
    const double mb = static_cast<double>(bytes) / 1e6;
    const auto lib = fb::summarise(lib_s), mine = fb::summarise(own_s), ratio = fb::summarise(ratios);
    std::printf("%zu documents, %.2f MB, %u thread(s), %d rounds; ids %s\n", docs.size(), mb, threads, rounds,
                differing ? "DIFFER" : "identical");
    std::printf("sentencepiece %8.2f MB/s (%.2f - %.2f)\n", mb / lib.median, mb / lib.hi, mb / lib.lo);
    std::printf("feedline      %8.2f MB/s (%.2f - %.2f)\n", mb / mine.median, mb / mine.hi, mb / mine.lo);
    std::printf("feedline / sentencepiece: %.2fx (rounds %.2f - %.2f)\n", ratio.median, ratio.lo, ratio.hi);
    nlohmann::json out = {{"identical", differing == 0},
                          {"differing_documents", differing},
                          {"documents", docs.size()},
                          {"bytes", bytes},
                          {"threads", threads},
                          {"feedline_mb_per_s", mb / mine.median},
                          {"sentencepiece_mb_per_s", mb / lib.median},
                          {"vs_sentencepiece", ratio.median},
                          {"model_bytes", ours.model_bytes()},
                          {"buffer_bytes", own[0].tok->buffer_bytes()},
                          {"model_type", ours.model().type_name()},
                          {"word_cache_hits", own[0].tok->cache_hits()},
                          {"word_cache_misses", own[0].tok->cache_misses()},
                          {"word_cache_rewalks", own[0].tok->cache_rewalks()}};
    std::printf("%s\n", out.dump().c_str());
    return differing == 0 ? 0 : 2;
}
