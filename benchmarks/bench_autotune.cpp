// bench_autotune: what the autotuner buys over fixed settings, in one run on the same shards.
// (1) A bursty trainer (gradient accumulation: `accum` micro-batches of light compute back to back,
//     then an optimizer pause): its data stall with the prefetch depth fixed at the starting value vs
//     autotuned (prefetch = 0). The trainer's compute and pause are calibrated from the measured time one
//     worker takes per batch, so the producer keeps up on average and only the ring's depth differs.
// (2) A slow trainer: CPU seconds spent by the whole process per batch with all workers running (fixed)
//     vs autotuned (workers = 0, parked down), and where the tuner settled.
// Busy-waits stand in for the trainer's compute, so it holds a core as a real trainer does. Rounds are
// interleaved; medians reported. Last line: one JSON object.
// Usage: bench_autotune [--dir DIR] [--tokens N] [--rounds R] [--steps S]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <feedline/pipeline.hpp>

#include <cstdio>
#include <filesystem>
#include <random>

#include "bench_common.hpp"

namespace fb = feedline::bench;

namespace {

void spin_for(double seconds) {
    const auto end = fb::clock_type::now() + std::chrono::duration_cast<fb::clock_type::duration>(std::chrono::duration<double>(seconds));
    while (fb::clock_type::now() < end) {
    }
}

double cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct outcome {
    double seconds = 0, stall_fraction = 0, cpu_per_batch = 0;
    std::size_t depth = 0;
    unsigned workers_active = 0;
};

// Runs `steps` batches; after each, `compute` seconds of busy work, and every `accum` batches `pause`.
outcome run(const std::string& data, feedline::pipeline_config cfg, std::uint64_t steps, double compute, unsigned accum, double pause) {
    cfg.max_steps = steps;
    feedline::pipeline p(data, cfg);
    const double cpu0 = cpu_seconds();
    const auto t0 = fb::clock_type::now();
    std::uint64_t i = 0;
    for (auto& b : p) {
        (void)b;
        spin_for(compute);
        if (accum && ++i % accum == 0) spin_for(pause);
    }
    outcome o;
    o.seconds = fb::seconds_since(t0);
    const auto s = p.stats();
    o.stall_fraction = s.stall_fraction;
    o.cpu_per_batch = (cpu_seconds() - cpu0) / double(steps);
    o.depth = s.prefetch_depth;
    o.workers_active = s.workers_active;
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"feedline's autotuner vs fixed workers and prefetch depth"};
    std::string dir = "bench-autotune-data";
    std::uint64_t tokens = 50'000'000, steps = 8000;
    int rounds = 5;
    app.add_option("--dir", dir, "where the synthetic Megatron shards go (made once)")->capture_default_str();
    app.add_option("--tokens", tokens, "tokens in the synthetic dataset")->capture_default_str();
    app.add_option("--steps", steps, "batches per measurement")->capture_default_str();
    app.add_option("--rounds", rounds, "interleaved rounds (medians reported)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const std::string prefix = dir + "/tokens";
    if (!std::filesystem::exists(prefix + ".idx")) {
        std::filesystem::create_directories(dir);
        feedline::megatron_writer w(prefix, feedline::token_dtype::uint16);
        std::mt19937 rng(1);
        std::vector<std::uint16_t> doc;
        for (std::uint64_t written = 0; written < tokens;) {
            doc.resize(200 + rng() % 1800);
            for (auto& t : doc) t = static_cast<std::uint16_t>(rng() % 50000);
            w.add_document(std::span<const std::uint16_t>(doc));
            written += doc.size();
        }
        w.finish();
    }

    const feedline::pipeline_config shape{.batch_size = 32, .seq_len = 1024, .seed = 1, .device = feedline::device_kind::cpu};
    // Calibrate: seconds one worker takes per batch with a trainer that only takes batches.
    auto one = shape;
    one.workers = 1;
    one.prefetch = 2;
    run(prefix, one, steps / 4, 0, 0, 0);  // warm the page cache
    const double per_batch = run(prefix, one, steps, 0, 0, 0).seconds / double(steps);
    std::printf("one worker: %.1f us per [32, 1024] batch\n", per_batch * 1e6);

    // (1) bursty: micro-batches at 0.3x the producer's time, then a pause of 8 batches' production.
    const unsigned accum = 8;
    const double compute = 0.3 * per_batch, pause = 8 * per_batch;
    auto fixed_depth = one;  // depth 2 (the tuner's starting point), one worker
    auto tuned_depth = one;
    tuned_depth.prefetch = 0;
    // (2) slow trainer: 3x the producer's time per batch; up to 2 workers.
    auto fixed_workers = shape;
    fixed_workers.workers = 2;
    auto tuned_workers = shape;
    tuned_workers.max_workers = 2;

    std::map<std::string, std::vector<outcome>> got;
    fb::interleaved cases;
    auto add = [&](const std::string& name, const feedline::pipeline_config& cfg, double c, unsigned a, double pz) {
        cases.add(name, [&, name, cfg, c, a, pz] {
            auto o = run(prefix, cfg, steps, c, a, pz);
            got[name].push_back(o);
            return o.stall_fraction;
        });
    };
    add("bursty: depth fixed at 2", fixed_depth, compute, accum, pause);
    add("bursty: depth autotuned", tuned_depth, compute, accum, pause);
    add("slow trainer: 2 workers fixed", fixed_workers, 3 * per_batch, 0, 0);
    add("slow trainer: workers autotuned", tuned_workers, 3 * per_batch, 0, 0);
    auto stall = cases.run(rounds, "stall fraction");

    auto median = [&](const std::string& name, auto field) {
        std::vector<double> v;
        for (auto& o : got[name]) v.push_back(double(field(o)));
        return fb::summarise(v).median;
    };
    const auto seconds = [](const outcome& o) { return o.seconds; };
    const auto cpu = [](const outcome& o) { return o.cpu_per_batch; };
    std::printf("\n%-36s %10s %12s %8s %8s\n", "case", "seconds", "cpu us/batch", "depth", "workers");
    for (auto& [name, v] : got)
        std::printf("%-36s %10.3f %12.1f %8.0f %8.0f\n", name.c_str(), median(name, seconds), 1e6 * median(name, cpu),
                    median(name, [](const outcome& o) { return o.depth; }),
                    median(name, [](const outcome& o) { return o.workers_active; }));

    nlohmann::json j;
    j["us_per_batch_one_worker"] = per_batch * 1e6;
    j["bursty_stall_fixed_depth"] = stall["bursty: depth fixed at 2"].median;
    j["bursty_stall_tuned_depth"] = stall["bursty: depth autotuned"].median;
    j["bursty_tuned_vs_fixed_time"] = median("bursty: depth autotuned", seconds) / median("bursty: depth fixed at 2", seconds);
    j["bursty_tuned_depth"] = median("bursty: depth autotuned", [](const outcome& o) { return o.depth; });
    j["slow_cpu_tuned_vs_fixed"] = median("slow trainer: workers autotuned", cpu) / median("slow trainer: 2 workers fixed", cpu);
    j["slow_stall_tuned"] = stall["slow trainer: workers autotuned"].median;
    j["slow_tuned_workers_active"] = median("slow trainer: workers autotuned", [](const outcome& o) { return o.workers_active; });
    std::printf("%s\n", j.dump().c_str());
}
