// feedline/sampling/mixture_file.hpp: a mixture file, the JSON form of a mixture schedule
// (sampling/mixture_schedule.hpp) and its domains' data. Every mistake is a config_error naming the
// field and the file's line, since these files are written by hand:
//
//   {
//     "domains": [
//       {"name": "web",  "data": "/data/web/shard_*.bin"},
//       {"name": "code", "data": ["/data/code_a_text_document", "/data/code_b_text_document"]},
//       "math"
//     ],
//     "stages": [
//       {"at_step": 0, "weights": {"web": 6, "code": 3, "math": 1}},
//       {"at_tokens": 900000000000, "ramp_steps": 2000, "weights": {"web": 3, "code": 3, "math": 4}}
//     ]
//   }
//
// A domain is a name, or an object with its name and data (a path, glob or Megatron prefix, or a list
// of them). A stage starts at a step ("at_step") or at a token count ("at_tokens": the first step by
// which that many tokens were delivered, for the run's tokens per step); its weights are by domain
// name, any positive scale, and a domain left out has weight 0 there. "ramp_steps" moves the weights
// linearly from the previous stage's to this one's over that many steps.
#pragma once

#if FEEDLINE_HAS_JSON
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/error.hpp>
#include <feedline/sampling/mixture_schedule.hpp>

namespace feedline {

namespace detail {

// The line (from 1) where each value of a JSON text starts, by JSON pointer ("/stages/1/weights/web").
// For a text that nlohmann already parsed. Containers more than `max_depth` deep are stepped over, not
// walked (a mixture is 4 deep; a hostile file must not exhaust the stack). Keys are taken as written,
// so a key spelled with escapes is not found and its lookups fall back to an enclosing value's line.
class json_lines {
public:
    explicit json_lines(std::string_view text) : t_(text) { value("", 0); }
    // The line of the value at `pointer`, or of the nearest enclosing value found (0: none).
    int line(std::string pointer) const {
        for (;;) {
            if (auto it = lines_.find(pointer); it != lines_.end()) return it->second;
            const auto slash = pointer.rfind('/');
            if (slash == std::string::npos) return 0;
            pointer.resize(slash);
        }
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
    void space() {
        while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) line_ += t_[i_++] == '\n';
    }
    std::string string() {  // at '"'; as written
        std::string out;
        for (++i_; i_ < t_.size() && t_[i_] != '"'; ++i_) {
            if (t_[i_] == '\\' && i_ + 1 < t_.size()) out += t_[i_++];
            out += t_[i_];
        }
        ++i_;
        return out;
    }
    void skip_container() {  // at '{' or '[': to just past its match, strings respected, no recursion
        int depth = 0;
        do {
            const char c = t_[i_];
            if (c == '"') {
                string();
                continue;
            }
            depth += c == '{' || c == '[';
            depth -= c == '}' || c == ']';
            line_ += c == '\n';
            ++i_;
        } while (depth > 0 && i_ < t_.size());
    }
    void value(const std::string& at, int depth) {
        space();
        if (i_ >= t_.size()) return;
        lines_.emplace(at, line_);
        const char c = t_[i_];
        if ((c == '{' || c == '[') && depth >= max_depth) return skip_container();
        if (c == '{' || c == '[') {
            const char close = c == '{' ? '}' : ']';
            ++i_;
            for (std::size_t k = 0;; ++k) {
                space();
                if (i_ >= t_.size() || t_[i_] == close) break;
                std::string key = std::to_string(k);
                if (c == '{') {
                    key = string();
                    space();
                    ++i_;  // ':'
                }
                value(at + "/" + pointer_token(key), depth + 1);
                space();
                if (i_ < t_.size() && t_[i_] == ',') ++i_;
            }
            ++i_;
        } else if (c == '"') {
            string();
        } else {
            while (i_ < t_.size() && t_[i_] != ',' && t_[i_] != '}' && t_[i_] != ']' && t_[i_] != ' ' && t_[i_] != '\n' && t_[i_] != '\t' &&
                   t_[i_] != '\r')
                ++i_;
        }
    }

    std::string_view t_;
    std::size_t i_ = 0;
    int line_ = 1;
    std::unordered_map<std::string, int> lines_;
};

}  // namespace detail

// A mixture file read: its schedule, each domain's data (empty where the file gave a bare name) and
// where each domain was declared ("file:line").
struct mixture_file {
    std::shared_ptr<const mixture_schedule> schedule;
    std::vector<std::vector<std::string>> data;
    std::vector<std::string> declared_at;
};

// Reads a mixture file's text; `name` (its path) goes into every error. `tokens_per_step` (global
// batch x sequence length) turns "at_tokens" into steps; 0 refuses "at_tokens".
inline mixture_file parse_mixture(std::string_view text, const std::string& name, std::uint64_t tokens_per_step = 0) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::parse_error& e) {
        throw config_error("mixture",
                           name + ":" + std::to_string(detail::json_lines::line_of_offset(text, e.byte)) + ": not JSON (" + e.what() + ")");
    }
    const detail::json_lines lines(text);
    auto where = [&](const std::string& pointer) { return name + ":" + std::to_string(lines.line(pointer)); };
    auto fail = [&](const std::string& field, const std::string& pointer, const std::string& why) -> void {
        throw config_error(field, where(pointer) + ": " + why);
    };
    if (!j.is_object()) fail("mixture", "", "a mixture is a JSON object with \"domains\" and \"stages\"");
    for (const auto& [key, v] : j.items())
        if (key != "domains" && key != "stages")
            fail(key, "/" + detail::json_lines::pointer_token(key), "not a field of a mixture (it has \"domains\" and \"stages\")");
    const auto domains = j.find("domains");
    if (domains == j.end() || !domains->is_array() || domains->empty())
        fail("domains", "/domains", "a list of at least one domain (a name, or {\"name\": ..., \"data\": ...})");
    mixture_file out;
    std::vector<std::string> names;
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t d = 0; d < domains->size(); ++d) {
        const auto& e = (*domains)[d];
        const std::string at = "/domains/" + std::to_string(d), field = "domains[" + std::to_string(d) + "]";
        std::string n;
        std::vector<std::string> data;
        if (e.is_string()) {
            n = e.get<std::string>();
        } else if (e.is_object()) {
            for (const auto& [key, v] : e.items())
                if (key != "name" && key != "data")
                    fail(field + "." + key, at + "/" + detail::json_lines::pointer_token(key),
                         "not a field of a domain (\"name\", \"data\")");
            const auto nm = e.find("name");
            if (nm == e.end() || !nm->is_string()) fail(field + ".name", at, "a domain needs a \"name\" string");
            n = nm->get<std::string>();
            if (const auto dt = e.find("data"); dt != e.end()) {
                if (dt->is_string()) {
                    data.push_back(dt->get<std::string>());
                } else if (dt->is_array()) {
                    for (std::size_t k = 0; k < dt->size(); ++k) {
                        if (!(*dt)[k].is_string())
                            fail(field + ".data", at + "/data/" + std::to_string(k), "data is a path or a list of paths");
                        data.push_back((*dt)[k].get<std::string>());
                    }
                } else {
                    fail(field + ".data", at + "/data", "data is a path or a list of paths");
                }
            }
        } else {
            fail(field, at, "a domain is a name or {\"name\": ..., \"data\": ...}");
        }
        if (n.empty()) fail(field + ".name", at, "a domain without a name");
        if (const auto [it, fresh] = index.emplace(n, d); !fresh)
            fail(field + ".name", at,
                 "the domain name '" + n + "' appears twice (first at line " +
                     std::to_string(lines.line("/domains/" + std::to_string(it->second))) + ")");
        names.push_back(n);
        out.data.push_back(std::move(data));
        out.declared_at.push_back(where(at));
    }
    const auto stages = j.find("stages");
    if (stages == j.end() || !stages->is_array() || stages->empty())
        fail("stages", "/stages", "a list of at least one stage ({\"at_step\": 0, \"weights\": {...}})");
    // A whole number of at least 0 (JSON writers may give 9e11 for a token count).
    auto count = [&](const nlohmann::json& v, const std::string& field, const std::string& at) -> std::uint64_t {
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
        for (const auto& [key, v] : e.items())
            if (key != "at_step" && key != "at_tokens" && key != "weights" && key != "ramp_steps")
                fail(field + "." + key, at + "/" + detail::json_lines::pointer_token(key),
                     "not a field of a stage (\"at_step\" or \"at_tokens\", \"weights\", \"ramp_steps\")");
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
        for (const auto& [key, v] : w->items()) {
            const std::string wat = at + "/weights/" + detail::json_lines::pointer_token(key), wfield = field + ".weights." + key;
            const auto it = index.find(key);
            if (it == index.end()) fail(wfield, wat, "'" + key + "' is not one of the mixture's domains");
            if (!v.is_number()) fail(wfield, wat, "a weight is a number");
            const double x = v.get<double>();
            if (!std::isfinite(x) || x < 0) fail(wfield, wat, "a weight must be a finite number, at least 0");
            s.weights[it->second] = x;
        }
        st.push_back(std::move(s));
    }
    out.schedule = std::make_shared<const mixture_schedule>(std::move(names), std::move(st));
    return out;
}

}  // namespace feedline
#endif
