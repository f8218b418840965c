// feedline's byte-level BPE encoder for tokenizer.json models (transform/byte_level_bpe.hpp) on models
// written here: merges against a plain reference (the lowest rank first, the leftmost of equals, done
// again and again until none applies), added tokens (leftmost, then longest; raw before normalized),
// ignore_merges, the leading-space step, text that is not valid UTF-8 (read as Python's "replace"
// does), NFC (Unicode's own examples), kind auto's choice, a pipeline reading text with such a model, and every kind of bad file
// refused with a config_error naming the file and what is wrong. Ids against the `tokenizers` package
// itself: tests/python/test_tokenizer_json.py.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>
#include <feedline/transform/tokenizers.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace ft = feedline::test;
using namespace feedline;
using nlohmann::json;

namespace {

// A byte in GPT-2's byte-level alphabet, as UTF-8.
std::string in_alphabet(unsigned char b) {
    const char32_t c = detail::byte_level_alphabet()[b];
    if (c < 0x80) return std::string(1, char(c));
    return {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
}
std::string in_alphabet(std::string_view bytes) {
    std::string out;
    for (const char b : bytes) out += in_alphabet(static_cast<unsigned char>(b));
    return out;
}

// A byte-level BPE: ids 0-255 are the bytes, then each merge's token in order, then the added tokens.
struct bpe_spec {
    std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
    std::vector<std::pair<std::string, bool>> added;          // content, normalized
    json pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    json normalizer = nullptr;
    bool ignore_merges = false;

    json to_json() const {
        json vocab = json::object();
        for (int b = 0; b < 256; ++b) vocab[in_alphabet(static_cast<unsigned char>(b))] = b;
        json merge_list = json::array();
        for (const auto& [a, b] : merges) {
            const std::string made = in_alphabet(a + b);
            if (!vocab.contains(made)) vocab[made] = vocab.size();
            merge_list.push_back(json::array({in_alphabet(a), in_alphabet(b)}));
        }
        json added_list = json::array();
        for (const auto& [content, normalized] : added) {
            const int id = static_cast<int>(vocab.size() + added_list.size());
            added_list.push_back({{"id", id},
                                  {"content", content},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", normalized},
                                  {"special", true}});
        }
        return {{"version", "1.0"},
                {"added_tokens", added_list},
                {"normalizer", normalizer},
                {"pre_tokenizer", pre_tokenizer},
                {"post_processor", nullptr},
                {"decoder", {{"type", "ByteLevel"}}},
                {"model",
                 {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", ignore_merges},
                  {"vocab", vocab},
                  {"merges", merge_list}}}};
    }
    std::string write(const ft::scratch_dir& dir, const std::string& name) const {
        const std::string path = dir / name;
        ft::write_text(path, to_json().dump(2));
        return path;
    }
};

std::vector<std::int32_t> encode(const std::string& model, std::string_view text) {
    auto t = make_tokenizer({.model = model, .add_eos = false});
    std::vector<std::int32_t> ids;
    REQUIRE(t->encode(text, ids).empty());
    return ids;
}

// BPE as its definition says: while some adjacent pair has a merge, merge the leftmost pair of the
// lowest rank. Ids of the tokens, from the model's own json.
std::vector<std::int32_t> reference_bpe(const json& model, std::string_view word) {
    const json& vocab = model["model"]["vocab"];
    std::vector<std::string> pieces;
    for (const char c : word) pieces.push_back(in_alphabet(static_cast<unsigned char>(c)));
    std::map<std::pair<std::string, std::string>, std::size_t> rank;
    for (std::size_t i = 0; i < model["model"]["merges"].size(); ++i)
        rank.emplace(std::pair{model["model"]["merges"][i][0].get<std::string>(), model["model"]["merges"][i][1].get<std::string>()}, i);
    for (;;) {
        std::size_t best = pieces.size(), best_rank = 0;
        for (std::size_t i = 0; i + 1 < pieces.size(); ++i)
            if (auto it = rank.find({pieces[i], pieces[i + 1]}); it != rank.end() && (best == pieces.size() || it->second < best_rank))
                best = i, best_rank = it->second;
        if (best == pieces.size()) break;
        pieces[best] += pieces[best + 1];
        pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    std::vector<std::int32_t> ids;
    for (const auto& p : pieces) ids.push_back(vocab.at(p).get<std::int32_t>());
    return ids;
}

std::string random_text(std::mt19937& rng, std::size_t n) {
    static const std::vector<std::string> parts = {"a", "b",  "ab",   "the ", "th", "he", " ",  "  ",
                                                   "é", "東", "🙂", "\n",   "e",  "t",  "aa", "ba"};
    std::string s;
    while (s.size() < n) s += parts[rng() % parts.size()];
    return s;
}

}  // namespace

TEST_CASE("TokenizerJson.MergesAreTheLowestRankFirstAndTheLeftmostOfEqualRanks") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};  // the whole text one word
    spec.merges = {{"b", "c"}, {"a", "a"}, {"a", "b"}, {"a", "bc"}, {"t", "h"}, {"th", "e"}, {" ", "the"}, {"aa", "aa"}};
    const json j = spec.to_json();
    const std::string model = spec.write(dir, "tokenizer.json");
    const auto id = [&](std::string_view raw) { return j["model"]["vocab"].at(in_alphabet(raw)).get<std::int32_t>(); };

    CHECK(encode(model, "abc") == std::vector{id("abc")});          // b+c (rank 0) before a+b (rank 2), then a+bc
    CHECK(encode(model, "aaa") == std::vector{id("aa"), id("a")});  // a+a at 0 before a+a at 1 (no merge makes "aaa")
    CHECK(encode(model, "aaaa") == std::vector{id("aaaa")});        // a+a twice, then aa+aa
    CHECK(encode(model, "aab") == std::vector{id("aa"), id("b")});  // a+a (rank 1) before a+b (rank 2)
    CHECK(encode(model, " the") == std::vector{id(" the")});        // a merge of merges

    // Long random words against the definition.
    std::mt19937 rng(11);
    for (int round = 0; round < 200; ++round) {
        const std::string text = random_text(rng, 1 + rng() % 300);
        INFO("text: " << text);
        CHECK(encode(model, text) == reference_bpe(j, text));
    }
}

TEST_CASE("TokenizerJson.TextThatIsNotUtf8IsReadAsPythonsReplaceReadsIt") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{"\xef", "\xbf"}, {"\xef\xbf", "\xbd"}, {"a", "b"}};
    const std::string model = spec.write(dir, "tokenizer.json");
    // Each maximal invalid subpart is one U+FFFD: a lone continuation byte, a truncated sequence, an
    // overlong form, a surrogate (ED A0 80: three), a code point above U+10FFFF.
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"ab\x80"
         "ab",
         "ab\xef\xbf\xbd"
         "ab"},
        {"\xf0\x9f\x98", "\xef\xbf\xbd"},
        {"\xf0\x9f\x98 ab", "\xef\xbf\xbd ab"},
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82", "\xef\xbf\xbd"},
        {"\xe2\x82\xac", "\xe2\x82\xac"},
        {std::string("a\0b", 3), std::string("a\0b", 3)},
    };
    for (const auto& c : cases) {
        INFO("bytes: " << c.first);  // (clang 14 cannot capture a structured binding in INFO's lambda)
        CHECK(encode(model, c.first) == encode(model, c.second));
    }
    CHECK(encode(model, "\x80") == encode(model, "\xef\xbf\xbd"));
    CHECK(encode(model, "\x80").size() == 1);  // the merged U+FFFD
}

TEST_CASE("TokenizerJson.AddedTokensAreCutOutLeftmostThenLongestRawBeforeNormalized") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{"a", "b"}};
    spec.added = {{"<|end|>", false}, {"<|end|>x", false}, {"ab<", true}, {"b<|e", true}};
    const json j = spec.to_json();
    const std::string model = spec.write(dir, "tokenizer.json");
    const auto added = [&](int i) { return j["added_tokens"][i]["id"].get<std::int32_t>(); };
    const auto id = [&](std::string_view raw) { return j["model"]["vocab"].at(in_alphabet(raw)).get<std::int32_t>(); };

    CHECK(encode(model, "<|end|>") == std::vector{added(0)});
    CHECK(encode(model, "<|end|>x") == std::vector{added(1)});                           // the longest at the leftmost start
    CHECK(encode(model, "ab<|end|>ab") == std::vector{id("ab"), added(0), id("ab")});    // raw tokens first: "ab<" never sees its '<'
    CHECK(encode(model, "ab<x") == std::vector{added(2), id("x")});                      // a normalized token, in what is left
    CHECK(encode(model, "zab<|e") == std::vector{id("z"), added(2), id("|"), id("e")});  // leftmost wins over longer later
    CHECK(encode(model, "<|end|><|end|>") == std::vector{added(0), added(0)});
}

TEST_CASE("TokenizerJson.IgnoreMergesTakesAWordInTheVocabularyWhole") {
    ft::scratch_dir dir;
    bpe_spec spec;
    // "abc" is in the vocabulary (made by merge 2), but merges alone split "abc" as a+bc? No: they make
    // ab first (rank 0), then ab+c is no merge, so ab, c; with ignore_merges the word is one token.
    spec.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}};
    const json j = spec.to_json();
    const auto id = [&](std::string_view raw) { return j["model"]["vocab"].at(in_alphabet(raw)).get<std::int32_t>(); };
    const std::string plain = spec.write(dir, "plain.json");
    spec.ignore_merges = true;
    const std::string whole = spec.write(dir, "whole.json");
    CHECK(encode(plain, "abc") == std::vector{id("ab"), id("c")});
    CHECK(encode(whole, "abc") == std::vector{id("abc")});
    CHECK(encode(whole, "abcab") == std::vector{id("ab"), id("c"), id("ab")});  // not in the vocabulary: merged
}

TEST_CASE("TokenizerJson.ThePreTokenizerSplitsWordsAndAddsTheLeadingSpaceWhereAsked") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{" ", "a"}, {"a", "a"}, {"a", " "}};
    const json j = spec.to_json();
    const auto id = [&](std::string_view raw) { return j["model"]["vocab"].at(in_alphabet(raw)).get<std::int32_t>(); };
    const std::string gpt2 = spec.write(dir, "gpt2.json");
    // GPT-2's pattern: " ?\p{L}+" takes the space before a word; "a " never forms across words.
    CHECK(encode(gpt2, "a a") == std::vector{id("a"), id(" a")});
    CHECK(encode(gpt2, "aa  a") == std::vector{id("aa"), id(" "), id(" a")});  // \s+(?!\S) leaves the last space to the word
    spec.pre_tokenizer["add_prefix_space"] = true;
    const std::string spaced = spec.write(dir, "spaced.json");
    CHECK(encode(spaced, "a a") == std::vector{id(" a"), id(" a")});
    // Split before ByteLevel, as Llama-3's file has it: here every character is its own piece.
    spec.pre_tokenizer = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", "."}}}, {"behavior", "Isolated"}, {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    const std::string split = spec.write(dir, "split.json");
    CHECK(encode(split, "aa a") == std::vector{id("a"), id("a"), id(" "), id("a")});
}

TEST_CASE("TokenizerJson.KindAutoTakesItAndBosEosAreTheModelsSpecialTokens") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{"h", "i"}};
    spec.added = {{"<|endoftext|>", false}};
    const json j = spec.to_json();
    const std::string model = spec.write(dir, "tokenizer.json");
    auto t = make_tokenizer({.model = model});
    CHECK(t->kind() == "byte-level-bpe");
    CHECK(t->describe() == "feedline's byte-level BPE encoder");
    CHECK(t->eos_id() == j["added_tokens"][0]["id"].get<int>());
    CHECK(t->bos_id() == -1);
    CHECK(t->vocab_size() == j["added_tokens"][0]["id"].get<int>() + 1);
    std::vector<std::int32_t> ids;
    REQUIRE(t->encode("hi", ids).empty());
    CHECK(ids == std::vector<std::int32_t>{j["model"]["vocab"].at("hi").get<std::int32_t>(), t->eos_id()});
    CHECK(t->identity().find("byte-level-bpe 1 model crc32") == 0);
    CHECK_THROWS_AS(make_tokenizer({.model = model, .add_bos = true}), config_error);

    // A pipeline over text with it: every window's tokens are the documents' ids, EOS after each.
    std::string lines;
    std::vector<std::int32_t> expected;
    for (int i = 0; i < 300; ++i) {
        const std::string line = "hi there " + std::to_string(i) + " 東京🙂";
        lines += line + "\n";
        REQUIRE(t->encode(line, ids).empty());
        expected.insert(expected.end(), ids.begin(), ids.end());
    }
    ft::write_text(dir / "corpus.txt", lines);
    pipeline_config c{
        .batch_size = 2, .seq_len = 16, .seed = 3, .workers = 2, .device = device_kind::cpu, .rank = 0, .world_size = 1, .max_steps = 5};
    c.text.tokenizer = model;
    c.text.cache_dir = "none";
    c.text.documents.split = text_split::lines;
    c.shuffle = shuffle_mode::none;
    pipeline p(dir / "corpus.txt", c);
    std::size_t windows = 0;
    for (auto& batch : p) {
        const auto inputs = batch.host_inputs();
        for (std::size_t w = 0; w < 2; ++w, ++windows) {
            // Each window's inputs are a stretch of the concatenated documents.
            const auto first = inputs.begin() + static_cast<std::ptrdiff_t>(w * 16);
            CHECK(std::search(expected.begin(), expected.end(), first, first + 16) != expected.end());
        }
    }
    CHECK(windows == 10);
}

TEST_CASE("TokenizerJson.BadFilesAreRefusedNamingTheFileAndWhatIsWrong") {
    ft::scratch_dir dir;
    const auto refused = [&](const std::string& name, const std::string& contents, const std::string& why) {
        const std::string path = dir / name;
        ft::write_text(path, contents);
        INFO(name);
        try {
            (void)make_tokenizer({.model = path});
            FAIL("accepted");
        } catch (const config_error& e) {
            const std::string what = e.what();
            INFO(what);
            CHECK(what.find(path) != std::string::npos);
            CHECK(what.find(why) != std::string::npos);
        }
    };
    bpe_spec good;
    good.merges = {{"a", "b"}};
    const json base = good.to_json();
    const auto with = [&](const std::function<void(json&)>& change) {
        json j = base;
        change(j);
        return j.dump();
    };
    refused("truncated.json", base.dump().substr(0, 200), "not valid JSON (at byte");
    refused("nomodel.json", "{\"version\": \"1.0\"}", "no \"model\"");
    refused("nfkc.json", with([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }), "normalizer (NFKC) is not supported");
    refused("lower.json", with([](json& j) {
                j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
            }),
            "normalizer (Lowercase) is not supported");
    refused("whitespace.json", with([](json& j) {
                j["pre_tokenizer"] = {{"type", "Whitespace"}};
            }),
            "pre-tokenizer Whitespace is not supported");
    refused("nopre.json", with([](json& j) { j["pre_tokenizer"] = nullptr; }), "no pre-tokenizer");
    refused("removed.json", with([](json& j) {
                j["pre_tokenizer"] = {{"type", "Sequence"},
                                      {"pretokenizers",
                                       {{{"type", "Split"}, {"pattern", {{"Regex", "\\s"}}}, {"behavior", "Removed"}, {"invert", false}},
                                        {{"type", "ByteLevel"}}}}};
            }),
            "Split behavior Removed is not supported");
    refused("badregex.json", with([](json& j) {
                j["pre_tokenizer"] = {
                    {"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}}}}};
            }),
            "does not compile");
    refused("wordpiece.json", with([](json& j) { j["model"]["type"] = "WordPiece"; }), "model type WordPiece is not supported");
    refused("dropout.json", with([](json& j) { j["model"]["dropout"] = 0.1; }), "dropout");
    refused("merge.json", with([](json& j) {
                j["model"]["merges"].push_back(json::array({"a", "zz"}));
            }),
            "merge 1 (\"a\", \"zz\") names a token not in the vocabulary");
    refused("mergeform.json", with([](json& j) { j["model"]["merges"].push_back(42); }), "merge 1 is neither");
    refused("id.json", with([](json& j) { j["model"]["vocab"]["a"] = -3; }), "is not an id");
    refused("lstrip.json", with([](json& j) {
                j["added_tokens"].push_back({{"id", 900}, {"content", "<x>"}, {"lstrip", true}});
            }),
            "added token \"<x>\" sets lstrip");
    // Not a regular file, or none.
    std::filesystem::create_directory(dir / "dir.json");
    try {
        (void)make_tokenizer({.model = dir / "dir.json", .kind = "byte-level-bpe"});
        FAIL("accepted a directory");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("dir.json") != std::string::npos);
    }
    CHECK_THROWS_AS(make_tokenizer({.model = dir / "missing.json", .kind = "byte-level-bpe"}), config_error);
}

TEST_CASE("TokenizerJson.AWordLongerThanMaxUnsplitBytesIsRefusedAndTheTokenizerGoesOn") {
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{"a", "a"}};
    const std::string model = spec.write(dir, "tokenizer.json");
    auto t = make_tokenizer({.model = model, .add_eos = false, .max_unsplit_bytes = 1000});
    std::vector<std::int32_t> ids;
    const std::string problem = t->encode(std::string(1001, 'a'), ids);
    CHECK(problem.find("a word of 1001 bytes") != std::string::npos);
    std::string words;
    for (int i = 0; i < 300; ++i) words += "aaaa ";
    REQUIRE(t->encode(words, ids).empty());  // many words, each short: fine, and the refusal left nothing behind
    CHECK(ids == encode(model, words));
}

TEST_CASE("TokenizerJson.NfcComposesReordersAndLeavesNfcTextAlone") {
    detail::unicode_nfc nfc;
    std::string buffer;
    const auto normalized = [&](std::string_view text) { return std::string(nfc.normalize(text, buffer)); };
    // Text already in NFC comes back as itself, not copied.
    for (const std::string_view text : {"plain ASCII text, long enough for eight-byte steps", "caf\u00e9 \u6771\u4eac \uac01", ""}) {
        std::string kept(text);
        CHECK(nfc.normalize(kept, buffer).data() == kept.data());
    }
    // UAX #15's examples and the cases it names: composition, singletons, canonical order of marks,
    // a blocked mark, Hangul by the algorithm, a composition exclusion, a mark with no starter.
    CHECK(normalized("e\u0301") == "\u00e9");
    CHECK(normalized("D\u0307\u0323") == "\u1e0c\u0307");  // dot below (220) goes first and composes
    CHECK(normalized("\u1e0b\u0323") == "\u1e0d\u0307");   // precomposed, then reordered
    CHECK(normalized("\u212b") == "\u00c5");               // Angstrom sign: a singleton
    CHECK(normalized("\u2126") == "\u03a9");               // Ohm sign
    CHECK(normalized("\uf900") == "\u8c48");               // a compatibility ideograph
    CHECK(normalized("a\u0316\u0301") == "\u00e1\u0316");  // 230 after 220 still composes
    CHECK(normalized("a\u0301\u0301") == "\u00e1\u0301");  // the second acute is blocked
    CHECK(normalized("\u1100\u1161\u11a8") == "\uac01");   // L V T
    CHECK(normalized("\uac00\u11a8") == "\uac01");         // LV T
    CHECK(normalized("\u0958") == "\u0915\u093c");         // excluded from composition
    CHECK(normalized("\u0301x") == "\u0301x");             // no starter before the mark
    CHECK(normalized("long ASCII prefix.. e\u0301 and after") == "long ASCII prefix.. \u00e9 and after");

    // A model that asks for NFC gives composed and decomposed text the same ids, and a normalized added
    // token written decomposed matches the composed text.
    ft::scratch_dir dir;
    bpe_spec spec;
    spec.merges = {{"\xc3", "\xa9"}, {"caf", "\xc3\xa9"}};
    spec.merges.insert(spec.merges.begin(), {{"c", "a"}, {"ca", "f"}});
    spec.normalizer = {{"type", "NFC"}};
    spec.added = {{"ne\u0301!", true}};
    const std::string model = spec.write(dir, "nfc.json");
    CHECK(encode(model, "cafe\u0301") == encode(model, "caf\u00e9"));
    CHECK(encode(model, "cafe\u0301").size() == 1);
    const auto added = encode(model, "n\u00e9!");
    REQUIRE(added.size() == 1);
    CHECK(added[0] == spec.to_json()["added_tokens"][0]["id"].get<std::int32_t>());
    spec.normalizer = nullptr;  // without the normalizer the decomposed form stays apart
    CHECK(encode(spec.write(dir, "plain.json"), "cafe\u0301").size() > 1);
}
