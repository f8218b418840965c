// feedline/transform/tokenizer_json.hpp: reads a `tokenizers` tokenizer.json describing a byte-level BPE
// (GPT-2, Llama-3, Qwen2 without its NFC step, ...) into the tables feedline's encoder uses
// (transform/byte_level_bpe.hpp): the vocabulary by raw bytes, the merges by pair, the pre-tokenizer's
// patterns, the added tokens. Whatever it does not reproduce exactly (a normalizer, another model type,
// dropout, a pre-tokenizer other than Split and ByteLevel, added tokens that strip or match whole
// words) is refused with a config_error saying which and what to do, never encoded differently.
#pragma once

#if FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/error.hpp>
#include <feedline/transform/tokenizer_regex.hpp>
#include <feedline/transform/unicode_nfc.hpp>

namespace feedline::detail {

// GPT-2's byte-level alphabet: every byte as one printable character. Bytes that print (33-126,
// 161-172, 174-255) stand for themselves; the others become 256, 257, ... in order.
inline std::array<char32_t, 256> byte_level_alphabet() {
    std::array<char32_t, 256> map{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) map[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174) ? char32_t(b) : next++;
    return map;
}

// The raw bytes a vocabulary entry written in the byte-level alphabet stands for; false if it holds a
// character outside the alphabet (such an entry is reachable only as an added token).
inline bool byte_level_bytes(std::string_view text, std::string& bytes) {
    static const auto inverse = [] {
        std::array<int, 324> inv;
        inv.fill(-1);
        const auto map = byte_level_alphabet();
        for (int b = 0; b < 256; ++b) inv[map[b]] = b;
        return inv;
    }();
    bytes.clear();
    for (std::size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        char32_t cp;
        if (c < 0x80)
            cp = c, i += 1;
        else if ((c & 0xE0) == 0xC0 && i + 1 < text.size())
            cp = (char32_t(c & 0x1F) << 6) | (text[i + 1] & 0x3F), i += 2;
        else
            return false;  // three bytes or more: above U+07FF, outside the alphabet
        if (cp >= inverse.size() || inverse[cp] < 0) return false;
        bytes += static_cast<char>(inverse[cp]);
    }
    return true;
}

// A merge's rank (its place in the list: lower merges first) and the id of the token it makes.
struct bpe_merge {
    std::int32_t rank = -1, id = -1;
};

// The merges by their pair of ids: open addressing over one array, a quarter empty at least.
class merge_table {
public:
    void reserve(std::size_t n) {
        std::size_t size = 16;
        while (size * 3 < n * 4) size *= 2;
        slots_.assign(size, {});
        shift_ = 64 - std::countr_zero(size);
    }
    // Sets the pair's merge; a pair given again takes its later place, as `tokenizers` does.
    void set(std::int32_t left, std::int32_t right, bpe_merge m) {
        const std::uint64_t k = key(left, right);
        std::size_t i = index(k);
        while (slots_[i].merge.rank >= 0 && slots_[i].key != k) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = {k, m};
    }
    const bpe_merge* find(std::int32_t left, std::int32_t right) const noexcept {
        if (slots_.empty()) return nullptr;
        const std::uint64_t k = key(left, right);
        for (std::size_t i = index(k); slots_[i].merge.rank >= 0; i = (i + 1) & (slots_.size() - 1))
            if (slots_[i].key == k) return &slots_[i].merge;
        return nullptr;
    }
    std::size_t memory_bytes() const noexcept { return slots_.capacity() * sizeof(slot); }

private:
    struct slot {
        std::uint64_t key = 0;
        bpe_merge merge;
    };
    static std::uint64_t key(std::int32_t l, std::int32_t r) noexcept { return (std::uint64_t(std::uint32_t(l)) << 32) | std::uint32_t(r); }
    std::size_t index(std::uint64_t k) const noexcept { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }
    std::vector<slot> slots_;
    int shift_ = 60;
};

struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// A tokenizer.json byte-level BPE, as feedline encodes it.
struct byte_level_bpe_model {
    std::string checksum;  // of the file's bytes (model_checksum)
    // Each byte's token (-1: none: the byte is dropped, as `tokenizers` does without an unknown token).
    std::array<std::int32_t, 256> byte_ids{};
    std::int32_t unk_id = -1;  // for bytes without a token, when the model names one
    bool fuse_unk = false;
    // The vocabulary by the bytes its entries stand for: for ignore_merges, which takes a whole word
    // found here as one token.
    std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>> by_bytes;
    bool ignore_merges = false;
    merge_table merges;
    std::size_t merge_count = 0;

    // The pre-tokenizer, step by step: a step adds a leading space to a piece that lacks one
    // (ByteLevel's add_prefix_space), or splits each piece by a pattern.
    struct step {
        std::shared_ptr<const tokenizer_regex> regex;  // null: the leading-space step
    };
    std::vector<step> steps;
    std::string pre_tokenizer;  // what they are, in words, for tools

    // The normalizer: NFC (transform/unicode_nfc.hpp) or none.
    bool nfc = false;

    // Added tokens, found in the text before anything else: those matched on the raw text first, then
    // those matched on the normalized text (their contents normalized too, as `tokenizers` does).
    struct added_token {
        std::string content;
        std::int32_t id;
        bool special;
    };
    std::vector<added_token> added_raw, added_normalized;

    std::int32_t vocab_size = 0;
    std::int32_t bos_id = -1, eos_id = -1;
    std::string bos_token, eos_token;

    std::size_t memory_bytes() const noexcept {
        std::size_t bytes = merges.memory_bytes() + sizeof(*this);
        for (const auto& [k, v] : by_bytes) bytes += k.capacity() + sizeof(k) + sizeof(v) + 16;
        return bytes;
    }
};

// GPT-2's pre-tokenizer pattern: what ByteLevel splits by when use_regex is set.
inline constexpr std::string_view gpt2_pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace tokenizer_json_detail {

using json = nlohmann::json;

struct reader {
    const std::string& path;
    const std::string& field;

    [[noreturn]] void refuse(const std::string& why) const { throw config_error(field, path + ": " + why); }
    [[noreturn]] void unsupported(const std::string& what) const {
        refuse(what +
               "; feedline encodes byte-level BPE tokenizer.json files (model BPE, normalizer NFC or none, pre-tokenizer ByteLevel "
               "optionally after Split patterns) with the `tokenizers` package's ids. Use a model of that form, or pack the "
               "corpus with the `tokenizers` package into token shards");
    }
    const json& member(const json& object, const char* name, const char* where) const {
        if (!object.is_object() || !object.contains(name)) refuse(std::string(where) + " has no \"" + name + "\"");
        return object.at(name);
    }
    bool flag(const json& object, const char* name, bool otherwise) const {
        if (!object.contains(name) || object.at(name).is_null()) return otherwise;
        if (!object.at(name).is_boolean()) refuse(std::string("\"") + name + "\" is not true or false");
        return object.at(name).get<bool>();
    }
    std::int32_t id(const json& v, const std::string& what) const {
        if (!v.is_number_integer() && !v.is_number_unsigned()) refuse(what + " is not a whole number");
        const auto n = v.get<std::int64_t>();
        if (n < 0 || n >= (std::int64_t(1) << 31) - 1) refuse(what + " (" + std::to_string(n) + ") is not an id");
        return static_cast<std::int32_t>(n);
    }
};

// A literal for a pattern: every ASCII character but letters and digits escaped.
inline std::string escaped(std::string_view literal) {
    std::string out;
    for (const char c : literal) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x80 && !std::isalnum(u)) out += '\\';
        out += c;
    }
    return out;
}

}  // namespace tokenizer_json_detail

// Reads `bytes`, the contents of the tokenizer.json at `path`. Throws config_error naming `field`.
inline byte_level_bpe_model read_tokenizer_json(std::string_view bytes, const std::string& path, const std::string& field) {
    using tokenizer_json_detail::json;
    const tokenizer_json_detail::reader r{path, field};
    json j;
    try {
        j = json::parse(bytes);
    } catch (const json::parse_error& e) {
        r.refuse("is not a tokenizer.json: not valid JSON (at byte " + std::to_string(e.byte) + ")");
    }
    if (!j.is_object() || !j.contains("model")) r.refuse("is not a tokenizer.json: no \"model\" object");
    byte_level_bpe_model m;

    // The normalizer: none, or NFC (alone or in a Sequence).
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
        const auto unsupported = [&](const json& n) {
            r.unsupported("its normalizer (" + (n.is_object() ? n.value("type", std::string("?")) : std::string("?")) +
                          ") is not supported");
        };
        const json& n = j["normalizer"];
        const bool sequence = n.is_object() && n.value("type", "") == "Sequence";
        if (sequence && !(n.contains("normalizers") && n["normalizers"].is_array())) r.refuse("its Sequence normalizer has no list");
        for (const json& each : sequence ? n["normalizers"] : json::array({n})) {
            if (!each.is_object() || each.value("type", "") != "NFC") unsupported(each);
            m.nfc = true;
        }
    }

    // The model.
    const json& model = j["model"];
    if (!model.is_object()) r.refuse("\"model\" is not an object");
    if (model.value("type", std::string("BPE")) != "BPE")
        r.unsupported("model type " + model.value("type", std::string()) + " is not supported");
    if (model.contains("dropout") && !model["dropout"].is_null()) r.unsupported("BPE dropout (random merges) is not supported");
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (model.contains(affix) && model[affix].is_string() && !model[affix].get<std::string>().empty())
            r.unsupported(std::string("a ") + affix + " is not supported");
    m.ignore_merges = r.flag(model, "ignore_merges", false);
    m.fuse_unk = r.flag(model, "fuse_unk", false);
    const bool byte_fallback = r.flag(model, "byte_fallback", false);

    const json& vocab = r.member(model, "vocab", "\"model\"");
    if (!vocab.is_object()) r.refuse("\"model.vocab\" is not an object");
    std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>> by_text;
    by_text.reserve(vocab.size());
    std::string raw;
    for (const auto& [text, value] : vocab.items()) {
        const std::int32_t id = r.id(value, "the id of vocabulary entry \"" + text + "\"");
        by_text.emplace(text, id);
        m.vocab_size = std::max(m.vocab_size, id + 1);
        if (byte_level_bytes(text, raw)) m.by_bytes.emplace(raw, id);
    }
    const auto alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) {
        std::string ch;
        const char32_t c = alphabet[b];
        if (c < 0x80)
            ch = std::string(1, char(c));
        else
            ch = {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
        auto it = by_text.find(ch);
        if (it == by_text.end() && byte_fallback) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            it = by_text.find(std::string_view(name));
        }
        m.byte_ids[b] = it == by_text.end() ? -1 : it->second;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
        const auto it = by_text.find(model["unk_token"].get<std::string>());
        if (it == by_text.end()) r.refuse("its unknown token \"" + model["unk_token"].get<std::string>() + "\" is not in the vocabulary");
        m.unk_id = it->second;
    }

    // The merges: "a b" strings or [a, b] pairs, in the vocabulary's alphabet.
    const json& merges = r.member(model, "merges", "\"model\"");
    if (!merges.is_array()) r.refuse("\"model.merges\" is not an array");
    m.merges.reserve(merges.size());
    m.merge_count = merges.size();
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
        const json& e = merges[rank];
        std::string a, b;
        if (e.is_string()) {
            const std::string s = e.get<std::string>();
            const std::size_t space = s.find(' ');
            if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                r.refuse("merge " + std::to_string(rank) + " (\"" + s + "\") is not two tokens separated by a space");
            a = s.substr(0, space), b = s.substr(space + 1);
        } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
            a = e[0].get<std::string>(), b = e[1].get<std::string>();
        } else {
            r.refuse("merge " + std::to_string(rank) + " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        const auto left = by_text.find(a), right = by_text.find(b), made = by_text.find(a + b);
        if (left == by_text.end() || right == by_text.end() || made == by_text.end())
            r.refuse("merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b + "\") names a token not in the vocabulary");
        m.merges.set(left->second, right->second, {static_cast<std::int32_t>(rank), made->second});
    }

    // The pre-tokenizer: Split patterns (isolated), then ByteLevel.
    bool byte_level = false;
    const auto add = [&](const auto& self, const json& p) -> void {
        if (!p.is_object()) r.unsupported("its pre-tokenizer is missing");
        const std::string type = p.value("type", std::string());
        if (type == "Sequence") {
            for (const json& each : r.member(p, "pretokenizers", "a Sequence pre-tokenizer")) self(self, each);
        } else if (type == "Split") {
            if (byte_level) r.unsupported("a Split pre-tokenizer after ByteLevel is not supported");
            const json& pattern = r.member(p, "pattern", "a Split pre-tokenizer");
            std::string regex;
            if (pattern.contains("Regex") && pattern["Regex"].is_string())
                regex = pattern["Regex"].get<std::string>();
            else if (pattern.contains("String") && pattern["String"].is_string())
                regex = tokenizer_json_detail::escaped(pattern["String"].get<std::string>());
            else
                r.refuse("a Split pre-tokenizer's pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
            if (p.value("behavior", std::string()) != "Isolated")
                r.unsupported("Split behavior " + p.value("behavior", std::string("?")) + " is not supported (only Isolated)");
            if (r.flag(p, "invert", false)) r.unsupported("an inverted Split pattern is not supported");
            try {
                m.steps.push_back({std::make_shared<const tokenizer_regex>(regex)});
            } catch (const std::invalid_argument& e) {
                r.refuse(std::string("its Split ") + e.what());
            }
            m.pre_tokenizer += (m.pre_tokenizer.empty() ? "" : ", ") + std::string("Split ") + regex;
        } else if (type == "ByteLevel") {
            if (byte_level) r.unsupported("two ByteLevel pre-tokenizers are not supported");
            byte_level = true;
            if (r.flag(p, "add_prefix_space", true)) {
                m.steps.push_back({nullptr});
                m.pre_tokenizer += (m.pre_tokenizer.empty() ? "" : ", ") + std::string("a leading space");
            }
            if (r.flag(p, "use_regex", true)) {
                m.steps.push_back({std::make_shared<const tokenizer_regex>(gpt2_pattern)});
                m.pre_tokenizer += (m.pre_tokenizer.empty() ? "" : ", ") + std::string("GPT-2's pattern");
            }
            m.pre_tokenizer += (m.pre_tokenizer.empty() ? "" : ", ") + std::string("bytes");
        } else {
            r.unsupported("pre-tokenizer " + (type.empty() ? std::string("without a type") : type) + " is not supported");
        }
    };
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null()) r.unsupported("it has no pre-tokenizer (not a byte-level BPE)");
    add(add, j["pre_tokenizer"]);
    if (!byte_level) r.unsupported("its pre-tokenizer has no ByteLevel step (not a byte-level BPE)");

    // Added tokens.
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
        if (!j["added_tokens"].is_array()) r.refuse("\"added_tokens\" is not an array");
        for (const json& t : j["added_tokens"]) {
            const std::string content = r.member(t, "content", "an added token").is_string() ? t["content"].get<std::string>() : "";
            if (content.empty()) continue;  // never matches, as in `tokenizers`
            const std::int32_t id = r.id(r.member(t, "id", "an added token"), "the id of added token \"" + content + "\"");
            for (const char* option : {"single_word", "lstrip", "rstrip"})
                if (r.flag(t, option, false)) r.unsupported("added token \"" + content + "\" sets " + option + ", which is not supported");
            const bool special = r.flag(t, "special", false);
            (r.flag(t, "normalized", !special) ? m.added_normalized : m.added_raw).push_back({content, id, special});
            m.vocab_size = std::max(m.vocab_size, id + 1);
        }
    }
    if (m.nfc) {
        unicode_nfc normalizer;  // the contents are valid UTF-8: the JSON parser checked them
        std::string buffer;
        for (auto& t : m.added_normalized) t.content = std::string(normalizer.normalize(t.content, buffer));
    }

    // BOS and EOS: the post-processor's first special token, else by the usual names.
    const auto special_named = [&](std::initializer_list<std::string_view> names, std::int32_t& id, std::string& token) {
        for (const auto name : names)
            for (const auto* list : {&m.added_raw, &m.added_normalized})
                for (const auto& t : *list)
                    if (t.content == name) {
                        id = t.id, token = t.content;
                        return;
                    }
    };
    const json* post = j.contains("post_processor") ? &j["post_processor"] : nullptr;
    if (post && post->is_object() && post->value("type", "") == "TemplateProcessing" && post->contains("single") &&
        (*post)["single"].is_array() && !(*post)["single"].empty() && (*post)["single"][0].contains("SpecialToken")) {
        const std::string name = (*post)["single"][0]["SpecialToken"].value("id", std::string());
        special_named({name}, m.bos_id, m.bos_token);
    }
    if (m.bos_id < 0) special_named({"<|begin_of_text|>", "<s>", "<bos>"}, m.bos_id, m.bos_token);
    special_named({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}, m.eos_id, m.eos_token);
    return m;
}

}  // namespace feedline::detail

#endif  // FEEDLINE_HAS_PCRE2 && FEEDLINE_HAS_JSON
