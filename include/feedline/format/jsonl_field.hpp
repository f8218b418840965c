// feedline/format/jsonl_field.hpp: one string field out of one JSONL line. Reading JSONL does this
// once per document when a corpus is opened (text_reader) and again each time a tokenizing worker
// re-reads the document (text_corpus), so its speed is part of both the start-up time and the
// tokenization rate.
//
// nlohmann_json defines which lines are accepted and what text they hold. When simdjson was found at
// configure time it parses lines up to simdjson_max_line first: ~20x faster than nlohmann on short
// documents (bench_end_to_end's jsonl_simdjson_vs_nlohmann). Anything simdjson refuses (integers
// beyond 64 bits, a byte-order mark, ...) and any longer line is parsed again by nlohmann, so a build
// with simdjson accepts exactly the lines a build without it accepts, with the same text;
// fuzz_jsonl_field checks that. Lines nested deeper than max_depth are refused before either parser
// runs, so refusing a hostile line costs a pass over it, not a DOM of it. Duplicate keys: the last one counts, as in
// nlohmann and Python's json.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#if FEEDLINE_HAS_JSON
#include <nlohmann/json.hpp>
#endif
#if FEEDLINE_HAS_SIMDJSON
#include <simdjson.h>
#endif

namespace feedline {

enum class jsonl_field_status {
    ok,
    invalid_json,   // the line is not one JSON value
    missing_field,  // not an object, or an object without the field
    not_string,     // the field holds something other than a string
    too_deep,       // arrays and objects nested deeper than jsonl_field_parser::max_depth: refused unparsed
};

// One per thread: it keeps simdjson's buffers between lines. Which engine ran is not observable in
// the results, only in the time taken.
class jsonl_field_parser {
public:
    enum class engine {
        fastest,   // simdjson when built in, else nlohmann_json
        nlohmann,  // nlohmann_json only: the reference the fast path is checked against
    };
#if FEEDLINE_HAS_SIMDJSON
    static constexpr bool has_simdjson = true;
#else
    static constexpr bool has_simdjson = false;
#endif
    // Longer lines skip simdjson, whose buffers take ~14 bytes of address space per byte of line
    // (mostly never touched): this bounds what one worker's parser reserves.
    static constexpr std::size_t simdjson_max_line = std::size_t{1} << 20;
    // Deeper lines are refused by a scan before any parser sees them (simdjson stops at 1024 too): a
    // DOM of nested arrays costs ~100 bytes per level, so a 20 MB line of '[' took 1.5 GB to refuse.
    static constexpr std::size_t max_depth = 1024;

    explicit jsonl_field_parser(engine e = engine::fastest) : engine_(e) {}

    // Puts the string in `line`'s field `field` into `out` when the status is ok (leaves it
    // otherwise). `line` may have surrounding whitespace (a trailing "\r\n" too). Its contents are
    // not changed, but its capacity may grow: simdjson reads a few bytes past the end of its input.
    jsonl_field_status extract(std::string& line, std::string_view field, std::string& out) {
        if (deeper_than(line, max_depth)) return jsonl_field_status::too_deep;
#if FEEDLINE_HAS_SIMDJSON
        if (engine_ == engine::fastest && line.size() <= simdjson_max_line) {
            if (line.capacity() < line.size() + simdjson::SIMDJSON_PADDING) line.reserve(line.size() + simdjson::SIMDJSON_PADDING);
            if (auto status = extract_simdjson(line, field, out)) return *status;
        }
#endif
        return extract_nlohmann(line, field, out);
    }

    // Whether brackets and braces outside strings nest deeper than `limit`: one pass, no memory. A
    // malformed line may pass (the parsers refuse it); a well-formed one is judged exactly.
    static bool deeper_than(std::string_view line, std::size_t limit) noexcept {
        std::size_t depth = 0;
        bool in_string = false;
        for (std::size_t i = 0; i < line.size(); ++i) {
            const char c = line[i];
            if (in_string) {
                if (c == '\\')
                    ++i;
                else if (c == '"')
                    in_string = false;
            } else if (c == '"') {
                in_string = true;
            } else if (c == '[' || c == '{') {
                if (++depth > limit) return true;
            } else if ((c == ']' || c == '}') && depth > 0) {
                --depth;
            }
        }
        return false;
    }

private:
#if FEEDLINE_HAS_SIMDJSON
    // Nothing when simdjson refuses the line (nlohmann then decides).
    std::optional<jsonl_field_status> extract_simdjson(const std::string& line, std::string_view field, std::string& out) {
        simdjson::dom::element root;
        if (simdjson_.parse(line.data(), line.size(), /*realloc_if_needed=*/false).get(root) != simdjson::SUCCESS) return std::nullopt;
        simdjson::dom::object object;
        if (root.get(object) != simdjson::SUCCESS) return jsonl_field_status::missing_field;
        // Walk every key, not find_field: with duplicates the last one counts.
        std::optional<simdjson::dom::element> value;
        for (auto [key, v] : object)
            if (key == field) value = v;
        if (!value) return jsonl_field_status::missing_field;
        std::string_view text;
        if (value->get(text) != simdjson::SUCCESS) return jsonl_field_status::not_string;
        out.assign(text);
        return jsonl_field_status::ok;
    }
    simdjson::dom::parser simdjson_{simdjson_max_line};
#endif

    static jsonl_field_status extract_nlohmann(const std::string& line, std::string_view field, std::string& out) {
#if FEEDLINE_HAS_JSON
        const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) return jsonl_field_status::invalid_json;
        if (!j.is_object()) return jsonl_field_status::missing_field;
        const auto it = j.find(field);
        if (it == j.end()) return jsonl_field_status::missing_field;
        if (!it->is_string()) return jsonl_field_status::not_string;
        out = it->get_ref<const std::string&>();
        return jsonl_field_status::ok;
#else
        (void)line, (void)field, (void)out;
        return jsonl_field_status::invalid_json;
#endif
    }

    engine engine_;
};

}  // namespace feedline
