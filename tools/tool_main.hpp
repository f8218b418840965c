// tool_main.hpp: what every feedline command-line tool does the same way. Every exception ends the tool
// with one line on stderr and an exit code that says what happened (never an abort): `failure` (1; 2
// for feedline-doctor, whose 1 means "findings that need action") for bad data, a bad config, an I/O
// error or a resource limit (out of memory, no threads or file descriptors left). JSON a tool prints
// never fails on text that is not UTF-8 (a file name): such bytes print as U+FFFD. The pipeline's options
// become flags from their one declaration (feedline/pipeline/options.hpp): add_pipeline_options.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/pipeline/options.hpp>
#include <feedline/storage/file.hpp>

namespace tools {

// One JSON value as text, invalid UTF-8 replaced rather than thrown on (nlohmann's type_error 316).
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Which of the pipeline's options a tool offers as flags: all but `except` (options the tool defines with
// a meaning of its own), or only `only` when given; `aliases` adds spellings ("io_backend" -> "--backend").
struct option_selection {
    std::vector<std::string_view> only, except;
    std::map<std::string_view, std::string> aliases;

    // Whether the tool offers option `name` (keyword or path).
    bool offers(std::string_view name) const {
        bool yes = false;
        feedline::for_each_option([&](const auto& o) {
            if (o.name != name && o.path != name) return;
            const auto in = [&](const std::vector<std::string_view>& list) {
                return std::find(list.begin(), list.end(), o.name) != list.end();
            };
            yes = (only.empty() || in(only)) && !in(except);
        });
        return yes;
    }
};

// Adds a flag per selected option of `config`, its help from the declaration and its default from
// `config` as it is now (a tool may set its own defaults first). A flag given on the command line goes
// through feedline::set_option, so it is parsed like JSON and Python values and counts as set by the
// user (an option for data the run does not have is then refused, naming it). Booleans are flags that
// also take a value: --add-eos, --add-eos=false.
//
// --config FILE.json sets options from a file first (a JSON object of option names, as feedline-options
// --json prints them), so flags on the command line win whatever their order: CLI11 runs the callbacks
// of options in the order they were added, and --config is added first.
// Flags about where data is read from rather than how it is read, for every tool that reads data:
// --no-sign sends s3:// requests unsigned (a public bucket), as AWS_NO_SIGN_REQUEST=true does.
inline void add_storage_flags(CLI::App& app) {
    app.add_flag_callback(
        "--no-sign", [] { ::setenv("AWS_NO_SIGN_REQUEST", "true", 1); },
        "s3:// data: anonymous requests to a public bucket (as AWS_NO_SIGN_REQUEST=true); docs/remote.md");
}

inline void add_pipeline_options(CLI::App& app, feedline::pipeline_config& config, const option_selection& which = {}) {
    add_storage_flags(app);
    app.add_option_function<std::string>(
           "--config",
           [&config, which](const std::string& path) {
               constexpr std::uint64_t max_config_bytes = 1u << 20;
               nlohmann::json j;
               try {
                   j = nlohmann::json::parse(feedline::read_regular_file(path, max_config_bytes));
               } catch (const nlohmann::json::parse_error& e) {
                   throw feedline::config_error("config", path + ": not JSON: " + e.what());
               }
               if (j.is_object())
                   for (const auto& [key, value] : j.items())
                       if (const int i = feedline::option_index(key); i >= 0 && !which.offers(key))
                           throw feedline::config_error(key, path + ": not an option of this tool");
               feedline::options_from_json(config, j, path);
           },
           "JSON object of option names and values (feedline-options --json); flags on the command line win")
        ->type_name("FILE.json");
    feedline::for_each_option([&](const auto& o) {
        if (!which.offers(o.name)) return;
        std::string names = o.flag();
        if (const auto a = which.aliases.find(o.name); a != which.aliases.end()) names += "," + a->second;
        const std::string name(o.name);
        std::string help = std::string(o.doc);
        if (o.scope != feedline::data_scope::any) help += " [" + std::string(feedline::name_of(o.scope)) + "]";
        using T = std::remove_cvref_t<decltype(o.value(config))>;
        if constexpr (std::is_same_v<T, bool>) {
            app.add_flag_function(
                   names, [&config, name](std::int64_t count) { feedline::set_option(config, name, count > 0 ? "true" : "false"); }, help)
                ->default_str(feedline::option_text(o.value(config)));
        } else {
            auto* opt = app.add_option_function<std::string>(
                names, [&config, name](const std::string& v) { feedline::set_option(config, name, v); }, help);
            opt->default_str(feedline::option_text(o.value(config)));
            if constexpr (feedline::named_enum<T>) opt->type_name(feedline::choices_of<T>());
        }
    });
}

// "text.tokenizer (--tokenizer)": a config field as the user of a tool typed it.
inline std::string with_flag(const std::string& field) {
    std::string out = field;
    feedline::for_each_option([&](const auto& o) {
        if (o.path == field || o.name == field) out = field + " (" + o.flag() + ")";
    });
    return out;
}

// Runs `body` (returning the exit code) and turns any exception into "NAME: what" on stderr and
// `failure`. Resource failures get a hint: std::bad_alloc (an address-space or memory limit) and
// std::system_error from thread creation (a process or thread limit).
template <class Body>
int run_tool(const char* name, int failure, Body&& body) {
    try {
        return body();
    } catch (const feedline::config_error& e) {
        std::string what = e.what();
        if (const std::string named = with_flag(e.field()); named != e.field() && what.rfind("config " + e.field(), 0) == 0)
            what = "config " + named + what.substr(7 + e.field().size());
        std::fprintf(stderr, "%s: %s\n", name, what.c_str());
    } catch (const feedline::error& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr,
                     "%s: out of memory (a memory or address-space limit, ulimit -v, was reached); use fewer workers, a smaller batch or "
                     "memory budget, or raise the limit\n",
                     name);
    } catch (const std::system_error& e) {
        std::fprintf(stderr, "%s: %s (a system limit: threads, processes or open files; see ulimit -u / -n)\n", name, e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
    }
    return failure;
}

// Parses the command line: usage errors as CLI11 reports them (--help: 0), a flag's bad value (a
// config_error from set_option) like any other error. Returns the exit code to end with, or -1 to go on.
inline int parse_command_line(const char* name, int failure, CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
        return -1;
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (...) {
        return run_tool(name, failure, []() -> int { throw; });
    }
}

}  // namespace tools
