// feedline-iterate: runs the pipeline with no model and reports what it delivers. Adds up every input
// token it receives (uint64), so two runs (other worker counts, backends, a resume) can be compared by
// one number, and prints one JSON line: batches, tokens, token_sum, seconds, tokens_per_s,
// stall_fraction, the pipeline's stats and its state at the end. DATASET may be a blend in
// Megatron's --data-path form ("0.7 data/web 0.3 code/*.jsonl").
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>

#include "tool_main.hpp"

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
    CLI::App app{"Iterate a feedline pipeline without a model and report throughput"};
    std::string dataset;
    // This tool's defaults, where they differ from the pipeline's: a measuring tool on the host.
    feedline::pipeline_config config{.batch_size = 32, .seq_len = 1024, .device = feedline::device_kind::cpu, .max_steps = 100};
    app.add_option("dataset", dataset,
                   "Megatron prefix, llm.c shard pattern or directory, JSONL / text files (with --tokenizer), or a blend: \"0.7 data/web "
                   "0.3 code/*.jsonl\"")
        ->required();
    tools::add_pipeline_options(app, config, {.aliases = {{"max_steps", "--batches"}, {"tokenizer", "--model"}}});
    if (const int code = tools::parse_command_line("feedline-iterate", 1, app, argc, argv); code >= 0) return code;
    const std::uint64_t batch_size = config.batch_size, seq_len = config.seq_len;
    return tools::run_tool("feedline-iterate", 1, [&] {
        const auto blend = feedline::parse_data_spec(dataset);
        std::uint64_t sum = 0, n = 0;
        auto t0 = std::chrono::steady_clock::now();
        feedline::pipeline p(blend, config);
        for (auto& b : p) {
            for (std::int32_t t : b.host_inputs()) sum += static_cast<std::uint64_t>(t);
            ++n;
        }
        const feedline::pipeline_stats st = p.stats();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        nlohmann::json j = nlohmann::json::parse(st.to_json());
        j["batches"] = n;
        j["tokens"] = n * batch_size * seq_len;
        j["token_sum"] = sum;
        j["seconds"] = seconds;
        j["tokens_per_s"] = seconds > 0 ? static_cast<double>(n * batch_size * seq_len) / seconds : 0.0;
        j["state"] = nlohmann::json::parse(feedline::to_json(p.state()));
        std::printf("%s\n", tools::json_text(j).c_str());
        return 0;
    });
}
