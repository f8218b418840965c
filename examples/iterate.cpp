// feedline-iterate: runs the pipeline with no model and reports what it delivers. Adds up every input
// token it receives (uint64), so two runs (other worker counts, backends, a resume) can be compared by
// one number, and prints one JSON line: batches, tokens, token_sum, seconds, tokens_per_s,
// stall_fraction and the pipeline's stats.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>

#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
    CLI::App app{"Iterate a feedline pipeline without a model and report throughput"};
    std::string dataset, mode = "windows", device = "cpu", backend = "auto", model;
    std::uint64_t batch_size = 32, seq_len = 1024, batches = 100, seed = 1234, budget = 0;
    unsigned workers = 0;
    std::size_t prefetch = 0;
    app.add_option("dataset", dataset, "Megatron prefix, llm.c shard pattern or directory, or JSONL / text files (with --model)")->required();
    app.add_option("--batch-size", batch_size, "samples per batch")->capture_default_str();
    app.add_option("--seq-len", seq_len, "tokens per sample")->capture_default_str();
    app.add_option("--batches", batches, "batches to take")->capture_default_str();
    app.add_option("--workers", workers, "worker threads (0: from the machine)")->capture_default_str();
    app.add_option("--prefetch", prefetch, "batches staged ahead (0: automatic)")->capture_default_str();
    app.add_option("--seed", seed, "shuffle seed")->capture_default_str();
    app.add_option("--mode", mode, "windows or packed")->check(CLI::IsMember({"windows", "packed"}))->capture_default_str();
    app.add_option("--device", device, "cpu, auto, cuda or cuda:N")->capture_default_str();
    app.add_option("--io-backend", backend, "auto, io_uring, mmap or pread")->capture_default_str();
    app.add_option("--memory-budget", budget, "bytes (0: a quarter of available memory)")->capture_default_str();
    app.add_option("--model", model, "sentencepiece model: JSONL / text input is tokenized on the fly by the workers");
    CLI11_PARSE(app, argc, argv);
    try {
        const feedline::pipeline_config config{.batch_size = batch_size,
                                               .seq_len = seq_len,
                                               .seed = seed,
                                               .mode = mode == "packed" ? feedline::sample_mode::packed : feedline::sample_mode::windows,
                                               .workers = workers,
                                               .prefetch = prefetch,
                                               .memory_budget = budget,
                                               .io_backend = backend,
                                               .device = device,
                                               .max_steps = batches,
                                               .tokenizer = model};
        std::uint64_t sum = 0, n = 0;
        auto t0 = std::chrono::steady_clock::now();
        feedline::pipeline p(dataset, config);
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
        std::printf("%s\n", j.dump().c_str());
    } catch (const feedline::error& e) {
        std::fprintf(stderr, "feedline-iterate: %s\n", e.what());
        return 1;
    }
    return 0;
}
