// feedline/pipeline/options.hpp: every pipeline option declared once. A declaration names the option
// (the keyword of Python, JSON and --config files; the CLI flag is "--" and the name with '-' for '_'),
// the pipeline_config field it sets, one line of documentation, which kinds of data it applies to and
// the largest value it takes. The field's type and default are the aggregate's (pipeline/config.hpp),
// so designated initializers keep working and a default is written once. From the declarations come:
// parsing strings for every type (enumerations through feedline/names.hpp), "set by the user"
// tracking, the JSON form, the CLI flags of every tool (tools/tool_main.hpp), the Python keyword
// arguments and their docs (python/), and the table in docs/options.md (feedline-options --markdown,
// checked to be current by a test). Adding an option: its field in config.hpp, one declaration here.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <feedline/detail/edit_distance.hpp>

#if FEEDLINE_HAS_JSON
#include <nlohmann/json.hpp>
#endif

#include <feedline/error.hpp>
#include <feedline/names.hpp>
#include <feedline/pipeline/config.hpp>

namespace feedline {

// Which data an option means something for. Setting one for a pipeline without that kind of data is a
// config_error naming it (the pipeline checks).
enum class data_scope { any, tokens, text };

template <>
struct enum_names<data_scope> {
    static constexpr std::array values{named(data_scope::any, "any"), named(data_scope::tokens, "token shards"),
                                       named(data_scope::text, "JSONL/text")};
};

// One option. `T` is the field's type.
template <class T>
struct option {
    std::string_view name;  // keyword: Python, JSON, --config; CLI: --name-with-dashes
    std::string_view path;  // the pipeline_config field, as errors name it
    std::string_view doc;   // one line
    data_scope scope;
    T& (*field)(pipeline_config&);
    std::uint64_t max = 0;  // integers: the largest accepted (0: the type's own)
    std::int64_t min = -1;  // signed integers: the smallest accepted (-1: "from the environment")

    const T& value(const pipeline_config& c) const { return field(const_cast<pipeline_config&>(c)); }
    std::string flag() const {
        std::string f = "--" + std::string(name);
        for (char& ch : f)
            if (ch == '_') ch = '-';
        return f;
    }
};

// clang-format off
inline constexpr auto pipeline_options = std::make_tuple(
    option<std::uint64_t>{"batch_size", "batch_size", "samples per step on this rank (the global batch is batch_size x world size)", data_scope::any, [](pipeline_config& c) -> auto& { return c.batch_size; }},
    option<std::uint64_t>{"seq_len", "seq_len", "tokens per sample: inputs and targets are [batch_size, seq_len]", data_scope::any, [](pipeline_config& c) -> auto& { return c.seq_len; }},
    option<std::uint64_t>{"seed", "seed", "seed of the document and sample order", data_scope::any, [](pipeline_config& c) -> auto& { return c.seed; }},
    option<sample_mode>{"mode", "mode", "windows: GPT windows across documents; packed: whole documents packed into rows", data_scope::any, [](pipeline_config& c) -> auto& { return c.mode; }},
    option<shuffle_mode>{"shuffle", "shuffle", "global: one permutation of all documents; shard_blocks: shards in a shuffled order; none: documents and windows in order", data_scope::any, [](pipeline_config& c) -> auto& { return c.shuffle; }},
    option<tail_policy>{"tail", "tail", "an epoch's last incomplete global batch (one dataset): dropped; padded from the epoch's start; or mask: padded so, with ignore_index targets in the padding rows (every sample counted once: evaluation)", data_scope::any, [](pipeline_config& c) -> auto& { return c.tail; }},
    option<unsigned>{"workers", "workers", "worker threads filling batches; 0: from the machine, autotuned while running", data_scope::any, [](pipeline_config& c) -> auto& { return c.workers; }, 1024},
    option<unsigned>{"max_workers", "max_workers", "with workers 0: the most the autotuner may run (0: from the machine)", data_scope::any, [](pipeline_config& c) -> auto& { return c.max_workers; }, 1024},
    option<std::size_t>{"prefetch", "prefetch", "batches staged ahead of the trainer; 0: 2 per worker to start, autotuned within the memory budget", data_scope::any, [](pipeline_config& c) -> auto& { return c.prefetch; }},
    option<std::uint64_t>{"memory_budget", "memory_budget", "bytes for slots, scratch and indexes; 0: a quarter of the memory available", data_scope::any, [](pipeline_config& c) -> auto& { return c.memory_budget; }},
    option<device_choice>{"device", "device", "where batches go: auto (the GPU when there is one), cpu, cuda or cuda:N", data_scope::any, [](pipeline_config& c) -> auto& { return c.device; }},
    option<int>{"rank", "rank", "this process's rank; -1: from torchrun's or Open MPI's environment", data_scope::any, [](pipeline_config& c) -> auto& { return c.rank; }, 1 << 24},
    option<int>{"world_size", "world_size", "ranks in the job; -1: from the environment", data_scope::any, [](pipeline_config& c) -> auto& { return c.world_size; }, 1 << 24},
    option<int>{"ignore_index", "ignore_index", "the target where there is no next token (packed mode: a piece's end and the padding); feedline.Pipeline from Python uses -100, what PyTorch's cross_entropy ignores", data_scope::any, [](pipeline_config& c) -> auto& { return c.ignore_index; }, 1 << 30, -(1 << 30)},
    option<std::uint64_t>{"max_steps", "max_steps", "end the iteration after this many steps; 0: run on through epochs", data_scope::any, [](pipeline_config& c) -> auto& { return c.max_steps; }},
    option<std::uint64_t>{"epochs", "epochs", "one dataset: end the iteration after this many passes over the data (with max_steps: whichever comes first); 0: no end", data_scope::any, [](pipeline_config& c) -> auto& { return c.epochs; }, 1u << 20},
    option<std::string>{"stats_jsonl", "stats_jsonl", "append a stats snapshot to this file as a JSON line every stats_every batches and at the end", data_scope::any, [](pipeline_config& c) -> auto& { return c.stats_jsonl; }},
    option<std::uint64_t>{"stats_every", "stats_every", "batches between stats lines", data_scope::any, [](pipeline_config& c) -> auto& { return c.stats_every; }},
    option<bool>{"avoid_trainer_cpu", "avoid_trainer_cpu", "keep the threads filling batches off a busy trainer's CPU when there is one to spare", data_scope::any, [](pipeline_config& c) -> auto& { return c.avoid_trainer_cpu; }},
    option<io_backend>{"io_backend", "shards.backend", "how shards are read: auto, io_uring, mmap or pread", data_scope::tokens, [](pipeline_config& c) -> auto& { return c.shards.backend; }},
    option<int>{"fetch_ahead", "shards.fetch_ahead", "shards in remote storage (s3://): steps whose ranges are fetched ahead of the workers from the sampler's plan; -1: as many as the measured latency and the trainer's rate call for, within the memory budget; 0: none", data_scope::tokens, [](pipeline_config& c) -> auto& { return c.shards.fetch_ahead; }, 1 << 16},
    option<std::string>{"tokenizer", "text.tokenizer", "the tokenizer model for JSONL/text (a sentencepiece .model or a byte-level BPE tokenizer.json; its kind is recognized)", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.tokenizer; }},
    option<std::string>{"tokenizer_kind", "text.tokenizer_kind", "which encoder reads the model: feedline (feedline's own, Unigram and BPE models, the library's ids), sentencepiece (the library), byte-level-bpe (a tokenizer.json, the tokenizers package's ids) or auto (the kind that recognizes the model; for a .model feedline's where it reproduces it, else the library's)", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.tokenizer_kind; }},
    option<bool>{"add_bos", "text.add_bos", "the model's BOS before every document", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.add_bos; }},
    option<bool>{"add_eos", "text.add_eos", "the model's EOS after every document", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.add_eos; }},
    option<std::string>{"field", "text.documents.field", "the JSONL field that holds a document's text", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.documents.field; }},
    option<bool>{"skip_invalid", "text.documents.skip_invalid", "count and skip JSONL lines that are invalid, lack the field or are too long, instead of failing", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.documents.skip_invalid; }},
    option<text_split>{"text_split", "text.documents.split", "plain text: a document per file, per blank-line-separated block, or per line", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.documents.split; }},
    option<std::uint64_t>{"max_line_bytes", "text.documents.max_line_bytes", "the longest line or document read, in bytes (0: no limit)", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.documents.max_line_bytes; }},
    option<std::string>{"cache_dir", "text.cache_dir", "where a corpus's token counts are kept between runs (\"\": $FEEDLINE_CACHE_DIR, else $XDG_CACHE_HOME/feedline, else ~/.cache/feedline; none: memory only)", data_scope::text, [](pipeline_config& c) -> auto& { return c.text.cache_dir; }});
// clang-format on

namespace detail {
inline constexpr std::size_t option_count = std::tuple_size_v<std::remove_cvref_t<decltype(pipeline_options)>>;
}  // namespace detail
static_assert(detail::option_count <= 64, "pipeline_config::set_by_user holds 64 bits");

// Calls f(option) for every option, in declaration order.
template <class F>
void for_each_option(F&& f) {
    std::apply([&](const auto&... o) { (f(o), ...); }, pipeline_options);
}

// Calls f(option, position) for every option: an option's position is its bit in
// pipeline_config::set_by_user, so no declaration carries a number that could collide with another's.
template <class F>
void for_each_option_at(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::get<I>(pipeline_options), I), ...); }
    (std::make_index_sequence<detail::option_count>{});
}

// A value as text: numbers in decimal, enumerations by name, device choices as parse_device reads them.
template <class T>
std::string option_text(const T& v) {
    if constexpr (std::is_same_v<T, bool>)
        return v ? "true" : "false";
    else if constexpr (std::is_same_v<T, std::string>)
        return v;
    else if constexpr (std::is_same_v<T, device_choice>)
        return to_string(v);
    else if constexpr (named_enum<T>)
        return std::string(name_of(v));
    else
        return std::to_string(v);
}

namespace detail {

// Parses a value of an option from text. Throws config_error naming the option's field with what was
// expected (the choices of an enumeration, the range of a number).
template <class T>
T parse_option(const option<T>& o, std::string_view text) {
    const std::string field(o.path);
    if constexpr (std::is_same_v<T, bool>) {
        if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
        if (text == "false" || text == "0" || text == "no" || text == "off") return false;
        throw config_error(field, "'" + std::string(text) + "' (expected true or false)");
    } else if constexpr (std::is_same_v<T, std::string>) {
        return std::string(text);
    } else if constexpr (std::is_same_v<T, device_choice>) {
        return parse_device(std::string(text));
    } else if constexpr (named_enum<T>) {
        return parse_enum<T>(text, field);
    } else {
        static_assert(std::is_integral_v<T>);
        T v{};
        const auto* end = text.data() + text.size();
        const auto r = std::from_chars(text.data(), end, v);
        const std::uint64_t limit = o.max ? o.max : static_cast<std::uint64_t>(std::numeric_limits<T>::max());
        bool bad = r.ec != std::errc() || r.ptr != end;
        if constexpr (std::is_signed_v<T>)
            bad = bad || v < o.min || (v > 0 && static_cast<std::uint64_t>(v) > limit);
        else
            bad = bad || static_cast<std::uint64_t>(v) > limit;
        if (bad)
            throw config_error(field, "'" + std::string(text) + "' (expected a whole number from " +
                                          (std::is_signed_v<T> ? std::to_string(o.min) : "0") + " to " + std::to_string(limit) + ")");
        return v;
    }
}

}  // namespace detail

// The declaration named `name` (keyword or path), as its index; -1 when there is none.
inline int option_index(std::string_view name) {
    int found = -1;
    for_each_option_at([&](const auto& o, std::size_t i) {
        if (found < 0 && (o.name == name || o.path == name)) found = static_cast<int>(i);
    });
    return found;
}

namespace detail {

// The nearest name to an unknown one, for "did you mean": the fewest single-letter edits (at most a
// third of the name's length), else "".
inline std::string option_suggestion(std::string_view name) {
    std::string best;
    std::size_t best_distance = name.size() / 3 + 1;
    for_each_option([&](const auto& o) {
        if (const std::size_t d = edit_distance(name, o.name); d < best_distance) best_distance = d, best = std::string(o.name);
    });
    return best.empty() ? std::string() : " (did you mean " + best + "?)";
}

}  // namespace detail

// Sets option `name` (keyword or path) of `c` from text and marks it set by the user. Throws
// config_error naming an unknown option (with the nearest name) or a bad value.
inline void set_option(pipeline_config& c, std::string_view name, std::string_view text) {
    bool done = false;
    for_each_option_at([&](const auto& o, std::size_t i) {
        if (done || (o.name != name && o.path != name)) return;
        o.field(c) = detail::parse_option(o, text);
        c.set_by_user.set(i);
        done = true;
    });
    if (!done) throw config_error(std::string(name), "no such option" + detail::option_suggestion(name));
}

// Whether option `o` was set: by set_option (a command line, JSON, Python), or, for a config built in
// C++ with designated initializers, by a value other than the default.
template <class T>
bool option_is_set(const pipeline_config& c, const option<T>& o) {
    static const pipeline_config defaults{};
    return c.set_by_user.test(static_cast<std::size_t>(option_index(o.name))) || !(o.value(c) == o.value(defaults));
}

namespace detail {

// The options of `scope` that are set (see option_is_set), as config paths ("text.tokenizer") for a
// config_error; the tools add the flag (tools::with_flag).
inline std::vector<std::string> options_set_for(const pipeline_config& c, data_scope scope) {
    std::vector<std::string> out;
    for_each_option([&](const auto& o) {
        if (o.scope == scope && option_is_set(c, o)) out.push_back(std::string(o.path));
    });
    return out;
}

}  // namespace detail

#if FEEDLINE_HAS_JSON
// Every option by name, with its value (enumerations by name): a config as JSON.
inline nlohmann::json options_to_json(const pipeline_config& c) {
    nlohmann::json j = nlohmann::json::object();
    for_each_option([&](const auto& o) {
        using T = std::remove_cvref_t<decltype(o.value(c))>;
        if constexpr (std::is_same_v<T, bool> || std::is_integral_v<T> || std::is_same_v<T, std::string>)
            j[std::string(o.name)] = o.value(c);
        else
            j[std::string(o.name)] = option_text(o.value(c));
    });
    return j;
}

// Sets the options an object names (a --config file, a saved config): numbers, booleans and strings
// as JSON has them, enumerations by name. Throws config_error for an unknown key or a bad value.
inline void options_from_json(pipeline_config& c, const nlohmann::json& j, const std::string& where) {
    if (!j.is_object()) throw config_error("config", where + ": expected a JSON object of option names and values");
    for (const auto& [key, value] : j.items()) {
        if (option_index(key) < 0) throw config_error(key, where + ": no such option" + detail::option_suggestion(key));
        if (value.is_string())
            set_option(c, key, value.get<std::string>());
        else if (value.is_boolean())
            set_option(c, key, value.get<bool>() ? "true" : "false");
        else if (value.is_number_integer())
            set_option(c, key, value.dump());
        else
            throw config_error(key, where + ": expected a whole number, a string or true/false");
    }
}
#endif

// The options table of docs/options.md: name, CLI flag, type (or choices), default, data, what it does.
inline std::string options_markdown() {
    const pipeline_config defaults{};
    std::string out = "| option | flag | value | default | data | what it does |\n|---|---|---|---|---|---|\n";
    for_each_option([&](const auto& o) {
        using T = std::remove_cvref_t<decltype(o.value(defaults))>;
        std::string type;
        if constexpr (std::is_same_v<T, bool>)
            type = "true/false";
        else if constexpr (std::is_same_v<T, std::string>)
            type = "text";
        else if constexpr (std::is_same_v<T, device_choice>)
            type = "auto, cpu, cuda or cuda:N";
        else if constexpr (named_enum<T>)
            type = choices_of<T>();
        else
            type = !std::is_signed_v<T> ? "whole number" : o.min == -1 ? "whole number (-1 ...)" : "whole number (negative too)";
        std::string def = option_text(o.value(defaults));
        if (def.empty()) def = "\"\"";
        out += "| `" + std::string(o.name) + "` | `" + o.flag() + "` | " + type + " | `" + def + "` | " + std::string(name_of(o.scope)) +
               " | " + std::string(o.doc) + " |\n";
    });
    return out;
}

}  // namespace feedline
