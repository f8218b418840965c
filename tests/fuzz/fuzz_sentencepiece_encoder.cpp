// Fuzz target: feedline's Unigram and BPE encoders against libsentencepiece on arbitrary bytes. Models
// are trained once, at the first input, with the library's trainer (in a temporary directory), each
// type with: nmt_nfkc with partial coverage (unknown runs), identity with byte fallback and split
// digits, and user-defined symbols without whitespace splits (no cutting at spaces). Byte 0 picks the
// model; the rest is the text. Any difference in ids aborts, printing the input's bytes.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <feedline/transform/feedline_tokenizer.hpp>

namespace {

struct model_pair {
    sentencepiece::SentencePieceProcessor library;
    std::unique_ptr<feedline::feedline_tokenizer> ours;
};

std::vector<std::unique_ptr<model_pair>> train_models() {
    char templ[] = "/tmp/feedline-fuzz-spm-XXXXXX";
    if (::mkdtemp(templ) == nullptr) std::abort();
    const std::filesystem::path dir = templ;
    const char* words[] = {
        "the", "river", "naïve", "café",    "東京", "都市",  "Ελληνικά", "текст",     "مرحبا",  "🙂", "Ｆｕｌｌ",
        "ﬁle", "①",     "x=1;",  "{return", "0;}",  "12345", "3.14",     "e\xcc\x81", "한국어", "ไทย",  "supercalifragilistic"};
    std::mt19937 rng(9);
    {
        std::ofstream text(dir / "train.txt");
        for (int line = 0; line < 1500; ++line) {
            for (int w = 0; w < 8; ++w) text << words[rng() % std::size(words)] << (rng() % 5 ? " " : "  ");
            text << "\n";
        }
    }
    std::vector<std::unique_ptr<model_pair>> models;
    for (const std::string type : {"unigram", "bpe"})
        for (const std::string options :
             {"--character_coverage=0.98", "--normalization_rule_name=identity --byte_fallback=true --split_digits=true",
              "--user_defined_symbols=<sep>,ab,▁x --split_by_whitespace=false --remove_extra_whitespaces=false"}) {
            const std::string prefix = (dir / ("m" + std::to_string(models.size()))).string();
            const auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + (dir / "train.txt").string() +
                                                                       " --model_prefix=" + prefix + " --model_type=" + type +
                                                                       " --vocab_size=800 --hard_vocab_limit=false"
                                                                       " --minloglevel=2 --num_threads=1 " +
                                                                       options);
            if (!st.ok()) {
                std::fprintf(stderr, "training failed: %s\n", st.ToString().c_str());
                std::abort();
            }
            auto m = std::make_unique<model_pair>();
            if (!m->library.Load(prefix + ".model").ok()) std::abort();
            m->ours =
                std::make_unique<feedline::feedline_tokenizer>(feedline::tokenizer_options{.model = prefix + ".model", .add_eos = false});
            models.push_back(std::move(m));
        }
    std::filesystem::remove_all(dir);
    return models;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const auto models = train_models();
    if (size == 0) return 0;
    model_pair& m = *models[data[0] % models.size()];
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<int> want;
    std::vector<std::int32_t> got;
    if (!m.library.Encode(text, &want).ok()) return 0;  // the library refused: nothing to compare
    if (!m.ours->encode(text, got).empty() || !std::equal(want.begin(), want.end(), got.begin(), got.end())) {
        std::fprintf(stderr, "ids differ (model %d) for:", data[0] % static_cast<int>(models.size()));
        for (char c : text) std::fprintf(stderr, " %02x", static_cast<unsigned char>(c));
        std::fprintf(stderr, "\n");
        std::abort();
    }
    return 0;
}
