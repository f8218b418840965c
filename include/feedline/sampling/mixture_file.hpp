// feedline/sampling/mixture_file.hpp: a mixture file, the JSON form of a mixture schedule
// (sampling/mixture_schedule.hpp) and its domains' data. Every mistake is a config_error naming the
// field and the file's line, since these files are written by hand:
//
//   {
//     "domains": [
//       {"name": "web",  "data": "/data/web/shard_*.bin"},
//       {"name": "code", "data": "/data/code_text_document"},
//       "math"
//     ],
//     "stages": [
//       {"at_step": 0, "weights": {"web": 6, "code": 3, "math": 1}},
//       {"at_tokens": 900000000000, "ramp_steps": 2000, "weights": {"web": 3, "code": 3, "math": 4}}
//     ]
//   }
//
// A domain is a name, or an object with its name and data (a path, glob, directory or Megatron prefix,
// or a list of them, opened together as one dataset: "data": ["a/*.bin", "b.bin"]; one kind of data a
// domain). A stage starts at a step ("at_step") or
// at a token count ("at_tokens": the first step by which that many tokens were delivered, for the
// run's tokens per step); its weights are by domain
// name, any positive scale, and a domain left out has weight 0 there. "ramp_steps" moves the weights
// linearly from the previous stage's to this one's over that many steps.
#pragma once

#if FEEDLINE_HAS_JSON
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/detail/scratch_arena.hpp>
#include <feedline/error.hpp>
#include <feedline/sampling/mixture_schedule.hpp>

namespace feedline {

namespace detail {

// Lines of a mixture file's values, for its errors. One pass at construction records the line of
// each domain ("/domains/i") and stage ("/stages/k"), the values every error names; the line of any
// deeper value ("/stages/1/weights/web") is found when asked, by a walk that follows only that path
// (an error's, once). Memory: a line per domain and stage, whatever the file holds beside them (a
// hostile file of long keys or huge arrays elsewhere costs a walk, not an index). Containers more
// than `max_depth` deep are stepped over without recursion. Keys are compared as written, so a key
// spelled with escapes is not found and falls back to an enclosing value's line. For a text that
// nlohmann already parsed.
class json_lines {
public:
    explicit json_lines(std::string_view text) : t_(text) {
        walk([](const std::string& at, int depth) { return depth == 0 || (depth == 1 && (at == "/domains" || at == "/stages")); },
             [&](const std::string& at, int depth, int line) {
                 if (depth != 2) return;
                 (at.starts_with("/domains/") ? domains_ : stages_).push_back(line);
             });
    }
    // The line of the value at `pointer`, or of the nearest enclosing value found (1: none).
    int line(const std::string& pointer) const {
        for (const auto& [prefix, lines] : {std::pair{std::string("/domains/"), &domains_}, std::pair{std::string("/stages/"), &stages_}})
            if (pointer.starts_with(prefix) && pointer.find('/', prefix.size()) == std::string::npos) {
                const std::size_t i = std::strtoull(pointer.c_str() + prefix.size(), nullptr, 10);
                if (i < lines->size()) return (*lines)[i];
            }
        int found = 1;
        std::size_t deepest = 0;
        walk([&](const std::string& at, int) { return pointer.starts_with(at + "/") || at.empty(); },
             [&](const std::string& at, int, int line) {
                 const bool on_path = at.empty() || pointer == at || pointer.starts_with(at + "/");
                 if (on_path && at.size() >= deepest) deepest = at.size(), found = line;
             });
        return found;
    }
    // The line of byte `offset` (nlohmann's parse errors give bytes).
    static int line_of_offset(std::string_view text, std::size_t offset) {
        int line = 1;
        for (std::size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
        return line;
    }
    static std::string pointer_token(const std::string& key) {  // RFC 6901: ~ as ~0, / as ~1
        std::string r;
        for (char c : key) r += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
        return r;
    }

private:
    static constexpr int max_depth = 8;
    // Calls `seen(pointer, depth, line)` for each value reached, and enters a container only where
    // `enter(pointer, depth)` says so.
    template <class Enter, class Seen>
    void walk(Enter&& enter, Seen&& seen) const {
        std::size_t i = 0;
        int line = 1;
        value(i, line, "", 0, enter, seen);
    }
    void space(std::size_t& i, int& line) const {
        while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t' || t_[i] == '\n' || t_[i] == '\r')) line += t_[i++] == '\n';
    }
    std::string string(std::size_t& i) const {  // at '"'; as written
        std::string out;
        for (++i; i < t_.size() && t_[i] != '"'; ++i) {
            if (t_[i] == '\\' && i + 1 < t_.size()) out += t_[i++];
            out += t_[i];
        }
        ++i;
        return out;
    }
    void skip_string(std::size_t& i) const {
        for (++i; i < t_.size() && t_[i] != '"'; ++i)
            if (t_[i] == '\\') ++i;
        ++i;
    }
    void skip_container(std::size_t& i, int& line) const {  // at '{' or '[': past its match, no recursion
        int depth = 0;
        do {
            const char c = t_[i];
            if (c == '"') {
                skip_string(i);
                continue;
            }
            depth += c == '{' || c == '[';
            depth -= c == '}' || c == ']';
            line += c == '\n';
            ++i;
        } while (depth > 0 && i < t_.size());
    }
    template <class Enter, class Seen>
    void value(std::size_t& i, int& line, const std::string& at, int depth, Enter& enter, Seen& seen) const {
        space(i, line);
        if (i >= t_.size()) return;
        seen(at, depth, line);
        const char c = t_[i];
        if (c == '{' || c == '[') {
            if (depth >= max_depth || !enter(at, depth)) return skip_container(i, line);
            const char close = c == '{' ? '}' : ']';
            ++i;
            for (std::size_t k = 0;; ++k) {
                space(i, line);
                if (i >= t_.size() || t_[i] == close) break;
                std::string key;
                if (c == '{') {
                    key = string(i);
                    space(i, line);
                    ++i;  // ':'
                } else {
                    key = std::to_string(k);
                }
                value(i, line, at + "/" + pointer_token(key), depth + 1, enter, seen);
                space(i, line);
                if (i < t_.size() && t_[i] == ',') ++i;
            }
            ++i;
        } else if (c == '"') {
            skip_string(i);
        } else {
            while (i < t_.size() && t_[i] != ',' && t_[i] != '}' && t_[i] != ']' && t_[i] != ' ' && t_[i] != '\n' && t_[i] != '\t' &&
                   t_[i] != '\r')
                ++i;
        }
    }

    std::string_view t_;
    std::vector<int> domains_, stages_;
};

}  // namespace detail

// A mixture file read: its schedule, each domain's data (empty where the file gave a bare name) and
// where each domain was declared ("file:line").
struct mixture_file {
    std::shared_ptr<const mixture_schedule> schedule;
    std::vector<std::vector<std::string>> data;
    std::vector<std::string> declared_at;
    std::vector<std::uint32_t> declared_line;  // the line alone, for what outlives the file's parse (mixture_spec)
};

// A mixture of 10,000 domains over a few stages is about 1 MB.
inline constexpr std::size_t max_mixture_file_bytes = std::size_t{64} << 20;

// Reads a mixture file's text; `name` (its path) goes into every error. `tokens_per_step` (global
// batch x sequence length) turns "at_tokens" into steps; 0 refuses "at_tokens".
inline mixture_file parse_mixture(std::string_view text, const std::string& name, std::uint64_t tokens_per_step = 0) {
    if (text.size() > max_mixture_file_bytes) throw config_error("mixture", name + ": larger than 64 MiB, not a mixture file");
    // The tree (its strings too) and the name index live in an arena for this parse: what they left on
    // the heap when freed sat as a hole between every two domains opened after it
    // (detail/scratch_arena.hpp). Declared first, so that they go before it. What the result keeps is
    // copied out onto the heap (text_of).
    detail::scratch_arena scratch;
    using scratch_string = std::basic_string<char, std::char_traits<char>, detail::scratch_allocator<char>>;
    using scratch_json =
        nlohmann::basic_json<std::map, std::vector, scratch_string, bool, std::int64_t, std::uint64_t, double, detail::scratch_allocator>;
    const auto text_of = [](const scratch_string& v) { return std::string(v.data(), v.size()); };
    scratch_json j;
    try {
        j = scratch_json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::parse_error& e) {
        throw config_error("mixture",
                           name + ":" + std::to_string(detail::json_lines::line_of_offset(text, e.byte)) + ": not JSON (" + e.what() + ")");
    } catch (const nlohmann::json::exception& e) {  // a number too large for a double (406), ...
        throw config_error("mixture", name + ": not JSON a mixture can hold (" + std::string(e.what()) + ")");
    }
    const detail::json_lines lines(text);
    auto where = [&](const std::string& pointer) { return name + ":" + std::to_string(lines.line(pointer)); };
    auto fail = [&](const std::string& field, const std::string& pointer, const std::string& why) -> void {
        throw config_error(field, where(pointer) + ": " + why);
    };
    if (!j.is_object()) fail("mixture", "", "a mixture is a JSON object with \"domains\" and \"stages\"");
    for (const auto& [top_field, v] : j.items())
        if (top_field != "domains" && top_field != "stages") {
            const std::string key = text_of(top_field);
            fail(key, "/" + detail::json_lines::pointer_token(key), "not a field of a mixture (it has \"domains\" and \"stages\")");
        }
    const auto domains = j.find("domains");
    if (domains == j.end() || !domains->is_array() || domains->empty())
        fail("domains", "/domains", "a list of at least one domain (a name, or {\"name\": ..., \"data\": ...})");
    mixture_file out;
    std::vector<std::string> names;
    // Views of `names`, reserved to its size first: no reallocation moves them.
    std::unordered_map<std::string_view, std::size_t, std::hash<std::string_view>, std::equal_to<std::string_view>,
                       detail::scratch_allocator<std::pair<const std::string_view, std::size_t>>>
        index;
    names.reserve(domains->size());  // exactly: the schedule keeps them (10,000 domains, no doubling)
    out.data.reserve(domains->size());
    out.declared_at.reserve(domains->size());
    out.declared_line.reserve(domains->size());
    for (std::size_t d = 0; d < domains->size(); ++d) {
        const auto& e = (*domains)[d];
        const std::string at = "/domains/" + std::to_string(d), field = "domains[" + std::to_string(d) + "]";
        std::string n;
        std::vector<std::string> data;
        if (e.is_string()) {
            n = text_of(e.get_ref<const scratch_string&>());
        } else if (e.is_object()) {
            for (const auto& [domain_field, v] : e.items())
                if (domain_field != "name" && domain_field != "data") {
                    const std::string key = text_of(domain_field);
                    fail(field + "." + key, at + "/" + detail::json_lines::pointer_token(key),
                         "not a field of a domain (\"name\", \"data\")");
                }
            const auto nm = e.find("name");
            if (nm == e.end() || !nm->is_string()) fail(field + ".name", at, "a domain needs a \"name\" string");
            n = text_of(nm->get_ref<const scratch_string&>());
            if (const auto dt = e.find("data"); dt != e.end()) {
                if (dt->is_string()) {
                    data.push_back(text_of(dt->get_ref<const scratch_string&>()));
                } else if (dt->is_array()) {
                    for (std::size_t k = 0; k < dt->size(); ++k) {
                        if (!(*dt)[k].is_string())
                            fail(field + ".data", at + "/data/" + std::to_string(k), "data is a path or a list of paths");
                        data.push_back(text_of((*dt)[k].get_ref<const scratch_string&>()));
                    }
                } else {
                    fail(field + ".data", at + "/data", "data is a path or a list of paths");
                }
            }
        } else {
            fail(field, at, "a domain is a name or {\"name\": ..., \"data\": ...}");
        }
        if (n.empty()) fail(field + ".name", at, "a domain without a name");
        names.push_back(std::move(n));
        if (const auto [it, fresh] = index.emplace(names.back(), d); !fresh)
            fail(field + ".name", at,
                 "the domain name '" + names.back() + "' appears twice (first at line " +
                     std::to_string(lines.line("/domains/" + std::to_string(it->second))) + ")");
        out.data.push_back(std::move(data));
        out.declared_at.push_back(where(at));
        out.declared_line.push_back(static_cast<std::uint32_t>(lines.line(at)));
    }
    const auto stages = j.find("stages");
    if (stages == j.end() || !stages->is_array() || stages->empty())
        fail("stages", "/stages", "a list of at least one stage ({\"at_step\": 0, \"weights\": {...}})");
    // A whole number of at least 0 (JSON writers may give 9e11 for a token count).
    auto count = [&](const scratch_json& v, const std::string& field, const std::string& at) -> std::uint64_t {
        if (v.is_number_unsigned()) return v.get<std::uint64_t>();
        if (v.is_number_float()) {
            const double x = v.get<double>();
            if (std::isfinite(x) && x >= 0 && x < 1.8e19 && std::floor(x) == x) return static_cast<std::uint64_t>(x);
        }
        fail(field, at, "a whole number, at least 0");
        return 0;
    };
    std::vector<mixture_stage> st;
    for (std::size_t k = 0; k < stages->size(); ++k) {
        const auto& e = (*stages)[k];
        const std::string at = "/stages/" + std::to_string(k), field = "stages[" + std::to_string(k) + "]";
        if (!e.is_object()) fail(field, at, "a stage is an object: {\"at_step\": ..., \"weights\": {...}}");
        for (const auto& [stage_field, v] : e.items())
            if (stage_field != "at_step" && stage_field != "at_tokens" && stage_field != "weights" && stage_field != "ramp_steps") {
                const std::string key = text_of(stage_field);
                fail(field + "." + key, at + "/" + detail::json_lines::pointer_token(key),
                     "not a field of a stage (\"at_step\" or \"at_tokens\", \"weights\", \"ramp_steps\")");
            }
        mixture_stage s;
        s.where = where(at);
        const auto step = e.find("at_step"), tokens = e.find("at_tokens");
        if (step != e.end() && tokens != e.end()) fail(field + ".at_tokens", at + "/at_tokens", "give at_step or at_tokens, not both");
        if (step != e.end()) {
            s.at_step = count(*step, field + ".at_step", at + "/at_step");
        } else if (tokens != e.end()) {
            const std::uint64_t n = count(*tokens, field + ".at_tokens", at + "/at_tokens");
            if (tokens_per_step == 0)
                fail(field + ".at_tokens", at + "/at_tokens", "at_tokens needs the run's tokens per step (batch x sequence length)");
            s.at_step = n / tokens_per_step + (n % tokens_per_step != 0);
        } else if (k > 0) {
            fail(field + ".at_step", at, "a stage after the first needs at_step or at_tokens");
        }
        if (const auto r = e.find("ramp_steps"); r != e.end()) s.ramp_steps = count(*r, field + ".ramp_steps", at + "/ramp_steps");
        const auto w = e.find("weights");
        if (w == e.end() || !w->is_object()) fail(field + ".weights", at, "weights by domain name: {\"web\": 3, \"code\": 1}");
        s.weights.assign(names.size(), 0.0);
        for (const auto& [domain, v] : w->items()) {
            const auto it = index.find(std::string_view(domain));
            const bool number = v.is_number();
            const double x = number ? v.get<double>() : 0.0;
            if (it == index.end() || !number || !std::isfinite(x) || x < 0) {  // the strings below only for the error
                const std::string key = text_of(domain);
                const std::string wat = at + "/weights/" + detail::json_lines::pointer_token(key), wfield = field + ".weights." + key;
                if (it == index.end()) fail(wfield, wat, "'" + key + "' is not one of the mixture's domains");
                if (!number) fail(wfield, wat, "a weight is a number");
                fail(wfield, wat, "a weight must be a finite number, at least 0");
            }
            s.weights[it->second] = x;
        }
        st.push_back(std::move(s));
    }
    out.schedule = std::make_shared<const mixture_schedule>(std::move(names), std::move(st));
    return out;
}

}  // namespace feedline
#endif
