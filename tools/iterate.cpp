// feedline-iterate: runs the pipeline with no model and reports what it delivers. Adds up every input
// token it receives (uint64), so two runs (other worker counts, backends, a resume) can be compared by
// one number, and prints one JSON line: batches, tokens, token_sum, seconds, tokens_per_s,
// stall_fraction, the pipeline's stats and its state at the end. DATASET may be a blend in
// Megatron's --data-path form ("0.7 data/web 0.3 code/*.jsonl").
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>

#include "tool_main.hpp"

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
    CLI::App app{"Iterate a feedline pipeline without a model and report throughput"};
    std::string dataset, mode = "windows", shuffle = "global", tail = "drop", device = "cpu", backend = "auto", model;
    std::uint64_t batch_size = 32, seq_len = 1024, batches = 100, seed = 1234, budget = 0;
    unsigned workers = 0;
    std::size_t prefetch = 0;
    app.add_option("dataset", dataset,
                   "Megatron prefix, llm.c shard pattern or directory, JSONL / text files (with --tokenizer), or a blend: \"0.7 data/web 0.3 code/*.jsonl\"")
        ->required();
    app.add_option("--batch-size", batch_size, "samples per batch")->capture_default_str();
    app.add_option("--seq-len", seq_len, "tokens per sample")->capture_default_str();
    app.add_option("--batches", batches, "batches to take")->capture_default_str();
    app.add_option("--workers", workers, "worker threads (0: from the machine)")->capture_default_str();
    app.add_option("--prefetch", prefetch, "batches staged ahead (0: automatic)")->capture_default_str();
    app.add_option("--seed", seed, "shuffle seed")->capture_default_str();
    app.add_option("--mode", mode, "windows or packed")->check(CLI::IsMember({"windows", "packed"}))->capture_default_str();
    app.add_option("--shuffle", shuffle, "global, shard_blocks or none")->check(CLI::IsMember({"global", "shard_blocks", "none"}))->capture_default_str();
    app.add_option("--tail", tail, "an epoch's last incomplete batch: drop or pad")->check(CLI::IsMember({"drop", "pad"}))->capture_default_str();
    app.add_option("--device", device, "cpu, auto, cuda or cuda:N")->capture_default_str();
    app.add_option("--io-backend", backend, "how shards are read")->check(CLI::IsMember({"auto", "io_uring", "mmap", "pread"}))->capture_default_str();
    app.add_option("--memory-budget", budget, "bytes (0: a quarter of available memory)")->capture_default_str();
    app.add_option("--tokenizer,--model", model, "sentencepiece model: JSONL / text input is tokenized on the fly by the workers");
    CLI11_PARSE(app, argc, argv);
    return tools::run_tool("feedline-iterate", 1, [&] {
        feedline::pipeline_config config{.batch_size = batch_size,
                                         .seq_len = seq_len,
                                         .seed = seed,
                                         .mode = mode == "packed" ? feedline::sample_mode::packed : feedline::sample_mode::windows,
                                         .shuffle = shuffle == "none"           ? feedline::shuffle_mode::none
                                                    : shuffle == "shard_blocks" ? feedline::shuffle_mode::shard_blocks
                                                                                : feedline::shuffle_mode::global,
                                         .tail = tail == "pad" ? feedline::tail_policy::pad : feedline::tail_policy::drop,
                                         .workers = workers,
                                         .prefetch = prefetch,
                                         .memory_budget = budget,
                                         .device = feedline::parse_device(device),
                                         .max_steps = batches};
        const auto blend = feedline::parse_data_spec(dataset);
        const auto kinds = feedline::kinds_of(blend);
        if (kinds.tokens) config.shards.backend = feedline::parse_io_backend(backend);
        else if (backend != "auto") throw feedline::config_error("--io-backend", "the data has no token shards (text is read with pread)");
        if (kinds.text) config.text.tokenizer = model;
        else if (!model.empty()) throw feedline::config_error("--tokenizer", "the data has no JSONL/text (shards are tokenized already)");
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
