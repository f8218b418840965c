// feedline-options: the pipeline's options, printed from their one declaration
// (feedline/pipeline/options.hpp). --markdown: the table of docs/options.md; --python: the keyword
// arguments' TypedDict of python/feedline/__init__.py; --json: the defaults as a --config file. The
// tests compare the committed copies with this tool's output, so they never drift from the code.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include <feedline/pipeline/options.hpp>

#include "tool_main.hpp"

namespace {

// The TypedDict Pipeline(**options) is typed with: one field per option, its doc as the docstring.
std::string python_options() {
    std::string out =
        "class PipelineOptions(TypedDict, total=False):\n"
        "    \"\"\"Pipeline's keyword arguments: the C++ pipeline_config's options (docs/options.md). None: the default.\"\"\"\n\n";
    const feedline::pipeline_config defaults{};
    feedline::for_each_option([&](const auto& o) {
        using T = std::remove_cvref_t<decltype(o.value(defaults))>;
        std::string type;
        if constexpr (std::is_same_v<T, bool>)
            type = "bool";
        else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, feedline::device_choice>)
            type = "str";
        else if constexpr (feedline::named_enum<T>) {
            type = "Literal[";
            std::string sep;
            for (const auto& [value, name] : feedline::enum_names<T>::values)
                if (feedline::name_of(value) == name) type += sep + "\"" + std::string(name) + "\"", sep = ", ";
            type += "]";
        } else {
            type = "int";
        }
        std::string def = feedline::option_text(o.value(defaults));
        if constexpr (std::is_same_v<T, bool>)
            def = o.value(defaults) ? "True" : "False";
        else if constexpr (!std::is_integral_v<T>)
            def = "\"" + def + "\"";
        out +=
            "    " + std::string(o.name) + ": Optional[" + type + "]\n    \"\"\"" + std::string(o.doc) + " (default " + def + ")\"\"\"\n";
    });
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Print the pipeline's options from their declaration: a docs table, Python's TypedDict, or the defaults as JSON"};
    bool markdown = false, python = false, json = false;
    app.add_flag("--markdown", markdown, "the table of docs/options.md");
    app.add_flag("--python", python, "the PipelineOptions TypedDict of the Python package");
    app.add_flag("--json", json, "every option with its default, as a --config file holds them");
    CLI11_PARSE(app, argc, argv);
    return tools::run_tool("feedline-options", 1, [&] {
        if (python)
            std::fputs(python_options().c_str(), stdout);
        else if (json)
            std::printf("%s\n", tools::json_text(feedline::options_to_json(feedline::pipeline_config{}), 2).c_str());
        else
            std::fputs(feedline::options_markdown().c_str(), stdout);
        return 0;
    });
}
