// feedline/pipeline/data_spec.hpp: what DATASET means, in the API and in every tool. One spec is a
// Megatron prefix, llm.c shards, headerless token files ("raw:uint16:train.bin"), or JSONL/text files (a file, a directory or a glob of either kind);
// several are blended by weight, written as a list or, on a command line, in Megatron's --data-path
// form: "0.7 data/web 0.3 code/*.jsonl". detect_source() tells what kind of source a spec names by its
// files, through the source registry.
// A spec that names a mixture file (sampling/mixture_file.hpp: a ".json" file with "domains" and
// "stages") is a mixture: its domains' data, mixed by its schedule (read_mixture_spec).
// Feeds pipeline/pipeline.hpp, which opens each spec as a source.
#pragma once

#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#if FEEDLINE_HAS_JSON
#include <nlohmann/json.hpp>

#include <feedline/sampling/mixture_file.hpp>
#include <feedline/storage/file.hpp>
#endif

#include <feedline/detail/paths.hpp>
#include <feedline/error.hpp>
#include <feedline/format/raw_tokens.hpp>
#include <feedline/pipeline/sources.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

struct weighted_spec {
    double weight = 1;
    std::string spec;
};

namespace detail {

// Throws config_error naming the position (1-based, in a list) unless the weight is positive and finite.
inline void check_weight(double w, std::size_t position) {
    if (!(w > 0) || !std::isfinite(w))
        throw config_error("dataset",
                           "weight " + std::to_string(position) + " (" + std::to_string(w) + ") must be a positive, finite number");
}

}  // namespace detail

// Parses a DATASET argument: a single path (a string naming an existing file, or one word), or words
// alternating weight and path. Throws config_error naming the position of an odd list, a word that is
// not a number where a weight belongs, or a weight that is zero, negative or not finite.
inline std::vector<weighted_spec> parse_data_spec(const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    if (words.empty()) throw config_error("dataset", "empty: give a path, or weights and paths (\"0.7 data/web 0.3 code/*.jsonl\")");
    if (words.size() == 1 || detail::path_exists(text)) return {{1.0, words.size() == 1 ? words[0] : text}};
    if (words.size() % 2 != 0)
        throw config_error("dataset", "'" + text + "': " + std::to_string(words.size()) +
                                          " words; a blend alternates weight and path (\"0.7 a 0.3 b\"): word " +
                                          std::to_string(words.size()) + " has no path after it");
    std::vector<weighted_spec> out;
    for (std::size_t i = 0; i < words.size(); i += 2) {
        const std::string& w = words[i];
        char* end = nullptr;
        const double weight = std::strtod(w.c_str(), &end);
        if (end == w.c_str() || *end != '\0')
            throw config_error("dataset", "word " + std::to_string(i + 1) + " of '" + text + "' ('" + w +
                                              "') is not a weight; a blend alternates weight and path");
        detail::check_weight(weight, i / 2 + 1);
        out.push_back({weight, words[i + 1]});
    }
    return out;
}

namespace detail {

// The kind of source a spec names, by its files (one expansion: storage/storage_scheme.hpp): the first
// registered kind that claims them (token shards: a Megatron prefix or any .idx/.bin; text: JSONL/text
// files and no shard), else the fallback kind (token shards), whose error then names what is missing.
inline source_type source_type_of(const std::string& spec) {
    const auto types = source_registry::entries();
    // A glob that matches nothing goes to the fallback kind, which says so; a directory that cannot be
    // listed (a symlink loop in it) is an io_error naming the entry, here already.
    // A raw spec ("raw:uint16:...") is token shards by its name alone; its files are listed when opened.
    const std::vector<std::string> files = parse_raw_spec(spec)           ? std::vector<std::string>{}
                                           : detail::has_glob_chars(spec) ? scheme_for(spec).glob(spec)
                                                                          : expand_location(spec).entries;
    const source_type* fallback = nullptr;
    for (const auto& t : types) {
        if (t->claims(spec, files)) return *t;
        if (t->fallback) fallback = t.get();
    }
    if (fallback == nullptr) throw config_error("dataset", "'" + spec + "': no kind of source is built in");
    return *fallback;  // copied out before `types` goes
}

}  // namespace detail

inline source_kind detect_source(const std::string& spec) { return detail::source_type_of(spec).kind; }

// A mixture named by a data spec: its schedule, each domain's data (one spec, or a list of them opened
// together as one source: the schedule weighs the domains), the line of the file where each domain was
// declared, and the file's path. Held while the domains open and freed after: every allocation a
// domain it kept past the first domain's open stayed a hole in the heap between the domains' objects
// for the whole run, so it keeps one string a spec and two integers a domain (a vector of specs and a
// "file:line" string a domain cost 132 bytes a domain at 10,000 domains, bench_mixture).
struct mixture_spec {
    std::shared_ptr<const mixture_schedule> schedule;
    // Domain d's data: specs[first[d]] up to specs[first[d + 1]].
    std::vector<std::string> specs;
    std::vector<std::uint32_t> first{0};
    std::vector<std::uint32_t> declared_line;
    std::string path;

    std::size_t domains() const noexcept { return first.size() - 1; }
    std::span<std::string> data(std::size_t d) noexcept { return {specs.data() + first[d], specs.data() + first[d + 1]}; }
    std::string declared_at(std::size_t d) const { return path + ":" + std::to_string(declared_line.at(d)); }
};

namespace detail {
// A mixture's data path as the pipeline opens it: a relative one is relative to the mixture file (a
// file kept beside its data works from any directory); absolute paths and URLs (s3://) as they are.
inline std::string beside(const std::string& mixture_path, std::string spec) {
    const auto slash = mixture_path.rfind('/');
    if (!spec.empty() && spec[0] != '/' && spec.find("://") == std::string::npos && slash != std::string::npos)
        spec = mixture_path.substr(0, slash + 1) + spec;
    return spec;
}
#if FEEDLINE_HAS_JSON
// The text of `spec` when it names a mixture file: one ".json" regular file (at most 256 MiB) whose
// JSON is an object with "domains" and "stages". Anything else is not a mixture (the other kinds of
// data then say what is wrong with it).
inline std::optional<std::string> mixture_text(const std::vector<weighted_spec>& blend) {
    if (blend.size() != 1 || !blend[0].spec.ends_with(".json") || !detail::path_exists(blend[0].spec)) return std::nullopt;
    const std::string& path = blend[0].spec;
    require_regular_file(path);
    file f(path);
    if (f.size() > (std::uint64_t{256} << 20)) return std::nullopt;
    std::string text(f.size(), '\0');
    f.read_at(text.data(), text.size(), 0);
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("domains") || !j.contains("stages")) return std::nullopt;
    return text;
}
#endif
}  // namespace detail

// The mixture a spec names, if it names one; `tokens_per_step` (global batch x seq_len) places stages
// given by token count. Throws config_error (naming the field and the file's line) for a bad mixture
// file, or a domain without data.
inline std::optional<mixture_spec> read_mixture_spec(const std::vector<weighted_spec>& blend, std::uint64_t tokens_per_step) {
#if FEEDLINE_HAS_JSON
    const auto text = detail::mixture_text(blend);
    if (!text) return std::nullopt;
    mixture_file f = parse_mixture(*text, blend[0].spec, tokens_per_step);
    mixture_spec m{.schedule = f.schedule, .declared_line = std::move(f.declared_line), .path = blend[0].spec};
    std::size_t specs = 0;
    for (const auto& data : f.data) specs += data.size();
    m.specs.reserve(specs);
    m.first.reserve(f.data.size() + 1);
    for (std::size_t d = 0; d < f.data.size(); ++d) {
        if (f.data[d].empty())
            throw config_error("domains[" + std::to_string(d) + "].data", f.declared_at[d] + ": domain '" + f.schedule->names()[d] +
                                                                              "' needs its data: a path, glob or prefix, or a list of them");
        for (std::string& spec : f.data[d]) m.specs.push_back(detail::beside(blend[0].spec, std::move(spec)));
        m.first.push_back(static_cast<std::uint32_t>(m.specs.size()));
    }
    return m;
#else
    (void)blend;
    (void)tokens_per_step;
    return std::nullopt;
#endif
}

// Which kinds of data a blend names (detect_source on each spec): tools set the options of a kind only
// when there is data of that kind (config.shards / config.text are refused otherwise).
struct data_kinds {
    bool tokens = false, text = false;
};
inline data_kinds kinds_of(const std::vector<weighted_spec>& blend) {
    data_kinds k;
#if FEEDLINE_HAS_JSON
    if (const auto text = detail::mixture_text(blend)) {  // a mixture: its domains' data, as written
        const auto j = nlohmann::json::parse(*text, nullptr, false);
        for (const auto& d : j["domains"]) {
            if (!d.is_object() || !d.contains("data")) continue;
            const auto& data = d["data"];
            for (const auto& spec : data.is_array() ? data : nlohmann::json::array({data}))
                if (spec.is_string())
                    (detect_source(detail::beside(blend[0].spec, spec.get<std::string>())) == source_kind::text ? k.text : k.tokens) = true;
        }
        return k;
    }
#endif
    for (const auto& w : blend) (detect_source(w.spec) == source_kind::text ? k.text : k.tokens) = true;
    return k;
}

}  // namespace feedline
