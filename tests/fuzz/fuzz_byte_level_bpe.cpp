// Fuzz target: feedline's byte-level BPE encoder (tokenizer.json models) on arbitrary bytes. Three models
// are built at the first input, their merges learned here from a small corpus (the most frequent
// adjacent pair, again and again): GPT-2's form (ByteLevel with its pattern), Llama-3's (a Split
// pattern, then ByteLevel without one; ignore_merges), and a leading space with added tokens. Byte 0
// picks the model; the rest is the text. Each input must encode without error, the tokens' bytes must
// spell the text back (invalid UTF-8 read as U+FFFD), and the ids must equal BPE by its definition
// (merge the leftmost lowest-rank pair until none applies) over the same pre-tokens. Ids against the
// `tokenizers` package itself: tests/python/test_tokenizer_json.py. Then NFC of the text must be valid
// UTF-8 and normalizing it again must leave it as it is.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/transform/byte_level_bpe_tokenizer.hpp>

namespace {

using nlohmann::json;
constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string in_alphabet(std::string_view bytes) {
    static const auto map = feedline::detail::byte_level_alphabet();
    std::string out;
    for (const char b : bytes) {
        const char32_t c = map[static_cast<unsigned char>(b)];
        if (c < 0x80)
            out += char(c);
        else
            out += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    }
    return out;
}

struct model {
    std::unique_ptr<feedline::byte_level_bpe_tokenizer> ours;
    std::map<std::pair<std::string, std::string>, std::size_t> rank;  // raw bytes
    std::map<std::string, std::int32_t> ids;                          // raw bytes -> id
    std::map<std::int32_t, std::string> bytes;                        // id -> raw bytes (added tokens too)
    std::vector<std::string> added;
    std::vector<std::shared_ptr<const feedline::detail::tokenizer_regex>> steps;  // null: the leading space
};

// Merges learned from `words` (raw bytes): the most frequent adjacent pair, `count` times.
std::vector<std::pair<std::string, std::string>> learn(const std::vector<std::string>& words, std::size_t count) {
    std::vector<std::vector<std::string>> split;
    for (const auto& w : words) {
        split.emplace_back();
        for (const char c : w) split.back().push_back(std::string(1, c));
    }
    std::vector<std::pair<std::string, std::string>> merges;
    while (merges.size() < count) {
        std::map<std::pair<std::string, std::string>, int> counts;
        for (const auto& w : split)
            for (std::size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
        if (counts.empty()) break;
        auto best = counts.begin();
        for (auto it = counts.begin(); it != counts.end(); ++it)
            if (it->second > best->second) best = it;
        merges.push_back(best->first);
        for (auto& w : split)
            for (std::size_t i = 0; i + 1 < w.size(); ++i)
                if (w[i] == best->first.first && w[i + 1] == best->first.second) {
                    w[i] += w[i + 1];
                    w.erase(w.begin() + static_cast<std::ptrdiff_t>(i) + 1);
                }
    }
    return merges;
}

std::vector<std::unique_ptr<model>> build_models() {
    char templ[] = "/tmp/feedline-fuzz-bpe-XXXXXX";
    if (::mkdtemp(templ) == nullptr) std::abort();
    const std::filesystem::path dir = templ;
    const std::vector<std::string> words = {"the",       " the",   " river", " naïve",     " café", " 東京",  "都市",
                                            " Ελληνικά", " текст", " مرحبا", " 🙂",      "'s",    " don",   "'t",
                                            " x",        "=",      "1",      ";",          " {",    "return", " 0",
                                            ";}",        " 12345", " 3.14",  " e\xcc\x81", "\n",    "  ",     " supercalifragilistic"};
    const auto merges = learn(words, 120);
    const json byte_level_regex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    const json llama3 = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", std::string(llama3_pattern)}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
    const json spaced = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    std::vector<std::unique_ptr<model>> models;
    for (int kind = 0; kind < 3; ++kind) {
        auto m = std::make_unique<model>();
        json vocab = json::object(), merge_list = json::array(), added = json::array();
        for (int b = 0; b < 256; ++b) {
            const std::string raw(1, char(b));
            m->ids[raw] = b, m->bytes[b] = raw;
            vocab[in_alphabet(raw)] = b;
        }
        for (std::size_t r = 0; r < merges.size(); ++r) {
            const auto& [a, b] = merges[r];
            if (!m->ids.count(a + b)) {
                const auto id = static_cast<std::int32_t>(m->ids.size());
                m->ids[a + b] = id, m->bytes[id] = a + b;
                vocab[in_alphabet(a + b)] = id;
            }
            m->rank.emplace(std::pair{a, b}, r);
            merge_list.push_back(json::array({in_alphabet(a), in_alphabet(b)}));
        }
        if (kind == 2)
            for (const std::string content : {"<|endoftext|>", "<|end|>", "<s>"}) {
                const auto id = static_cast<std::int32_t>(m->ids.size() + m->added.size());
                added.push_back({{"id", id}, {"content", content}, {"normalized", content == "<s>"}, {"special", true}});
                m->added.push_back(content);
                m->bytes[id] = content;
            }
        const json file = {{"added_tokens", added},
                           {"normalizer", nullptr},
                           {"pre_tokenizer", kind == 0   ? byte_level_regex
                                             : kind == 1 ? llama3
                                                         : spaced},
                           {"model", {{"type", "BPE"}, {"ignore_merges", kind == 1}, {"vocab", vocab}, {"merges", merge_list}}}};
        const std::string path = (dir / ("m" + std::to_string(kind) + ".json")).string();
        std::ofstream(path) << file.dump();
        m->ours = std::make_unique<feedline::byte_level_bpe_tokenizer>(feedline::tokenizer_options{.model = path, .add_eos = false});
        if (kind == 2) m->steps.push_back(nullptr);
        m->steps.push_back(
            std::make_shared<const feedline::detail::tokenizer_regex>(kind == 1 ? llama3_pattern : feedline::detail::gpt2_pattern));
        models.push_back(std::move(m));
    }
    std::filesystem::remove_all(dir);
    return models;
}

// BPE by its definition over one word.
void reference_word(const model& m, std::string_view word, bool whole, std::vector<std::int32_t>& out) {
    if (whole)
        if (auto it = m.ids.find(std::string(word)); it != m.ids.end()) return out.push_back(it->second);
    std::vector<std::string> pieces;
    for (const char c : word) pieces.push_back(std::string(1, c));
    for (;;) {
        std::size_t best = pieces.size(), best_rank = 0;
        for (std::size_t i = 0; i + 1 < pieces.size(); ++i)
            if (auto it = m.rank.find({pieces[i], pieces[i + 1]}); it != m.rank.end() && (best == pieces.size() || it->second < best_rank))
                best = i, best_rank = it->second;
        if (best == pieces.size()) break;
        pieces[best] += pieces[best + 1];
        pieces.erase(pieces.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (const auto& p : pieces) out.push_back(m.ids.at(p));
}

// `code`: the pattern's code each search takes (0: the one for any text; 1: the ASCII one). The encoder
// switches between them; all three must split alike.
void reference_steps(const model& m, std::size_t depth, std::string_view piece, bool whole, feedline::detail::regex_matcher& matcher,
                     int code, std::vector<std::int32_t>& out) {
    if (depth == m.steps.size()) return reference_word(m, piece, whole, out);
    if (!m.steps[depth]) {
        const std::string spaced = piece.starts_with(' ') ? std::string(piece) : " " + std::string(piece);
        return reference_steps(m, depth + 1, spaced, whole, matcher, code, out);
    }
    // Pieces are collected first: the matcher is reused by the steps below.
    std::vector<std::string> pieces;
    if (!matcher
             .split(
                 *m.steps[depth], piece, [&](std::string_view p) { pieces.emplace_back(p); }, code)
             .empty())
        std::abort();
    for (const auto& p : pieces) reference_steps(m, depth + 1, p, whole, matcher, code, out);
}

std::vector<std::int32_t> reference(const model& m, std::string_view text, bool whole, int code) {
    feedline::detail::regex_matcher matcher;
    std::vector<std::int32_t> out;
    std::size_t done = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {  // added tokens: leftmost, then longest (one set here suffices: no overlaps)
        std::size_t best = m.added.size();
        for (std::size_t a = 0; a < m.added.size(); ++a)
            if (text.substr(i).starts_with(m.added[a]) && (best == m.added.size() || m.added[a].size() > m.added[best].size())) best = a;
        if (best == m.added.size()) continue;
        if (i > done) reference_steps(m, 0, text.substr(done, i - done), whole, matcher, code, out);
        out.push_back(static_cast<std::int32_t>(m.ids.size() + best));
        done = i + m.added[best].size();
        i = done - 1;
    }
    if (done < text.size()) reference_steps(m, 0, text.substr(done), whole, matcher, code, out);
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static const auto models = build_models();
    if (size == 0) return 0;
    const int which = data[0] % static_cast<int>(models.size());
    const model& m = *models[which];
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    std::string buffer;
    const std::string valid(feedline::detail::valid_utf8(text, buffer));
    std::vector<std::int32_t> got;
    const std::string problem = m.ours->encode(text, got);
    std::string spelled;
    for (const std::int32_t id : got) spelled += m.bytes.at(id);
    const std::string expected_text = which == 2 ? std::string() : valid;  // a leading space is added per piece there
    const bool spelled_back = which == 2 || spelled == expected_text;
    if (!problem.empty() || !spelled_back || got != reference(m, valid, which == 1, 0) || got != reference(m, valid, which == 1, 1)) {
        std::fprintf(stderr, "model %d: %s; ids differ from BPE's definition or do not spell the text for:", which, problem.c_str());
        for (char c : text) std::fprintf(stderr, " %02x", static_cast<unsigned char>(c));
        std::fprintf(stderr, "\n");
        std::abort();
    }
    // NFC (tokenizer.json's normalizer): valid UTF-8 out, and normalizing again changes nothing.
    static feedline::detail::unicode_nfc nfc;
    std::string once_buffer, twice_buffer;
    const std::string once(nfc.normalize(valid, once_buffer));
    std::string again_valid;
    if (feedline::detail::valid_utf8(once, again_valid).data() != once.data() || nfc.normalize(once, twice_buffer).data() != once.data()) {
        std::fprintf(stderr, "NFC is not valid UTF-8 or not stable for:");
        for (char c : text) std::fprintf(stderr, " %02x", static_cast<unsigned char>(c));
        std::fprintf(stderr, "\n");
        std::abort();
    }
    return 0;
}
