// Valid inputs the replay driver mutates, per target: a small Megatron .idx, llm.c headers of both
// widths, sampler states (binary and JSON) of each fuzzed sampler, JSONL and plain text, JSONL lines,
// token-lengths cache files.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <utility>

#ifdef FEEDLINE_FUZZ_TOKEN_LENGTHS
#include <feedline/format/token_lengths.hpp>
#endif
#ifdef FEEDLINE_FUZZ_SAMPLER_STATE
#include <feedline/sampling/state_io.hpp>

#include "fuzz_sampler_configs.hpp"
#endif

namespace {
template <class T>
void put(std::vector<std::uint8_t>& v, T x) {
    std::uint8_t b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    v.insert(v.end(), b, b + sizeof(T));
}
}  // namespace

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
    std::vector<std::vector<std::uint8_t>> seeds;
#if defined(FEEDLINE_FUZZ_MEGATRON_IDX)
    for (std::uint8_t code : {1, 4, 8}) {
        std::vector<std::uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
        put<std::uint64_t>(idx, 1);
        idx.push_back(code);
        put<std::uint64_t>(idx, 3);
        put<std::uint64_t>(idx, 3);
        for (std::int32_t len : {4, 0, 2}) put(idx, len);
        std::int64_t item = code == 1 ? 1 : code == 4 ? 4 : 2;
        for (std::int64_t p : {std::int64_t{0}, 4 * item, 4 * item}) put(idx, p);
        for (std::int64_t d : {0, 2, 3}) put<std::int64_t>(idx, d);
        put<std::uint64_t>(idx, 6 * static_cast<std::uint64_t>(item));  // .bin size
        seeds.push_back(idx);
    }
#elif defined(FEEDLINE_FUZZ_SAMPLER_STATE)
    // Byte 0 picks the sampler (and 0x80 the JSON form); states at the start and a few steps in.
    for (unsigned which = 0; which < feedline::fuzzing::sampler_kinds; ++which)
        for (int steps : {0, 5, -5}) {  // -5: 5 steps, then a version-2 state going on with another global batch
            auto sampler = feedline::fuzzing::make_sampler(which);  // (the mixture: weights set during the run)
            feedline::batch_plan plan;
            for (int i = 0; i < std::abs(steps); ++i) sampler->next(plan);
            if (steps < 0 && sampler->mixture()) sampler->set_mixture_weights({1, 2});
            if (steps > 0 && sampler->mixture()) sampler->set_mixture_weights({3, 1}, 9);  // a version-4 state: weights for step 9
            feedline::sampler_state state = sampler->state();
            if (steps < 0 && !sampler->mixture()) state = feedline::with_global_batch(state, state.global_batch + 1);
            std::vector<std::uint8_t> bin{static_cast<std::uint8_t>(which)};
            for (std::byte b : feedline::detail::to_bytes(state)) bin.push_back(static_cast<std::uint8_t>(b));
            seeds.push_back(bin);
#if FEEDLINE_HAS_JSON
            std::string json = feedline::to_json(state);
            std::vector<std::uint8_t> j{static_cast<std::uint8_t>(0x80 | which)};
            j.insert(j.end(), json.begin(), json.end());
            seeds.push_back(j);
#endif
        }
#if FEEDLINE_HAS_JSON
    // A state of the text pipeline before text was sampled like shards, which is refused by name.
    const std::string text_json =
        R"({"format": "feedline.text_state", "version": 1, "seed": 3, "seq_len": 8, "batch_size": 4, "world_size": 1, "rank": 0, "packed": 0, "step": 9, "document": 17, "offset": 5})";
    seeds.push_back({0x80});
    seeds.back().insert(seeds.back().end(), text_json.begin(), text_json.end());
#endif
#elif defined(FEEDLINE_FUZZ_SENTENCEPIECE_ENCODER)
    // Byte 0 picks the model; text of several scripts, spaces, controls, invalid bytes.
    for (std::uint8_t model : {0, 1, 2, 3, 4, 5})
        for (const std::string& text :
             {std::string("the river  naïve café 東京都市 🙂 Ｆｕｌｌ ﬁle ① x=1; 12345"),
              std::string("\t\x01\x7f \xff\xc0\xaf e\xcc\x81  "),
              std::string("<sep>ab▁x abab supercalifragilistic\0tail", sizeof "<sep>ab▁x abab supercalifragilistic\0tail" - 1)}) {
            seeds.push_back({model});
            seeds.back().insert(seeds.back().end(), text.begin(), text.end());
        }
#elif defined(FEEDLINE_FUZZ_BYTE_LEVEL_BPE)
    // Byte 0 picks the model; words the merges know, contractions, digits, whitespace runs, added
    // tokens, scripts, emoji, controls and invalid bytes.
    for (std::uint8_t model : {0, 1, 2})
        for (const std::string& text :
             {std::string("the river  naïve café 東京都市 🙂 don't It'S 12345 3.14 x=1;\n\n  {return 0;}"),
              std::string("\t\x01\x7f \xff\xc0\xaf e\xcc\x81  \r\n\xe2\x82 \xf0\x9f\x98"),
              std::string("<|endoftext|>the<s><|end|><|end supercalifragilistic\0tail",
                          sizeof "<|endoftext|>the<s><|end|><|end supercalifragilistic\0tail" - 1)}) {
            seeds.push_back({model});
            seeds.back().insert(seeds.back().end(), text.begin(), text.end());
        }
#elif defined(FEEDLINE_FUZZ_TEXT)
    // Byte 0: 3 JSONL, 0-2 a plain-text split (whole file, blank lines, lines); +4 skip_invalid.
    const std::string jsonl =
        "{\"text\": \"one\\nline \\u00e9\\ud83d\\ude00\"}\r\n\n  \n{\"id\": 2, \"text\": \"two\"}\n"
        "{\"text\": 3}\n[1]\n{\"text\": \"last, no newline\"}";
    const std::string plain = "first block\r\nsame block\n\n\n second\n \t\nthird\r\r\n";
    for (std::uint8_t mode : {3, 7}) {
        seeds.push_back({mode});
        seeds.back().insert(seeds.back().end(), jsonl.begin(), jsonl.end());
    }
    for (std::uint8_t mode : {0, 1, 2}) {
        seeds.push_back({mode});
        seeds.back().insert(seeds.back().end(), plain.begin(), plain.end());
    }
#elif defined(FEEDLINE_FUZZ_JSONL_FIELD)
    // Byte 0 picks the field ("text", "t", ""); lines where simdjson and nlohmann_json could part.
    for (const std::string line :
         {R"({"id": 7, "text": "a \u00e9\ud83d\ude00\n", "meta": {"t": [1.5e3, -0, true, null]}, "": "x"})",
          R"({"id": 123456789012345678901234567890, "text": "big", "t": 1e400})", "\xef\xbb\xbf{\"text\": \"bom\"}",
          R"({"text": "first", "te\u0078t": "last", "t": {"t": "nested"}})", R"([{"text": "x"}, "t"])"}) {
        seeds.push_back({0});
        seeds.back().insert(seeds.back().end(), line.begin(), line.end());
    }
    seeds.push_back({1, '{', '"', 't', '"', ':', '"', 'x', '"', '}'});
#elif defined(FEEDLINE_FUZZ_TOKEN_LENGTHS)
    // Cache files as the text source writes them: a key, then a few documents' counts (one empty).
    for (const auto& lengths : {std::vector<std::uint32_t>{}, std::vector<std::uint32_t>{3, 0, 70000, 12}}) {
        const auto bytes = feedline::token_lengths{"feedline.token_lengths 1\nfile a.jsonl 12 1.5 7\n", lengths}.encode();
        seeds.emplace_back(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                           reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size());
    }
#elif defined(FEEDLINE_FUZZ_CHECKPOINT_MANIFEST)
    // Byte 0 picks the document: even, a manifest; odd, a trainer.json (with an empty tensors file).
    const std::string manifest =
        R"({"format": "feedline-train checkpoint manifest", "version": 1, "files": [)"
        R"({"name": "trainer.json", "bytes": 412, "crc32": 3735928559}, {"name": "tensors.bin", "bytes": 16, "crc32": 1}]})";
    const std::string trainer_json =
        R"({"format": "feedline-train checkpoint", "version": 1, "step": 2, "tokens": 128,)"
        R"( "model": {"vocab": 20, "context": 2, "embed": 4, "hidden": 8}, "global_batch": 2, "seq_len": 16,)"
        R"( "grad_accum": 2, "seed": 7, "mode": "windows", "pipeline_state": {"format": "feedline.sampler_state", "version": 1, "step": 4}})";
    for (const auto& [which, text] : {std::pair{0, manifest}, std::pair{1, trainer_json}}) {
        std::vector<std::uint8_t> seed{static_cast<std::uint8_t>(which)};
        seed.insert(seed.end(), text.begin(), text.end());
        seeds.push_back(seed);
    }
#elif defined(FEEDLINE_FUZZ_MIXTURE_FILE)
    // Byte 0: the global batch (1 + byte % 16). Stages at steps and tokens, a ramp, zero weights, a
    // domain that starts mid-run; and a file with a mistake for the error paths.
    const std::string good = R"({"domains": ["web", {"name": "code", "data": ["a", "b"]}, "math"],)"
                             R"( "stages": [{"at_step": 0, "weights": {"web": 6, "code": 3}},)"
                             R"( {"at_tokens": 2048, "ramp_steps": 5, "weights": {"web": 1, "math": 4}},)"
                             R"( {"at_step": 40, "weights": {"code": 0.5, "math": 1e-3}}]})";
    const std::string bad = R"({"domains": ["web", "web"], "stages": [{"at_step": 3, "weights": {"x": -1}}]})";
    // A number past a double's range: nlohmann's out_of_range, not a parse_error (found by libFuzzer).
    const std::string huge = R"({"domains": ["web"], "stages": [{"at_step": 0, "weights": {"web": 3e999}}]})";
    for (const auto& [b, text] : {std::pair{3, good}, std::pair{0, good}, std::pair{7, bad}, std::pair{1, huge}}) {
        std::vector<std::uint8_t> seed{static_cast<std::uint8_t>(b)};
        seed.insert(seed.end(), text.begin(), text.end());
        seeds.push_back(seed);
    }
#elif defined(FEEDLINE_FUZZ_DOCTOR_INPUT)
    // Byte 0 picks the reader: even, a scenario; odd, a feedline-train --json log.
    const std::string scenario =
        R"({"gpus": [{"memory_total_mib": 20480, "memory_used_mib": 9587, "utilization": 1.0}],)"
        R"( "host": {"cores": 16, "ram_total_mib": 32768, "ram_used_mib": 30822, "swap_total_mib": 4096, "swap_used_mib": 2100},)"
        R"( "training": {"micro_batch": 16, "grad_accum": 8, "data_workers": 0, "pinned_memory": false, "stall_fraction": null},)"
        R"( "process": {"rss_anon_mib": 900, "rss_file_mib": 3000}, "numa": {"gpu_node": 0, "worker_nodes": [0, 1]}})";
    const std::string log =
        "{\"step\": 1, \"loss\": 5.2, \"tokens_per_s\": 1000.5, \"stall_fraction\": 0.3}\n"
        "{\"summary\": true, \"stall_fraction\": 0.2, \"tokens_per_s\": 900, \"pipeline\": {\"workers\": 1, \"device\": \"host ring\"}}\n";
    // Nested just past the readers' limit (64 levels), as a log line and as a whole file; and a log
    // whose last line is cut.
    const std::string deep = "{\"step\": 1, \"stall_fraction\": 0.1, \"x\": " + std::string(70, '[') + std::string(70, ']') + "}\n";
    const std::string cut = log + "{\"step\": 2, \"stall_fra";
    for (const auto& [which, text] :
         {std::pair{0, scenario}, std::pair{1, log}, std::pair{0, deep}, std::pair{1, deep}, std::pair{0, cut}}) {
        std::vector<std::uint8_t> seed(text.size() + 1, static_cast<std::uint8_t>(which));
        std::memcpy(seed.data() + 1, text.data(), text.size());
        seeds.push_back(std::move(seed));
    }
#else
    for (auto [magic, version, width] : {std::tuple{20240520, 1, 2}, std::tuple{20240801, 7, 4}}) {
        std::vector<std::uint8_t> h(1024, 0);
        std::int32_t hdr[4] = {magic, version, 5, 0};
        std::memcpy(h.data(), hdr, sizeof(hdr));
        h.resize(1024 + 5 * static_cast<std::size_t>(width), 1);
        put<std::uint64_t>(h, 0);  // odd size claim: "use the real size"
        seeds.push_back(h);
    }
#endif
    return seeds;
}
