// feedline's own encoders for sentencepiece Unigram and BPE models against libsentencepiece, id for id:
// models trained here with spm_train's options (normalizers, byte fallback, split digits, user-defined
// symbols, whitespace handling, short pieces) and with a restricted vocabulary (unused pieces), text of
// many scripts with emoji, combining marks, control characters, NUL, invalid UTF-8 and whitespace runs;
// through make_tokenizer and a pipeline too, and kind auto's choice between the encoders.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>
#include <feedline/transform/tokenizers.hpp>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace ft = feedline::test;
using namespace feedline;

namespace {

// Words of many scripts and kinds, with what NFKC and case folding rewrite (full-width forms,
// ligatures, circled and superscript digits, compatibility characters) and what they leave.
const std::vector<std::string> words = {"the",
                                        "river",
                                        "quiet",
                                        "dawn",
                                        "carried",
                                        "boats",
                                        "Hello",
                                        "WORLD",
                                        "naïve",
                                        "café",
                                        "résumé",
                                        "déjà",
                                        "Ça",
                                        "coûte",
                                        "e\xcc\x81",
                                        "n\xcc\x83o",
                                        "a\xcc\x8a\xcc\x81",  // combining acute, tilde, ring + acute
                                        "東京",
                                        "大きい",
                                        "都市",
                                        "です",
                                        "日本語",
                                        "中文",
                                        "漢字",
                                        "カタカナ",
                                        "ひらがな",
                                        "한국어",
                                        "서울",
                                        "Ελληνικά",
                                        "κείμενα",
                                        "Русский",
                                        "текст",
                                        "العربية",
                                        "مرحبا",
                                        "עברית",
                                        "हिन्दी",
                                        "नमस्ते",
                                        "ไทย",
                                        "ภาษา",
                                        "🙂",
                                        "👍🏽",
                                        "👨‍👩‍👧",
                                        "🇩🇪",
                                        "❤️",
                                        "Ｆｕｌｌ",
                                        "ｗｉｄｔｈ",
                                        "ﬁle",
                                        "ﬂow",
                                        "①②",
                                        "x²",
                                        "Ⅻ",
                                        "㍿",
                                        "ｶﾀｶﾅ",
                                        "™",
                                        "…",
                                        "x=1;",
                                        "y",
                                        "=",
                                        "2;",
                                        "if(a&&b){",
                                        "return",
                                        "0;}",
                                        "#include",
                                        "<vector>",
                                        "std::map<int,",
                                        "int>",
                                        "0x1F",
                                        "3.14159",
                                        "1234567890",
                                        "42",
                                        "2026-11-25",
                                        "€3,50",
                                        "$100",
                                        "@user",
                                        "#tag",
                                        "https://example.com/a?b=c",
                                        "C:\\path",
                                        "supercalifragilisticexpialidocious",
                                        "Donaudampfschifffahrtsgesellschaftskapitän"};

const std::vector<std::string> gaps = {" ", " ", " ", "  ", "   ", "\t", "\n", " \n ", "\r\n", "\xe3\x80\x80", "\xc2\xa0", "\xe2\x80\x8b"};

// Bytes and characters that stress a normalizer: controls, NUL, C1 controls, U+FFFD itself, invalid
// UTF-8 (lone continuation bytes, overlong forms, surrogates, cut sequences, bytes never valid).
const std::vector<std::string> oddities = {std::string("\0", 1),
                                           "\x01",
                                           "\x07",
                                           "\x1b[0m",
                                           "\x7f",
                                           "\xc2\x80",
                                           "\xc2\x9f",
                                           "\xef\xbf\xbd",
                                           "\x80",
                                           "\xbf",
                                           "\xc0\xaf",
                                           "\xe0\x80\xaf",
                                           "\xed\xa0\x80",
                                           "\xe2\x82",
                                           "\xf0\x9f\x99",
                                           "\xf8\x88\x80\x80\x80",
                                           "\xfe",
                                           "\xff",
                                           "\xf4\x90\x80\x80",
                                           "\xe2\x96\x81",
                                           "\xe2\x96\x81\xe2\x96\x81",
                                           "<s>",
                                           "</s>",
                                           "<unk>",
                                           "<0x41>",
                                           "<sep>"};

std::string sentence(std::mt19937& rng, bool odd) {
    std::string s;
    const std::size_t n = 1 + rng() % 14;
    for (std::size_t i = 0; i < n; ++i) {
        s += words[rng() % words.size()];
        if (odd && rng() % 4 == 0) s += oddities[rng() % oddities.size()];
        s += gaps[rng() % gaps.size()];
    }
    return s;
}

// The training text: sentences of `words`, and the machine's own license texts (real English prose)
// where it has them.
std::string training_text() {
    std::mt19937 rng(3);
    std::string text;
    for (int i = 0; i < 3000; ++i) text += sentence(rng, false) + "\n";
    for (const char* license : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"})
        if (std::filesystem::is_regular_file(license)) text += ft::read_text(license);
    return text;
}

// Texts to compare on: sentences with oddities, random bytes, long words, whitespace runs, the edges.
std::vector<std::string> probe_texts() {
    std::mt19937 rng(17);
    std::vector<std::string> texts = {"",
                                      " ",
                                      "   ",
                                      "\t\n",
                                      "a",
                                      "▁",
                                      " ▁ ",
                                      std::string(3, '\0'),
                                      "\xff\xfe\xfd",
                                      std::string(500, 'a'),
                                      std::string(300, ' ') + "x" + std::string(300, ' ')};
    for (int i = 0; i < 1500; ++i) texts.push_back(sentence(rng, true));
    for (int i = 0; i < 300; ++i) {  // arbitrary bytes
        std::string s(rng() % 40, '\0');
        for (char& c : s) c = static_cast<char>(rng());
        texts.push_back(s);
    }
    for (int i = 0; i < 100; ++i) {  // characters glued without spaces, then a very long word
        std::string s;
        for (int k = 0; k < 30; ++k) s += words[rng() % words.size()];
        texts.push_back(s);
    }
    std::string long_word;
    for (int k = 0; k < 2000; ++k) long_word += words[k % words.size()];
    texts.push_back(long_word);
    return texts;
}

std::string escaped(const std::string& s) {
    std::string out;
    for (unsigned char c : s)
        if (c >= 0x20 && c < 0x7f)
            out += static_cast<char>(c);
        else {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", c);
            out += hex;
        }
    return out;
}

struct trained {
    ft::scratch_dir dir;
    std::string text_file = dir / "train.txt";
    trained() { ft::write_text(text_file, training_text()); }
    std::string model(const std::string& name, const std::string& options) {
        const std::string prefix = dir / name;
        auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + text_file + " --model_prefix=" + prefix +
                                                             " --vocab_size=800 --hard_vocab_limit=false --minloglevel=2 --num_threads=1 " +
                                                             options);
        REQUIRE_MESSAGE(st.ok(), st.ToString());
        return prefix + ".model";
    }
};

}  // namespace

namespace {

// feedline's encoder of `model` against libsentencepiece on every probe text, twice (the second pass
// finds the words in the caches), through the tokenizer and the encoder with its word cache, with none
// and with one so small it starts over all the time; then one long text.
template <class Encoder>
void compare_with_library(const std::string& name, const std::string& model, const std::vector<std::string>& texts) {
    CAPTURE(name);
    sentencepiece::SentencePieceProcessor spm;
    REQUIRE(spm.Load(model).ok());
    feedline_tokenizer ours({.model = model, .add_eos = false});
    const auto tables = std::make_shared<const detail::sentencepiece_pieces>(detail::read_sentencepiece_model(ft::read_text(model)));
    REQUIRE(tables->problem.empty());
    Encoder cached(tables), uncached(tables, 0), tiny(tables, 2000);
    std::size_t compared = 0, differing = 0, tokens = 0;
    std::vector<std::int32_t> got, a, b, c;
    for (int pass = 0; pass < 2; ++pass)
        for (const std::string& text : texts) {
            std::vector<int> want;
            REQUIRE(spm.Encode(text, &want).ok());
            REQUIRE(ours.encode(text, got).empty());
            a.clear(), b.clear(), c.clear();
            cached.encode(text, a);
            uncached.encode(text, b);
            tiny.encode(text, c);
            ++compared;
            tokens += want.size();
            const std::vector<std::int32_t> ids(want.begin(), want.end());
            if ((ids != got || ids != a || ids != b || ids != c) && differing++ < 3)
                FAIL_CHECK("ids differ for \"" << escaped(text) << "\" (tokenizer " << (ids == got) << ", cached " << (ids == a)
                                               << ", uncached " << (ids == b) << ", tiny cache " << (ids == c) << ")");
        }
    // One long text: for Unigram the running score grows, and cached words whose margin it overtakes
    // are walked again.
    std::string long_text;
    std::mt19937 rng(23);
    while (long_text.size() < 100000) long_text += sentence(rng, true);
    std::vector<int> want;
    REQUIRE(spm.Encode(long_text, &want).ok());
    a.clear();
    cached.encode(long_text, a);
    CHECK(std::vector<std::int32_t>(want.begin(), want.end()) == a);
    if constexpr (std::is_same_v<Encoder, detail::unigram_encoder>) {
        if (tables->cuts_at_spaces) CHECK(cached.cache_rewalks() > 0);
    }
    CHECK(differing == 0);
    MESSAGE(name << ": cuts at spaces " << tables->cuts_at_spaces << ", cache hits " << cached.cache_hits() << ", misses "
                 << cached.cache_misses());
    if (tables->cuts_at_spaces) CHECK(cached.cache_hits() > texts.size());
    CHECK(compared == 2 * texts.size());
    CHECK(tokens > texts.size());
    CHECK(ours.vocab_size() == spm.GetPieceSize());
    CHECK(ours.bos_id() == spm.bos_id());
    CHECK(ours.eos_id() == spm.eos_id());
}

// spm_train's options, for either model type.
const std::vector<std::pair<std::string, std::string>> training_variants = {
    {"nmt_nfkc", "--character_coverage=1.0"},
    {"coverage", "--character_coverage=0.98"},  // rare characters are unknown: runs of them merge into one <unk>
    {"identity", "--normalization_rule_name=identity --character_coverage=0.995"},
    {"nfkc", "--normalization_rule_name=nfkc"},
    {"nmt_nfkc_cf", "--normalization_rule_name=nmt_nfkc_cf"},
    {"byte_fallback", "--byte_fallback=true --character_coverage=0.98 --split_digits=true"},
    {"user_symbols", "--user_defined_symbols=<sep>,<cls>,ab,@@,▁x --control_symbols=<ctl>"},
    {"kept_spaces", "--remove_extra_whitespaces=false --add_dummy_prefix=false"},
    {"suffix", "--treat_whitespace_as_suffix=true"},
    {"no_whitespace_split", "--split_by_whitespace=false --split_by_unicode_script=false --split_by_number=false"},
    {"short_pieces", "--max_sentencepiece_length=3 --normalization_rule_name=identity --byte_fallback=true"},
    {"no_dummy_prefix", "--add_dummy_prefix=false --split_digits=true"},
};

// `model` with a vocabulary restricted to a third of its longer pieces (SentencePieceProcessor::SetVocabulary):
// the others turn unused, and are split again (BPE) or never matched (Unigram).
std::string restricted(const std::string& model) {
    sentencepiece::SentencePieceProcessor spm;
    REQUIRE(spm.Load(model).ok());
    std::vector<std::string> keep;
    for (int id = 0; id < spm.GetPieceSize(); ++id)
        if (id % 3 == 0) keep.push_back(spm.IdToPiece(id));
    REQUIRE(spm.SetVocabulary(std::vector<absl::string_view>(keep.begin(), keep.end())).ok());
    const std::string path = model + ".restricted";
    ft::write_text(path, spm.serialized_model_proto());
    return path;
}

}  // namespace

TEST_CASE("Tokenizer.Unigram.IdsEqualSentencepiecesForEveryTrainingOption") {
    trained t;
    const std::vector<std::string> texts = probe_texts();
    for (const auto& [name, options] : training_variants)
        compare_with_library<detail::unigram_encoder>(name, t.model(name, "--model_type=unigram " + options), texts);
    compare_with_library<detail::unigram_encoder>("restricted vocabulary", restricted(t.model("r", "--model_type=unigram")), texts);
}

TEST_CASE("Tokenizer.Bpe.IdsEqualSentencepiecesForEveryTrainingOption") {
    trained t;
    const std::vector<std::string> texts = probe_texts();
    for (const auto& [name, options] : training_variants)
        compare_with_library<detail::bpe_encoder>(name, t.model(name, "--model_type=bpe " + options), texts);
    // Unused pieces: split again into the two pieces the library last saw making them.
    const std::string unused = restricted(t.model("r", "--model_type=bpe"));
    const auto tables = std::make_shared<const detail::sentencepiece_pieces>(detail::read_sentencepiece_model(ft::read_text(unused)));
    CHECK(tables->has_unused);
    compare_with_library<detail::bpe_encoder>("restricted vocabulary", unused, texts);
}

TEST_CASE("Tokenizer.Unigram.ThroughMakeTokenizerAndAPipelineTheIdsAreTheLibrarys") {
    trained t;
    const std::string model = t.model("m", "--model_type=unigram --character_coverage=0.99");
    // Long documents go in pieces split before a space, as the library's tokenizer does.
    std::mt19937 rng(5);
    std::string long_doc;
    while (long_doc.size() < 300000) long_doc += sentence(rng, true);
    for (bool bos : {false, true}) {
        auto lib = make_tokenizer({.model = model, .kind = "sentencepiece", .add_bos = bos, .piece_bytes = 4096});
        auto own = make_tokenizer({.model = model, .kind = "feedline", .add_bos = bos, .piece_bytes = 4096});
        CHECK(own->kind() == "feedline");
        CHECK(own->identity() != lib->identity());  // its own token-count cache entries
        std::vector<std::int32_t> a, b;
        REQUIRE(lib->encode(long_doc, a).empty());
        REQUIRE(own->encode(long_doc, b).empty());
        CHECK(a.size() > 10000);
        CHECK(a == b);
        std::vector<std::vector<std::int32_t>> many_a, many_b;
        const std::vector<std::string> docs = {"one", "two words", "", "東京 🙂"};
        REQUIRE(lib->encode_batch(docs, many_a).empty());
        REQUIRE(own->encode_batch(docs, many_b).empty());
        CHECK(many_a == many_b);
    }
    const auto made = make_tokenizer({.model = model, .kind = "feedline"});
    REQUIRE(dynamic_cast<feedline_tokenizer*>(made.get()) != nullptr);

    // A text corpus read by a pipeline: the same batches and state with either encoder.
    std::string lines;
    for (int i = 0; i < 400; ++i) lines += sentence(rng, true) + "\n";
    ft::write_text(t.dir / "corpus.txt", lines);
    auto run = [&](const std::string& kind) {
        pipeline_config c{.batch_size = 4,
                          .seq_len = 32,
                          .seed = 3,
                          .workers = 2,
                          .device = device_kind::cpu,
                          .rank = 0,
                          .world_size = 1,
                          .max_steps = 20};
        c.text.tokenizer = model;
        c.text.tokenizer_kind = kind;
        c.text.cache_dir = "none";
        c.text.documents.split = text_split::lines;
        pipeline p(t.dir / "corpus.txt", c);
        std::vector<std::int32_t> all;
        for (auto& batch : p)
            for (std::int32_t id : batch.host_inputs()) all.push_back(id);
        return std::pair{all, to_json(p.state())};
    };
    const auto lib = run("sentencepiece");
    const auto own_run = run("feedline");
    CHECK(lib.first.size() == 20 * 4 * 32);
    CHECK(own_run.first == lib.first);
    CHECK(own_run.second == lib.second);
}

TEST_CASE("Tokenizer.Feedline.ModelsItDoesNotReproduceGoToTheLibraryOrAreRefusedSayingWhy") {
    trained t;
    // Kind auto takes feedline's encoder for Unigram and BPE models.
    for (const std::string type : {"unigram", "bpe"}) {
        const auto made = make_tokenizer({.model = t.model(type, "--model_type=" + type)});
        CHECK(made->kind() == "feedline");
        CHECK(made->describe() == std::string("feedline's ") + (type == "bpe" ? "BPE" : "Unigram") + " encoder");
        CHECK(made->chosen_because().empty());
    }
    // A word model: auto hands it to libsentencepiece and says why; kind feedline refuses it, saying why.
    const std::string word = t.model("word", "--model_type=word");
    const auto lib = make_tokenizer({.model = word});
    CHECK(lib->kind() == "sentencepiece");
    CHECK(lib->chosen_because().find("a word model") != std::string::npos);
    try {
        feedline_tokenizer refused({.model = word});
        FAIL("a word model was taken");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("word model") != std::string::npos);
        CHECK(std::string(e.what()).find(word) != std::string::npos);
    }
    // Not a model, truncated, missing, a directory: config errors naming the file, whichever kind.
    ft::write_text(t.dir / "not-a-model", "\x0a\x05hello world, not protobuf");
    const std::string good = ft::read_text(t.model("u", "--model_type=unigram"));
    ft::write_text(t.dir / "cut.model", good.substr(0, good.size() / 2));
    for (const std::string& path : {t.dir / "not-a-model", t.dir / "cut.model", t.dir / "missing.model", t.dir.path().string()})
        for (const std::string kind : {"feedline", "auto"}) {
            CAPTURE(path);
            CAPTURE(kind);
            try {
                make_tokenizer({.model = path, .kind = kind});
                FAIL("taken");
            } catch (const config_error& e) {
                CHECK(std::string(e.what()).find(path) != std::string::npos);
            }
        }
}
