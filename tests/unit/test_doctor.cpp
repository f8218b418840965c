// feedline-doctor plan: the model-state formulas reproduce the ZeRO paper's worked example (per-GPU
// memory of a 7.5 B model on 64 GPUs at each stage), hand-computed cases hold for each stage, precision and optimizer, activations follow the
// documented formula, and bad input is a config_error naming the field. The tool itself: JSON output,
// --config files, exit codes. check: the fixture machines (a 2-socket 8-GPU server, a small VM, a
// cgroup-limited container) give their findings, and the live machine is measured on real shards.
// diagnose reads the telemetry of trainer logs and pipeline stats lines.
#include <doctest/doctest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include <random>
#include <regex>
#include <sstream>
#include <thread>
#include <utility>

#include <feedline/format/megatron.hpp>
#include <feedline/pipeline.hpp>

#include <feedline/doctor/check.hpp>
#include <feedline/doctor/diagnose.hpp>
#include <feedline/doctor/plan.hpp>
#include "run_command.hpp"
#include "test_support.hpp"

namespace doctor = feedline::doctor;

namespace ft = feedline::test;
using doctor::make_plan;
using doctor::plan_input;

namespace {

double states_gb(const doctor::plan_result& r) {
    return (r.get("parameters").value + r.get("gradients").value + r.get("optimizer_states").value) / 1e9;
}

// Only the model states: no reserve, an unlimited GPU.
plan_input zero_case(double psi, std::uint64_t ranks, unsigned stage) {
    plan_input in;
    in.params = psi;
    in.gpus = ranks;
    in.zero_stage = stage;
    in.gpu_reserve = 0;
    in.gpu_memory = 1e18;
    return in;
}

std::string field_of(const plan_input& in) {
    try {
        make_plan(in);
    } catch (const feedline::config_error& e) {
        return e.field();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("Doctor.Plan.ReproducesTheZeroPapersWorkedExample") {
    // Rajbhandari et al. (SC'20), Figure 1: a 7.5 B parameter model (Ψ) on Nd = 64 data-parallel
    // GPUs with mixed precision Adam (K = 12) needs 120 GB of model states per GPU as the baseline,
    // 31.4 GB with P_os (stage 1), 16.6 GB with P_os+g (stage 2) and 1.9 GB with P_os+g+p (stage 3),
    // as printed there (rounded to the digits shown).
    const double printed[] = {120, 31.4, 16.6, 1.9};
    const double shown[] = {1, 0.1, 0.1, 0.1};  // the last printed digit
    for (unsigned stage = 0; stage <= 3; ++stage) {
        CAPTURE(stage);
        const auto r = make_plan(zero_case(7.5e9, 64, stage));
        CHECK(std::abs(states_gb(r) - printed[stage]) <= 0.5 * shown[stage] + 1e-9);
    }
    // And the formulas behind them, for other sizes: 16 Ψ replicated; 4 Ψ + 12 Ψ / Nd; 2 Ψ + 14 Ψ / Nd; 16 Ψ / Nd.
    for (const double psi : {1.3e9, 128e9, 1e12})
        for (const std::uint64_t nd : {1, 4, 16, 1024}) {
            CAPTURE(psi);
            CAPTURE(nd);
            const double expect[] = {16 * psi, 4 * psi + 12 * psi / double(nd), 2 * psi + 14 * psi / double(nd), 16 * psi / double(nd)};
            for (unsigned stage = 0; stage <= 3; ++stage)
                CHECK(states_gb(make_plan(zero_case(psi, nd, stage))) * 1e9 == doctest::Approx(expect[stage]));
        }
}

TEST_CASE("Doctor.Plan.HandComputedStatesForEachStagePrecisionAndOptimizer") {
    // Ψ = 1e9 over 8 ranks.
    plan_input in = zero_case(1e9, 8, 0);
    in.precision = "fp32";
    in.optimizer = "sgd";  // fp32 SGD with momentum: 4 + 4 + 4 bytes
    auto r = make_plan(in);
    CHECK(r.get("parameters").value == 4e9);
    CHECK(r.get("gradients").value == 4e9);
    CHECK(r.get("optimizer_states").value == 4e9);
    in.zero_stage = 2;  // gradients and optimizer states / 8
    r = make_plan(in);
    CHECK(r.get("parameters").value == 4e9);
    CHECK(r.get("gradients").value == 0.5e9);
    CHECK(r.get("optimizer_states").value == 0.5e9);
    in.precision = "bf16";
    in.optimizer = "sgd";  // mixed precision SGD: master weights 4 + momentum 4
    in.zero_stage = 1;
    r = make_plan(in);
    CHECK(r.get("parameters").value == 2e9);
    CHECK(r.get("gradients").value == 2e9);
    CHECK(r.get("optimizer_states").value == 1e9);
    in.optimizer = "adamw";
    in.zero_stage = 3;
    in.offload_optimizer = true;  // states and gradients leave the GPU; host holds the node's 8 partitions
    r = make_plan(in);
    CHECK(r.get("parameters").value == 0.25e9);
    CHECK(r.get("gradients").value == 0);
    CHECK(r.get("optimizer_states").value == 0);
    CHECK(r.get("model_states").value == 0.25e9);
    CHECK(r.get("offloaded_states").value == 16e9);  // 12 bytes of Adam state + 4 of fp32 gradient per parameter
}

TEST_CASE("Doctor.Plan.ActivationsParametersAndTheFewestRanksThatFit") {
    // GPT-2 small's shape: l = 12, h = 768, a = 12, V = 50257, s = 1024.
    plan_input in;
    in.layers = 12, in.hidden = 768, in.heads = 12, in.vocab = 50257, in.seq_len = 1024, in.micro_batch = 8;
    in.gpu_reserve = 0;
    auto r = make_plan(in);
    const double s = 1024, b = 8, h = 768, a = 12, l = 12;
    CHECK(r.params == doctest::Approx(12 * l * h * h + 13 * l * h + (50257 + s) * h));
    CHECK(r.params == doctest::Approx(124.4e6).epsilon(0.01));  // GPT-2 small, tied embeddings counted once
    CHECK(r.get("activations").value == doctest::Approx(l * s * b * h * (34 + 5 * a * s / h)));
    in.activation_checkpointing = true;
    r = make_plan(in);
    CHECK(r.get("activations").value == doctest::Approx(l * 2 * s * b * h + s * b * h * (34 + 5 * a * s / h)));

    // 7.5 B at stage 3 on 40 GiB GPUs: 16 Ψ / Nd must fit next to 10 GiB of reserve.
    plan_input z = zero_case(7.5e9, 1, 3);
    z.gpu_memory = 40 * doctor::gib;
    z.gpu_reserve = 10 * doctor::gib;
    r = make_plan(z);
    CHECK_FALSE(r.fits);
    const std::uint64_t need = r.min_ranks;
    CHECK(16 * 7.5e9 / double(need) <= 30 * doctor::gib);
    CHECK(16 * 7.5e9 / double(need - 1) > 30 * doctor::gib);
    z.gpus = need;
    CHECK(make_plan(z).fits);

    // Data side: 1 M tokens/s per GPU, 8 GPUs, text tokenized on the fly at 2 M tokens/s per worker.
    plan_input d = zero_case(1e9, 8, 1);
    d.tokens_per_s_per_gpu = 1e6;
    d.data = "text";
    d.worker_tokens_per_s = 2e6;
    r = make_plan(d);
    CHECK(r.get("tokens_per_s").value == 8e6);
    CHECK(r.get("data_workers").value == 8);       // 0.5 of a worker per GPU, but each GPU's process runs one
    CHECK(r.get("cpu_cores").value == 8 + 8 + 1);  // what check and diagnose count: GPUs x (1 + workers) + the OS
    CHECK(r.get("read_bandwidth").value == doctest::Approx(8e6 * doctor::text_bytes_per_token));
    // From a GPU's peak: 6 Ψ FLOPs per token.
    d.tokens_per_s_per_gpu = 0;
    d.gpu_tflops = 1000;
    d.mfu = 0.5;
    CHECK(make_plan(d).get("tokens_per_s").value == doctest::Approx(8 * 1000e12 * 0.5 / 6e9));
}

TEST_CASE("Doctor.Plan.BadInputNamesTheField") {
    plan_input in = zero_case(1e9, 1, 0);
    auto with = [&](auto change) {
        plan_input x = in;
        change(x);
        return field_of(x);
    };
    CHECK(with([](plan_input& x) { x.params = -5; }) == "params");
    CHECK(with([](plan_input& x) { x.params = NAN; }) == "params");
    CHECK(with([](plan_input& x) { x.params = 0; }) == "params");
    CHECK(with([](plan_input& x) { x.params = 0, x.layers = 2; }) == "hidden");
    CHECK(with([](plan_input& x) { x.params = 0, x.layers = 2, x.hidden = 100, x.heads = 3, x.vocab = 10; }) == "heads");
    CHECK(with([](plan_input& x) { x.precision = "int4"; }) == "precision");
    CHECK(with([](plan_input& x) { x.optimizer = "lion"; }) == "optimizer");
    CHECK(with([](plan_input& x) { x.zero_stage = 4; }) == "zero-stage");
    CHECK(with([](plan_input& x) { x.gpus = 0; }) == "gpus");
    CHECK(with([](plan_input& x) { x.mfu = 1.5; }) == "mfu");
    CHECK(with([](plan_input& x) { x.gpu_memory = -1; }) == "gpu-memory");
}

TEST_CASE("Doctor.Plan.AJobThatFitsNowhereGetsAVerdictWithWhatWouldFitIt") {
    // 7.5 B at stage 0 on 80 GiB GPUs: 16 Ψ = 120 GB on each, whatever their number. Not an error: the
    // plan says so and lists the changes that fit it, each evaluated.
    plan_input in = zero_case(7.5e9, 1, 0);
    in.gpu_memory = 80 * doctor::gib;
    auto r = make_plan(in);
    CHECK_FALSE(r.fits);
    CHECK(r.min_ranks == 0);
    const auto has = [&](const std::string& text) {
        return std::any_of(r.would_fit.begin(), r.would_fit.end(), [&](const std::string& w) { return w == text; });
    };
    CHECK(has("--zero-stage 1: fits on 2 data-parallel ranks or more"));  // 4 Ψ + 12 Ψ / 2 = 75 GB
    CHECK(has("--zero-stage 3: fits on 2 data-parallel ranks or more"));
    CHECK(has("--offload-optimizer --zero-stage 1: fits as planned (1 data-parallel rank)"));  // 2 Ψ = 15 GB
    CHECK(std::none_of(r.would_fit.begin(), r.would_fit.end(), [](const std::string& w) { return w.find("more GPUs") == 0; }));
    // At stage 3 on one GPU: more GPUs or offload, never "raise the ZeRO stage".
    in.zero_stage = 3;
    r = make_plan(in);
    CHECK_FALSE(r.fits);
    CHECK(r.min_ranks == 2);
    CHECK(r.would_fit.front() == "more GPUs: it fits on 2 data-parallel ranks or more (now 1)");
    CHECK(std::none_of(r.would_fit.begin(), r.would_fit.end(), [](const std::string& w) { return w.find("--zero-stage") == 0; }));
    // Activations that no setting brings under a GPU: nothing within reach, said as such.
    plan_input big;
    big.layers = 96, big.hidden = 12288, big.heads = 96, big.vocab = 50257, big.seq_len = 32768, big.micro_batch = 1;
    big.gpu_memory = 80 * doctor::gib;
    big.zero_stage = 3;
    big.offload_optimizer = true;
    big.activation_checkpointing = true;
    r = make_plan(big);
    CHECK_FALSE(r.fits);
    CHECK(r.would_fit.empty());
    // A micro-batch too large: the smaller one, with the accumulation that keeps the global batch.
    plan_input mb;
    mb.layers = 24, mb.hidden = 2048, mb.heads = 16, mb.vocab = 50257, mb.seq_len = 2048, mb.micro_batch = 64;
    mb.gpu_memory = 80 * doctor::gib;
    r = make_plan(mb);
    CHECK_FALSE(r.fits);
    CHECK(std::any_of(r.would_fit.begin(), r.would_fit.end(), [](const std::string& w) {
        return w.rfind("--micro-batch 1 (with --grad-accum x 64 to keep the global batch): fits", 0) == 0;
    }));
    CHECK(std::any_of(r.would_fit.begin(), r.would_fit.end(),
                      [](const std::string& w) { return w.rfind("--activation-checkpointing", 0) == 0; }));
}

TEST_CASE("Doctor.Plan.HostMemoryFollowsDeepSpeedsEstimator") {
    // DeepSpeed's estimate_zero2_model_states_mem_needs (stage_1_and_2.py), one node:
    //   offload:    cpu = Ψ x max(4 x GPUs, 16) x 1.5, gpu = 2 Ψ
    //   no offload: cpu = Ψ x 4 x GPUs x 1.5           (fp32 weights per process while loading)
    // The issue's case: 7 B on 3 GPUs with ZeRO-Offload, which DeepSpeed puts at 168 GB of host memory.
    for (const double psi : {1.3e9, 7e9, 70e9})
        for (const std::uint64_t gpus : {1, 3, 8}) {
            CAPTURE(psi);
            CAPTURE(gpus);
            plan_input in = zero_case(psi, gpus, 2);
            in.offload_optimizer = true;
            auto r = make_plan(in);
            CHECK(r.get("host_model_states").value == doctest::Approx(psi * std::max(4.0 * double(gpus), 16.0) * 1.5));
            CHECK(r.get("model_states").value == doctest::Approx(2 * psi));
            in.offload_optimizer = false;
            r = make_plan(in);
            CHECK(r.get("host_model_states").value == doctest::Approx(psi * 4 * double(gpus) * 1.5));
        }
    plan_input in = zero_case(7e9, 3, 2);
    in.offload_optimizer = true;
    CHECK(make_plan(in).get("host_model_states").value == doctest::Approx(168e9));
    // The host total counts it, with staging, page cache and processes.
    const auto r = make_plan(in);
    CHECK(r.get("host_memory").value == doctest::Approx(r.get("host_model_states").value + r.get("host_pinned_staging").value +
                                                        r.get("host_page_cache").value + r.get("host_processes").value));
}

TEST_CASE("Doctor.Plan.AnOffloadedOptimizerGetsTheCoresThatUpdateWithinOneStep") {
    // 7 B on 2 GPUs, ZeRO-2 with the optimizer offloaded: the node updates 7e9 parameters per step. At
    // 3000 tokens/s per GPU a step of 4 x 8 x 2048 tokens takes 21.8 s; at 1e8 parameters/s per core the
    // update needs 7e9 / (1e8 x 21.8) = 3.2 -> 4 cores, which the CPU total counts.
    plan_input in = zero_case(7e9, 2, 2);
    in.offload_optimizer = true;
    in.tokens_per_s_per_gpu = 3000;
    in.micro_batch = 4;
    in.grad_accum = 8;
    in.seq_len = 2048;
    in.cpu_adam_params_per_s = 1e8;
    auto r = make_plan(in);
    const double step = 4.0 * 8 * 2048 / 3000;
    CHECK(r.get("optimizer_cores").value == 4);
    CHECK(r.get("optimizer_cores").rule.find("--cpu-adam-params-per-s") != std::string::npos);
    CHECK(r.get("optimizer_bandwidth").value == doctest::Approx(7e9 * 30 / step));
    CHECK(r.get("cpu_cores").value == doctest::Approx(2 + r.get("data_workers").value + 4 + double(in.os_cores)));
    in.cpu_adam_params_per_s = 5e7;  // half the rate: 6.4 -> 7 cores
    CHECK(make_plan(in).get("optimizer_cores").value == 7);
    in.cpu_adam_params_per_s = 1e12;  // a fast update still has one core per GPU's process
    CHECK(make_plan(in).get("optimizer_cores").value == 2);
    // The measured default, named as such; no training rate: one per process, and it says what to give.
    in.cpu_adam_params_per_s = 0;
    CHECK(make_plan(in).get("optimizer_cores").value ==
          std::max(2.0, std::ceil(7e9 / (doctor::measured_cpu_adam_params_per_s_per_core * step))));
    CHECK(make_plan(in).get("optimizer_cores").rule.find("measured") != std::string::npos);
    in.tokens_per_s_per_gpu = 0;
    r = make_plan(in);
    CHECK(r.get("optimizer_cores").value == 2);
    CHECK(r.get("optimizer_cores").rule.find("--tokens-per-s-per-gpu") != std::string::npos);
    // Without offload nothing is updated on the host.
    in.offload_optimizer = false;
    r = make_plan(in);
    CHECK_THROWS(r.get("optimizer_cores"));
    CHECK(r.get("cpu_cores").value == doctest::Approx(2 + r.get("data_workers").value + double(in.os_cores)));
    in.cpu_adam_params_per_s = -1;
    CHECK(field_of(in) == "cpu-adam-params-per-s");
}

TEST_CASE("Doctor.Tool.JsonConfigAndExitCodes") {
    ft::scratch_dir dir;
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor plan";
    auto fits = ft::run(tool + " --params 7.5e9 --gpus 8 --nodes 8 --zero-stage 1 --gpu-memory 80GiB --json", dir);
    REQUIRE_MESSAGE(fits.code == 0, fits.err);
    const auto j = nlohmann::json::parse(fits.out);
    CHECK(j["ranks"] == 64);
    CHECK(j["fits"] == true);
    const double states = j["per_gpu"]["parameters"]["value"].get<double>() + j["per_gpu"]["gradients"]["value"].get<double>() +
                          j["per_gpu"]["optimizer_states"]["value"].get<double>();
    CHECK(states / 1e9 == doctest::Approx(31.4).epsilon(0.002));  // the paper's 7.5 B, DP 64, P_os
    CHECK(j["per_gpu"]["optimizer_states"]["rule"].get<std::string>().find("ZeRO") != std::string::npos);

    // The same from a config file; the command line overrides it.
    { std::ofstream(dir / "job.json") << R"({"params": 7.5e9, "gpus": 8, "nodes": 8, "zero-stage": 1, "gpu-memory": "80GiB"})"; }
    auto from_file = ft::run(tool + " --config " + std::string(dir / "job.json") + " --json", dir);
    REQUIRE_MESSAGE(from_file.code == 0, from_file.err);
    CHECK(nlohmann::json::parse(from_file.out)["per_gpu"] == j["per_gpu"]);
    auto short_of = ft::run(tool + " --config " + std::string(dir / "job.json") + " --gpu-memory 30GiB", dir);  // 29.2 + 1 GiB at 64 ranks
    CHECK(short_of.code == 1);  // does not fit: action needed
    CHECK(short_of.out.find("more GPUs: it fits on") != std::string::npos);
    // Parameter counts as people write them; sizes never printed as 0.00 GiB, cores never as "1 cores".
    auto words = ft::run(tool + " --params 7.5B --gpus 8 --nodes 8 --zero-stage 1 --gpu-memory 80GiB --json", dir);
    REQUIRE_MESSAGE(words.code == 0, words.err);
    CHECK(nlohmann::json::parse(words.out)["per_gpu"] == j["per_gpu"]);
    auto text = ft::run(tool + " --params 350M --gpus 1", dir);
    CHECK(text.code == 0);
    CHECK(text.out.find("0.00 GiB") == std::string::npos);
    CHECK(text.out.find(" 1 cores") == std::string::npos);
    CHECK(text.out.find("3.8 GiB") != std::string::npos);  // optimizer states: 12 x 350 M bytes
    auto suffix = ft::run(tool + " --params 7X", dir);
    CHECK(suffix.code == 2);
    CHECK(suffix.err.find("params") != std::string::npos);

    // Bad input: exit 2 with the field named.
    auto bad = ft::run(tool + " --params -5", dir);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("params") != std::string::npos);
    auto unit = ft::run(tool + " --params 1e9 --gpu-memory 80GiQ", dir);
    CHECK(unit.code == 2);
    CHECK(unit.err.find("gpu-memory") != std::string::npos);
    { std::ofstream(dir / "bad.json") << R"({"params": 1e9, "warp-drive": 3})"; }
    auto unknown = ft::run(tool + " --config " + std::string(dir / "bad.json"), dir);
    CHECK(unknown.code == 2);
    CHECK(unknown.err.find("warp-drive") != std::string::npos);
    // Fits on no number of GPUs: a verdict (exit 1, an action) with what would fit, not an input error.
    auto never = ft::run(tool + " --params 7.5e9 --gpus 1024 --gpu-memory 80GiB", dir);
    CHECK(never.code == 1);
    CHECK(never.out.find("no number of GPUs holds it") != std::string::npos);
    CHECK(never.out.find("--zero-stage 1: fits as planned (1024 data-parallel ranks)") != std::string::npos);
    auto never_json = ft::run(tool + " --params 7.5e9 --gpus 1024 --gpu-memory 80GiB --json", dir);
    CHECK(never_json.code == 1);
    CHECK(nlohmann::json::parse(never_json.out)["would_fit"].size() >= 3);
}

namespace {

std::set<std::string> codes_of(const std::string& scenario) {
    std::set<std::string> out;
    for (const auto& f : doctor::diagnose(doctor::parse_scenario(nlohmann::json::parse(scenario), "scenario.json"))) out.insert(f.code);
    return out;
}

// The field a bad scenario's error names, and its whole message.
std::pair<std::string, std::string> scenario_refusal(const std::string& scenario) {
    try {
        doctor::parse_scenario(nlohmann::json::parse(scenario), "scenario.json");
    } catch (const feedline::config_error& e) {
        return {e.field(), e.what()};
    }
    return {"(no error)", "(no error)"};
}
std::string scenario_error(const std::string& scenario) { return scenario_refusal(scenario).first; }
std::string scenario_message(const std::string& scenario) { return scenario_refusal(scenario).second; }

}  // namespace

TEST_CASE("Doctor.Diagnose.ScenariosGiveTheirFindings") {
    // The issue's example: a busy GPU with half its memory free, host RAM at 94% and swap in use,
    // micro-batch 16 x accumulation 8, no data workers, pageable copies.
    const auto first = codes_of(R"({"gpus": [{"memory_total_mib": 20480, "memory_used_mib": 9587, "utilization": 1.0}],
        "host": {"cores": 16, "ram_total_mib": 32768, "ram_used_mib": 30822, "swap_total_mib": 4096, "swap_used_mib": 2100},
        "training": {"micro_batch": 16, "grad_accum": 8, "data_workers": 0, "pinned_memory": false, "stall_fraction": null, "tokens_per_s": null}})");
    for (const char* c : {"gpu-memory-headroom", "host-memory-pressure", "swap-in-use", "no-data-workers", "pageable-copies"}) {
        CAPTURE(c);
        CHECK(first.count(c) == 1);
    }
    CHECK(first.count("data-bound") == 0);
    const auto advice =
        doctor::diagnose(doctor::parse_scenario(nlohmann::json::parse(R"({"gpus": [{"memory_total_mib": 20480, "memory_used_mib": 9587,
        "utilization": 1.0}], "training": {"micro_batch": 16, "grad_accum": 8}})"),
                                                "s"));
    REQUIRE(advice.size() == 2);  // the headroom, with the numbers, then gpu-bound (stall unknown)
    CHECK(advice[0].code == "gpu-memory-headroom");
    CHECK(advice[0].action.find("micro-batch 16 -> 32 and gradient accumulation 8 -> 4") != std::string::npos);
    CHECK(advice[1].code == "gpu-bound");

    // A busy GPU, the data side ahead, nothing else wrong: gpu-bound only, which needs no action.
    const auto busy =
        doctor::diagnose(doctor::parse_scenario(nlohmann::json::parse(R"({"gpus": [{"memory_total_mib": 81559, "memory_used_mib": 70000,
        "utilization": 0.98}], "host": {"cores": 32, "ram_total_mib": 262144, "ram_used_mib": 40000, "swap_total_mib": 0, "swap_used_mib": 0},
        "training": {"micro_batch": 8, "grad_accum": 1, "data_workers": 4, "pinned_memory": true, "stall_fraction": 0.004}})"),
                                                "s"));
    REQUIRE(busy.size() == 1);
    CHECK(busy[0].code == "gpu-bound");
    CHECK_FALSE(doctor::needs_action(busy));

    // Starved: the GPU idles while the trainer waits for data.
    CHECK(
        codes_of(R"({"gpus": [{"utilization": 0.45}], "training": {"data_workers": 2, "pinned_memory": true, "stall_fraction": 0.41}})") ==
        std::set<std::string>{"data-bound"});
    // Cores: 8 GPUs x (1 + 6 workers) + 1 for the OS = 57 > 32.
    CHECK(codes_of(R"({"gpus": [{}, {}, {}, {}, {}, {}, {}, {}], "host": {"cores": 32}, "training": {"data_workers": 6}})") ==
          std::set<std::string>{"cores-short"});
    CHECK(codes_of(R"({"process": {"rss_anon_mib": 900, "rss_file_mib": 30000}})") == std::set<std::string>{"mmap-counted-as-rss"});
    CHECK(codes_of(R"({"numa": {"gpu_node": 0, "worker_nodes": [0, 1]}})") == std::set<std::string>{"numa-remote"});
    CHECK(codes_of(R"({"numa": {"gpu_node": 1, "worker_nodes": [1, 1]}})").empty());
    CHECK(codes_of("{}").empty());  // nothing known, nothing said
}

namespace {
std::vector<doctor::finding> findings_of(const std::string& scenario) {
    return doctor::diagnose(doctor::parse_scenario(nlohmann::json::parse(scenario), "scenario.json"));
}
std::vector<std::string> ordered_codes(const std::vector<doctor::finding>& f) {
    std::vector<std::string> out;
    for (const auto& x : f) out.push_back(x.code);
    return out;
}
}  // namespace

TEST_CASE("Doctor.Diagnose.FindingsComeRankedAndWhatTheGpuBoundMakesMootIsInfoUnderIt") {
    // The issue's PyTorch user: busy GPUs, RAM at 94% and 2.1 GB of swap, 16 x 8, no workers, pageable
    // copies. Memory running out comes first, then the headroom; no workers and pinned memory are
    // moot while the GPU is the bottleneck, listed under gpu-bound as info.
    const auto f = findings_of(R"({"gpus": [{"memory_total_mib": 20480, "memory_used_mib": 7000, "utilization": 1.0}],
        "host": {"cores": 16, "ram_total_mib": 32768, "ram_used_mib": 30822, "swap_total_mib": 4096, "swap_used_mib": 2100},
        "training": {"micro_batch": 16, "grad_accum": 8, "data_workers": 0, "pinned_memory": false}})");
    CHECK(ordered_codes(f) == std::vector<std::string>{"host-memory-pressure", "swap-in-use", "gpu-memory-headroom", "gpu-bound",
                                                       "no-data-workers", "pageable-copies"});
    for (std::size_t i = 4; i < f.size(); ++i) {
        CHECK(f[i].severity == "info");
        CHECK(f[i].moot_by == "gpu-bound");
    }
    CHECK(f[0].action.find("1.9 GiB free") != std::string::npos);             // human units
    CHECK(f[0].action.find("loader worker processes") == std::string::npos);  // there are none to blame
    CHECK(f[1].action.find("2.1 GiB swapped out") != std::string::npos);
    CHECK(f[2].action.find("tokens/s, not steps/s") != std::string::npos);
    // Without the GPU bound, the same setup findings are actions, after a measured stall's.
    const auto starved = findings_of(R"({"gpus": [{"utilization": 0.5}], "host": {"ram_total_mib": 32768, "ram_used_mib": 30822},
        "training": {"data_workers": 0, "pinned_memory": false, "stall_fraction": 0.41}})");
    CHECK(ordered_codes(starved) == std::vector<std::string>{"data-bound", "host-memory-pressure", "no-data-workers", "pageable-copies"});
    REQUIRE(starved[0].gain);
    CHECK(*starved[0].gain == doctest::Approx(1 / 0.59 - 1));  // the wait removed: 1.69x the tokens/s
    CHECK(starved[2].severity == "action");
    CHECK(starved[2].action.find("free host memory first") != std::string::npos);
}

TEST_CASE("Doctor.Diagnose.HeadroomFromTheFullestGpuWhateverItsUtilization") {
    // 3 GPUs of 20 GiB at 47%, 57% and 52%: doubled, the fullest would reach 115%, so no advice (the
    // first GPU alone would have said 2x).
    CHECK(codes_of(R"({"gpus": [{"memory_total_mib": 20480, "memory_used_mib": 9587, "utilization": 1.0},
        {"memory_total_mib": 20480, "memory_used_mib": 11674, "utilization": 1.0}, {"memory_total_mib": 20480, "memory_used_mib": 10650,
        "utilization": 1.0}], "training": {"micro_batch": 16, "grad_accum": 8}})")
              .count("gpu-memory-headroom") == 0);
    // Not busy, and the fullest (GPU 1, 45%) still leaves room to double: the advice names it.
    const auto f = findings_of(R"({"gpus": [{"memory_total_mib": 100, "memory_used_mib": 40, "utilization": 0.6},
        {"memory_total_mib": 100, "memory_used_mib": 45, "utilization": 0.6}, {"memory_total_mib": 100, "memory_used_mib": 30}],
        "training": {"micro_batch": 4, "grad_accum": 4, "stall_fraction": 0.01}})");
    const auto h = std::find_if(f.begin(), f.end(), [](const auto& x) { return x.code == "gpu-memory-headroom"; });
    REQUIRE(h != f.end());
    CHECK(h->evidence["gpu"] == 1);
    CHECK(h->action.find("micro-batch 4 -> 8 and gradient accumulation 4 -> 2") != std::string::npos);
}

TEST_CASE("Doctor.Diagnose.AGpuBelowNinetyPercentGetsAnAnswer") {
    // Stall unknown: what decides the cause, and how to measure it.
    auto f = findings_of(R"({"gpus": [{"utilization": 0.45}]})");
    REQUIRE(ordered_codes(f) == std::vector<std::string>{"gpu-underused"});
    CHECK(f[0].severity == "action");
    CHECK(f[0].action.find("not known") != std::string::npos);
    CHECK(f[0].action.find("stall_fraction") != std::string::npos);
    REQUIRE(f[0].gain);
    CHECK(*f[0].gain == doctest::Approx(0.9 / 0.45 - 1));
    // The data side ahead and the CPUs idle: the GPU waits on the process itself, not on cores.
    f = findings_of(R"({"gpus": [{"utilization": 0.55}], "host": {"cpu_utilization": 0.2}, "training": {"stall_fraction": 0.01}})");
    REQUIRE(ordered_codes(f) == std::vector<std::string>{"gpu-underused"});
    CHECK(f[0].action.find("training process itself") != std::string::npos);
    CHECK(f[0].action.find("not short of cores") != std::string::npos);
    CHECK(f[0].evidence["cpu_utilization"].get<double>() == doctest::Approx(0.2));
    f = findings_of(R"({"gpus": [{"utilization": 0.55}], "host": {"cpu_utilization": 0.97}, "training": {"stall_fraction": 0.01}})");
    CHECK(f[0].action.find("short of CPU") != std::string::npos);
    // A data stall explains it: data-bound alone.
    CHECK(codes_of(R"({"gpus": [{"utilization": 0.55}], "training": {"stall_fraction": 0.2}})") == std::set<std::string>{"data-bound"});
}

TEST_CASE("Doctor.Diagnose.ModelFlopsUtilizationFromTokensParametersAndPeak") {
    const auto f = findings_of(R"({"gpus": [{"peak_tflops": 989}, {"peak_tflops": 989}], "training": {"tokens_per_s": 20000,
        "params": 7e9}})");
    REQUIRE(ordered_codes(f) == std::vector<std::string>{"mfu"});
    CHECK(f[0].evidence["mfu"].get<double>() == doctest::Approx(6 * 7e9 * 20000 / (2 * 989e12)));
    CHECK(f[0].action.find("42.5%") != std::string::npos);
    CHECK(f[0].action.find("7.0 B parameters") != std::string::npos);                                  // no scientific notation
    CHECK(codes_of(R"({"gpus": [{}], "training": {"tokens_per_s": 20000, "params": 7e9}})").empty());  // no peak: nothing said
}

TEST_CASE("Doctor.Diagnose.OtherToolsNamesGetTheRightName") {
    CHECK(scenario_message(R"({"training": {"num_workers": 2}})").find("this schema calls it training.data_workers") != std::string::npos);
    CHECK(scenario_message(R"({"training": {"pin_memory": true}})").find("training.pinned_memory") != std::string::npos);
    CHECK(scenario_message(R"({"training": {"microbatch": 4}})").find("did you mean training.micro_batch?") != std::string::npos);
    CHECK(scenario_message(R"({"gpus": [{"utilization": 95}]})").find("95% is 0.95") != std::string::npos);
    CHECK(scenario_message(R"({"host": {"cpu_utilization": 250}})").find("is a fraction in [0, 1]") != std::string::npos);
    CHECK(scenario_message(R"({"training": {"zzzzzz": 1}})").find("did you mean") == std::string::npos);  // nothing close
}

TEST_CASE("Doctor.Diagnose.BadScenariosNameTheField") {
    CHECK(scenario_error(R"({"gpus": [{"utilization": 1.5}]})") == "gpus[0].utilization");
    CHECK(scenario_error(R"({"gpus": [{"memory_total_mib": 100, "memory_used_mib": 200}]})") == "gpus[0].memory_used_mib");
    CHECK(scenario_error(R"({"host": {"ram_used_mib": -4}})") == "host.ram_used_mib");
    CHECK(scenario_error(R"({"host": {"cores": "many"}})") == "host.cores");
    CHECK(scenario_error(R"({"training": {"pinned_memory": "yes"}})") == "training.pinned_memory");
    CHECK(scenario_error(R"({"training": {"microbatch": 4}})") == "training.microbatch");
    CHECK(scenario_error(R"({"gpu": []})") == "gpu");
    CHECK(scenario_error(R"({"gpus": {}})") == "gpus");
    CHECK(scenario_error(R"([1, 2])") == "scenario");
}

TEST_CASE("Doctor.Diagnose.ToolReadsScenariosAndLogsWithExitCodes") {
    ft::scratch_dir dir;
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor diagnose ";
    {
        std::ofstream(dir / "busy.json") << R"({"gpus": [{"memory_total_mib": 81559, "memory_used_mib": 70000, "utilization": 0.98}],
            "training": {"data_workers": 4, "pinned_memory": true, "stall_fraction": 0.004}})";
        std::ofstream(dir / "starved.json") << R"({"training": {"stall_fraction": 0.4, "data_workers": 1}})";
        std::ofstream(dir / "empty.json") << "";
        std::ofstream(dir / "broken.jsonl") << "{\"step\": 1, \"stall_fraction\": 0.1}\n{not json\n";
        std::ofstream(dir / "unknown.json") << R"({"training": {"stal_fraction": 0.4}})";
    }
    auto busy = ft::run(tool + std::string(dir / "busy.json") + " --json", dir);
    CHECK(busy.code == 0);
    const auto j = nlohmann::json::parse(busy.out);
    REQUIRE(j["findings"].size() == 1);
    CHECK(j["findings"][0]["code"] == "gpu-bound");
    CHECK(j["findings"][0]["evidence"]["gpu_utilization"].get<double>() == doctest::Approx(0.98));
    auto starved = ft::run(tool + std::string(dir / "starved.json"), dir);
    CHECK(starved.code == 1);
    CHECK(starved.out.find("data-bound [action]") != std::string::npos);
    for (const char* bad : {"empty.json", "broken.jsonl", "unknown.json", "missing.json"}) {
        CAPTURE(bad);
        auto r = ft::run(tool + std::string(dir / bad), dir);
        CHECK(r.code == 2);
        CHECK(r.err.find(bad) != std::string::npos);
    }
    CHECK(ft::run(tool + std::string(dir / "broken.jsonl"), dir).err.find("line 2") != std::string::npos);
    CHECK(ft::run(tool + std::string(dir / "unknown.json"), dir).err.find("training.stal_fraction") != std::string::npos);
}

namespace {

std::string fixture_root(const char* name) { return std::string(FEEDLINE_SOURCE_DIR) + "/tests/fixtures/topology/" + name; }

std::set<std::string> codes(const std::vector<doctor::finding>& findings) {
    std::set<std::string> out;
    for (const auto& f : findings) out.insert(f.code);
    return out;
}

}  // namespace

TEST_CASE("Doctor.Check.FixtureMachinesGiveTheirFindings") {
    // A 2-socket server with 8 GPUs, one of whose links trained at x8: that link, and the NUMA layout.
    const auto server = doctor::read_machine(fixture_root("two_socket_8gpu"));
    CHECK(server.gpus.size() == 8);
    const auto s = doctor::check(server);
    CHECK(codes(s) == std::set<std::string>{"numa-nodes", "pcie-link-narrow"});
    for (const auto& f : s)
        if (f.code == "pcie-link-narrow") CHECK(f.evidence["gpu"] == "0000:ab:00.0");
    // A 2-vCPU VM (one core's two threads) with swap in use: short of cores, swap, no GPU.
    const auto vm = doctor::read_machine(fixture_root("vm_1node"));
    CHECK(codes(doctor::check(vm)) ==
          std::set<std::string>{"cores-short", "smt-siblings", "no-gpu", "swap-in-use", "swappiness-high", "memlock-low"});
    // Its 2 cores hold the trainer and the one worker feedline starts, short only of the OS's core:
    // info, as a small machine is what it is. Asking for 2 workers there is short for real.
    auto severity_of = [](const std::vector<doctor::finding>& f, const char* code) {
        for (const auto& x : f)
            if (x.code == code) return x.severity;
        return std::string("(none)");
    };
    CHECK(severity_of(doctor::check(vm), "cores-short") == "info");
    CHECK(severity_of(doctor::check(vm, {.workers_per_gpu = 2}), "cores-short") == "action");
    // A container: 1.5 CPUs of quota on 8 CPUs of affinity, 4 GiB of a 64 GiB host, io_uring off by sysctl.
    const auto box = doctor::read_machine(fixture_root("container_cgroup"));
    CHECK(box.io_uring_unavailable.has_value());
    CHECK(codes(doctor::check(box)) == std::set<std::string>{"cgroup-cpu-quota", "cores-short", "smt-siblings", "pcie-link-slow",
                                                             "cgroup-memory-limit", "memlock-low", "thp-always", "io-uring-unavailable"});
}

TEST_CASE("Doctor.Check.TheJobsSizeAndWhatNvmlReportsChangeTheFindings") {
    auto server = doctor::read_machine(fixture_root("two_socket_8gpu"));
    // 8 GPUs x (8 workers + 1) + 1 = 73 cores of 64.
    CHECK(codes(doctor::check(server, {.gpus = 8, .workers_per_gpu = 8})).count("cores-short") == 1);
    CHECK(codes(doctor::check(server, {.gpus = 8, .workers_per_gpu = 6})).count("cores-short") == 0);
    // Another process holds 30% of a GPU before the job.
    server.gpus[2].nvml = feedline::gpu_reading{.name = "H100",
                                                .pci_bus_id = server.gpus[2].where.pci_bus_id,
                                                .memory_total = 80ull << 30,
                                                .memory_used = 24ull << 30,
                                                .utilization = 0};
    server.gpus[3].nvml = feedline::gpu_reading{.memory_total = 80ull << 30, .memory_used = 1ull << 30};
    std::vector<doctor::finding> held;
    for (const auto& f : doctor::check(server))
        if (f.code == "gpu-memory-in-use") held.push_back(f);
    REQUIRE(held.size() == 1);
    CHECK(held[0].evidence["gpu"] == server.gpus[2].where.pci_bus_id);
    CHECK(held[0].evidence["memory_used_mib"] == 24 * 1024);
    // The affinity mask leaves out the CPUs of the second socket's GPUs.
    server.topo.allowed_cpus = server.topo.nodes[0].cpus;
    std::set<std::string> remote;
    for (const auto& f : doctor::check(server))
        if (f.code == "gpu-cpus-outside-affinity") remote.insert(f.evidence["gpu"].get<std::string>());
    CHECK(remote == std::set<std::string>{"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"});
}

TEST_CASE("Doctor.Check.OnlyTheGpusThisProcessCanUseCount") {
    // sysfs lists the machine's 8 GPUs whatever this process may use; read_machine marks the ones it
    // can (CUDA's list, else NVML's), and no rule looks at the others.
    auto server = doctor::read_machine(fixture_root("two_socket_8gpu"));
    auto gpus_in = [](const std::vector<doctor::finding>& fs, const char* code) {
        for (const auto& f : fs)
            if (f.code == code) return f.evidence["gpus"].get<int>();
        return -1;
    };
    REQUIRE(server.gpus.size() == 8);
    CHECK(gpus_in(doctor::check(server, {.workers_per_gpu = 9}), "cores-short") == 8);  // 8 x 10 + 1 > 64
    for (auto& g : server.gpus) g.visible = g.where.pci_bus_id != "0000:ab:00.0";       // the x8 one is another job's
    auto fs = doctor::check(server, {.workers_per_gpu = 9});
    CHECK(codes(fs).count("pcie-link-narrow") == 0);
    CHECK(gpus_in(fs, "cores-short") == 7);  // 7 x 10 + 1 = 71 > 64
    for (const auto& f : fs)
        if (f.code == "numa-nodes") CHECK_FALSE(f.evidence["gpu_nodes"].contains("0000:ab:00.0"));

    // CUDA's count wins where CUDA answered; CUDA_VISIBLE_DEVICES caps the count where it did not.
    server.cuda_devices = 2;
    CHECK(gpus_in(doctor::check(server, {.workers_per_gpu = 40}), "cores-short") == 2);  // 2 x 41 + 1 > 64
    server.cuda_devices = -1;
    server.cuda_visible_devices = 1;
    CHECK(gpus_in(doctor::check(server, {.workers_per_gpu = 80}), "cores-short") == 1);  // 81 + 1 > 64

    // All hidden: no GPU for this job, and it says the machine has some.
    for (auto& g : server.gpus) g.visible = false;
    fs = doctor::check(server);
    REQUIRE(codes(fs).count("no-gpu") == 1);
    for (const auto& f : fs)
        if (f.code == "no-gpu") {
            CHECK(f.evidence["hidden_gpus"] == 8);
            CHECK(f.action.find("none usable by this process") != std::string::npos);
        }
    CHECK(codes(fs).count("pcie-link-narrow") == 0);
}

TEST_CASE("Doctor.Check.ToolOnFixturesTheLiveMachineAndAMeasuredDataset") {
    ft::scratch_dir dir;
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor check ";
    auto server = ft::run(tool + "--json --root " + fixture_root("two_socket_8gpu"), dir);
    CHECK(server.code == 1);  // the x8 link needs action
    const auto j = nlohmann::json::parse(server.out);
    CHECK(j["machine"]["usable_cores"].get<double>() == 64);
    CHECK(j["machine"]["numa_nodes"].size() == 2);
    CHECK(j["machine"]["gpus"].size() == 8);
    CHECK(j["machine"]["swap_total_bytes"].get<double>() == 0);
    CHECK(ft::run(tool + "--root " + std::string(dir / "nope"), dir).code == 2);
    CHECK(ft::run(tool + "--root " + fixture_root("vm_1node") + " --data x", dir).code == 2);

    // The live machine, measured on real shards: every backend reads, the pipeline delivers with 1 worker.
    std::mt19937 rng(5);
    for (int k = 0; k < 2; ++k) {
        feedline::megatron_writer w(dir / ("part_" + std::to_string(k)), feedline::token_dtype::int32);
        for (int d = 0; d < 400; ++d) {
            std::vector<std::uint32_t> t(500 + rng() % 1000);
            for (auto& x : t) x = rng() % 50000;
            w.add_document(t);
        }
        w.finish();
    }
    auto live = ft::run(tool + "--json --seconds 0.3 --max-workers 2 --seq-len 256 --data '1 " + std::string(dir / "part_0") + " 1 " +
                            std::string(dir / "part_1") + "'",
                        dir);
    REQUIRE_MESSAGE(live.code != 2, live.err);
    const auto m = nlohmann::json::parse(live.out);
    CHECK(m["machine"]["usable_cores"].get<double>() > 0);
    CHECK(m["data"]["reads"]["files"] == 2);
    for (const char* b : {"pread", "mmap"}) {
        CAPTURE(b);
        CHECK(m["data"]["reads"][b]["warm_bytes_per_s"].get<double>() > 0);
        CHECK(m["data"]["reads"][b]["cold_bytes_per_s"].get<double>() > 0);
    }
    const auto& rows = m["data"]["pipeline"];
    REQUIRE(rows.size() == 2);
    CHECK(rows[0]["workers"] == 1);
    CHECK(rows[1]["workers"] == 2);
    for (const auto& r : rows) CHECK(r["batches"].get<double>() > 0);
    CHECK(m["data"]["reads"]["whole_dataset"] == true);
    if (m["data"].contains("pipeline_gpu")) CHECK(m["data"]["pipeline_gpu"]["batches"].get<double>() > 0);  // only where a GPU is
}

TEST_CASE("Doctor.Diagnose.LogTelemetryAndPipelineStatsLines") {
    // Trainer progress lines with NVML and memory telemetry: a busy GPU at 40% memory, accumulation 8.
    std::istringstream trainer(
        "feedline-train: a start line in text\n"
        R"({"step": 10, "stall_fraction": 0.001, "tokens_per_s": 5e5, "micro_batch": 4, "grad_accum": 8, "data_workers": 2, "gpu_utilization": 0.97,)"
        R"( "gpu_memory_used_bytes": 34359738368, "gpu_memory_total_bytes": 85899345920, "host_ram_total_bytes": 1e11, "host_ram_available_bytes": 5e9,)"
        R"( "swap_total_bytes": 0, "swap_used_bytes": 0, "rss_anon_bytes": 1e9, "rss_file_bytes": 4e9})"
        "\n");
    const auto t = doctor::parse_log(trainer, "train.log");
    REQUIRE(t.gpus.size() == 1);
    CHECK(*t.gpus[0].utilization == doctest::Approx(0.97));
    CHECK(*t.ram_used_mib == doctest::Approx(95e9 / 1048576));
    CHECK(codes(doctor::diagnose(t)) ==
          std::set<std::string>{"gpu-bound", "gpu-memory-headroom", "host-memory-pressure", "mmap-counted-as-rss"});

    // A pipeline's stats_jsonl: the last line counts (its stall is cumulative); workers are the data workers.
    std::istringstream stats(
        R"({"unix_time": 1.0, "batches": 10, "stall_fraction": 0.9, "tokens_per_s": 1, "workers": 1})"
        "\n"
        R"({"unix_time": 2.0, "batches": 20, "stall_fraction": 0.3, "tokens_per_s": 1, "workers": 0, "rss_anon_bytes": 1, "rss_file_bytes": 2})"
        "\n");
    const auto p = doctor::parse_log(stats, "stats.jsonl");
    CHECK(*p.stall_fraction == doctest::Approx(0.3));
    CHECK(*p.data_workers == 0);
    CHECK(codes(doctor::diagnose(p)) == std::set<std::string>{"data-bound", "no-data-workers"});
    // Two pipelines of one process in one log (a trainer's and, later, its evaluation's): the line with
    // the most batches is the training run's, wherever it stands.
    std::istringstream shared(R"({"unix_time": 1.0, "batches": 200, "stall_fraction": 0.02, "tokens_per_s": 9, "workers": 4})"
                              "\n"
                              R"({"unix_time": 2.0, "batches": 20, "stall_fraction": 0.8, "tokens_per_s": 1, "workers": 1})"
                              "\n");
    const auto both = doctor::parse_log(shared, "stats.jsonl");
    CHECK(*both.stall_fraction == doctest::Approx(0.02));
    CHECK(*both.data_workers == 4);
    // Their option lines name two batch sizes: neither is taken as the micro-batch, and a note says why.
    std::istringstream headers(R"({"unix_time": 1.0, "options": {"batch_size": 32}})"
                               "\n"
                               R"({"unix_time": 1.5, "options": {"batch_size": 8}})"
                               "\n"
                               R"({"unix_time": 2.0, "batches": 20, "stall_fraction": 0.1, "tokens_per_s": 1, "workers": 1})"
                               "\n");
    const auto two = doctor::parse_log(headers, "stats.jsonl");
    CHECK_FALSE(two.micro_batch);
    REQUIRE(two.notes.size() == 1);
    CHECK(two.notes[0].find("several batch sizes") != std::string::npos);

    // Remote data: a stall with requests in flight is the store's latency; many retries say it pushes back.
    std::istringstream remote(
        R"({"unix_time": 1.0, "batches": 20, "stall_fraction": 0.4, "tokens_per_s": 1, "workers": 2, "remote_requests": 1000,)"
        R"( "remote_retries": 40, "remote_latency_p50_s": 0.064})"
        "\n");
    const auto r = doctor::parse_log(remote, "stats.jsonl");
    const auto found = doctor::diagnose(r);
    CHECK(codes(found) == std::set<std::string>{"data-bound", "remote-bound", "remote-retries"});
    for (const auto& f : found)
        if (f.code == "remote-bound") CHECK(f.action.find("64 ms") != std::string::npos);

    // Files past the mapping budget (vm.max_map_count) are read with pread: the stats line says how many.
    std::istringstream unmapped(
        R"({"unix_time": 1.0, "batches": 20, "stall_fraction": 0.001, "tokens_per_s": 1, "workers": 2, "unmapped_files": 5285})"
        "\n");
    const auto u = doctor::parse_log(unmapped, "stats.jsonl");
    REQUIRE(u.unmapped_files.has_value());
    const auto unmapped_found = doctor::diagnose(u);
    CHECK(codes(unmapped_found) == std::set<std::string>{"files-unmapped"});
    for (const auto& f : unmapped_found)
        if (f.code == "files-unmapped") CHECK(f.action.find("5285 of the data's files") != std::string::npos);

    // A GPU ring that could not pin (pinned_bytes 0) copies from pageable memory; one that pinned does not.
    std::istringstream unpinned(
        R"json({"summary": true, "stall_fraction": 0, "pipeline": {"device": "pinned ring on CUDA device 0: 4 slots x 1 MiB, pageable (x)", "pinned_bytes": 0}})json");
    CHECK(codes(doctor::diagnose(doctor::parse_log(unpinned, "u.log"))) == std::set<std::string>{"pageable-copies"});
    std::istringstream pinned(
        R"({"summary": true, "stall_fraction": 0, "pipeline": {"device": "pinned ring on CUDA device 0: 4 slots x 1 MiB, pinned", "pinned_bytes": 4194304}})");
    CHECK(codes(doctor::diagnose(doctor::parse_log(pinned, "p.log"))).empty());

    // Bad telemetry names the line and the field.
    std::istringstream bad("{\"step\": 1, \"stall_fraction\": 0.1, \"gpu_utilization\": 3}\n");
    try {
        doctor::parse_log(bad, "x.log");
        FAIL("accepted a utilization of 3");
    } catch (const feedline::format_error& e) {
        CHECK(std::string(e.what()).find("line 1: gpu_utilization") != std::string::npos);
    }
    std::istringstream inverted(R"({"summary": true, "stall_fraction": 0, "host_ram_total_bytes": 1, "host_ram_available_bytes": 2})");
    CHECK_THROWS_AS(doctor::parse_log(inverted, "x.log"), feedline::format_error);
}

namespace {

// A real pipeline over a small dataset with a stats log every 10 batches into `device`; its log's
// path, and (in `last`) its last line. Every batch is checked to be where `device` says.
std::string run_with_stats_log(const ft::scratch_dir& dir, const std::string& device, nlohmann::json& last) {
    feedline::megatron_writer w(dir / "d", feedline::token_dtype::int32);
    for (int d = 0; d < 200; ++d) w.add_document(std::vector<std::uint32_t>(300, static_cast<std::uint32_t>(d)));
    w.finish();
    feedline::pipeline_config c{.batch_size = 4, .seq_len = 64, .workers = 1, .device = feedline::parse_device(device), .max_steps = 30};
    c.stats_every = 10;
    c.stats_jsonl = dir / "stats.jsonl";
    {
        feedline::pipeline p(std::string(dir / "d"), c);
        for (auto& b : p) CHECK(b.on_device() == (device != "cpu"));
    }
    std::ifstream in(c.stats_jsonl);
    std::string line, text;
    while (std::getline(in, line)) text = line;
    last = nlohmann::json::parse(text);
    return c.stats_jsonl;
}

}  // namespace

TEST_CASE("Doctor.Diagnose.ARealPipelinesStatsLogCarriesItsTelemetry") {
    ft::scratch_dir dir;
    nlohmann::json j;
    const std::string log = run_with_stats_log(dir, "cpu", j);
    CHECK(j["host_ram_total_bytes"].get<double>() > 0);
    CHECK(j["rss_anon_bytes"].get<double>() > 0);
    CHECK(j.contains("rss_file_bytes"));
    CHECK_FALSE(j.contains("gpu_utilization"));  // host memory, no GPU: absent, not zero
    CHECK_FALSE(j.contains("gpu_telemetry"));
    std::ifstream again(log);
    const auto o = doctor::parse_log(again, log);
    CHECK(*o.data_workers == 1);
    CHECK(*o.micro_batch == 4);  // from the log's first line, the options the run was given
    CHECK(o.ram_total_mib.has_value());
    CHECK(o.rss_anon_mib.has_value());
    CHECK(o.gpus.empty());
}

// A real mixture run's stats log against its mixture file: every domain within one sample of its
// target; against an edited file, the domains off are named and the exit status asks for action; a
// run whose weights were set during the run cannot be checked from step 0 and says so; a file of
// other domains, or a scenario, is refused.
TEST_CASE("Doctor.Diagnose.AMixtureRunsDomainTotalsAreCheckedAgainstItsSchedule") {
    ft::scratch_dir dir;
    for (const char* name : {"web", "code"}) {
        feedline::megatron_writer w(dir / name, feedline::token_dtype::int32);
        for (int d = 0; d < 150; ++d) w.add_document(std::vector<std::uint32_t>(200, static_cast<std::uint32_t>(d)));
        w.finish();
    }
    auto mixture = [&](const std::string& file, const std::string& second, const std::string& stages) {
        std::ofstream(dir / file) << R"({"domains": [{"name": "web", "data": "web"}, {"name": ")" << second
                                  << R"(", "data": "code"}], "stages": [)" << stages << "]}";
    };
    mixture("mix.json", "code",
            R"({"at_step": 0, "weights": {"web": 3, "code": 1}}, {"at_step": 10, "ramp_steps": 5, "weights": {"web": 1, "code": 2}})");
    mixture("edited.json", "code", R"({"at_step": 0, "weights": {"web": 1, "code": 1}})");
    mixture("other.json", "books", R"({"at_step": 0, "weights": {"web": 1, "books": 1}})");
    auto run = [&](const std::string& log, bool set_weights) {
        feedline::pipeline_config c{.batch_size = 4,
                                    .seq_len = 64,
                                    .workers = 2,
                                    .device = feedline::device_kind::cpu,
                                    .rank = 0,
                                    .world_size = 1,
                                    .max_steps = 40};
        c.stats_every = 10;
        c.stats_jsonl = dir / log;
        feedline::pipeline p(std::string(dir / "mix.json"), c);
        if (log == "at_start.jsonl") p.set_mixture_weights({1, 1}, 0);  // in force from step 0: the file's schedule never was
        int k = 0;
        for (auto& b : p) {
            (void)b;
            if (set_weights && ++k == 3) p.set_mixture_weights({1, 1}, p.state().step + p.planning_horizon());
        }
    };
    run("mixed.jsonl", false);
    run("online.jsonl", true);
    run("at_start.jsonl", false);
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor diagnose ";
    // The findings by code. The exit status is 1 when any finding asks for action: mixture-off-schedule,
    // and data-bound too when this test's consumer outran its workers (timing), so only 0 or 1 is checked
    // for the others, and their mixture finding's severity.
    auto findings = [&](const std::string& log, const std::string& file, int code) {
        auto r = ft::run(tool + std::string(dir / log) + " --mixture " + std::string(dir / file) + " --json", dir);
        CAPTURE(r.out);
        CAPTURE(r.err);
        CHECK((code == 1 ? r.code == 1 : (r.code == 0 || r.code == 1)));
        const auto out = nlohmann::json::parse(r.out);
        std::map<std::string, nlohmann::json> by_code;
        for (const auto& f : out["findings"]) by_code[f["code"].get<std::string>()] = f;
        return by_code;
    };
    auto on = findings("mixed.jsonl", "mix.json", 0);
    REQUIRE(on.count("mixture-on-schedule"));
    CHECK(on["mixture-on-schedule"]["severity"] == "info");
    CHECK(on["mixture-on-schedule"]["evidence"]["samples"] == 160);
    CHECK(on["mixture-on-schedule"]["evidence"]["global_batch"] == 4);
    CHECK(on["mixture-on-schedule"]["evidence"]["largest_difference"].get<double>() < 1.0);
    auto off = findings("mixed.jsonl", "edited.json", 1);
    REQUIRE(off.count("mixture-off-schedule"));
    CHECK(off["mixture-off-schedule"]["severity"] == "action");
    CHECK(off["mixture-off-schedule"]["evidence"]["domains_off"] == 2);
    auto changed = findings("online.jsonl", "mix.json", 0);
    REQUIRE(changed.count("mixture-changed"));
    CHECK(changed["mixture-changed"]["evidence"]["mixture_from_step"].get<double>() > 3);
    auto at_start = findings("at_start.jsonl", "mix.json", 0);
    REQUIRE(at_start.count("mixture-changed"));
    CHECK(at_start["mixture-changed"]["evidence"]["mixture_weights_set"] == true);
    auto other = ft::run(tool + std::string(dir / "mixed.jsonl") + " --mixture " + std::string(dir / "other.json"), dir);
    CHECK(other.code == 2);
    CHECK(other.err.find("books") != std::string::npos);
    std::ofstream(dir / "scenario.json") << R"({"training": {"stall_fraction": 0.4}})";
    CHECK(ft::run(tool + std::string(dir / "scenario.json") + " --mixture " + std::string(dir / "mix.json"), dir).code == 2);
}

// The same on a GPU, where the stats lines add NVML's figures for the ring's device (skipped without one).
TEST_CASE("Doctor.Diagnose.OnAGpuThePipelinesStatsLogCarriesNvmlTelemetry") {
    if (!feedline::gpu_probe()) ft::skip(feedline::gpu_probe().reason);
    ft::scratch_dir dir;
    nlohmann::json j;
    const std::string log = run_with_stats_log(dir, "auto", j);  // the sampler's first reading is taken when it starts
    CHECK(j["pinned_bytes"].get<double>() > 0);
    const auto& nv = feedline::nvml::get();
    if (!nv.available()) {
        CHECK(j["gpu_telemetry"] == nv.reason());  // says why, and no figures
        CHECK_FALSE(j.contains("gpu_memory_used_bytes"));
        return;
    }
    REQUIRE(j["gpu_telemetry"] == "nvml");
    const double used = j["gpu_memory_used_bytes"].get<double>(), total = j["gpu_memory_total_bytes"].get<double>();
    CHECK(used > 0);  // at least this process's context and ring
    CHECK(used < total);
    if (j.contains("gpu_utilization")) {
        CHECK(j["gpu_utilization"].get<double>() >= 0);
        CHECK(j["gpu_utilization"].get<double>() <= 1);
    }
    std::ifstream again(log);
    const auto o = doctor::parse_log(again, log);
    REQUIRE(o.gpus.size() == 1);
    CHECK(*o.gpus[0].memory_total_mib == doctest::Approx(total / 1048576));
}

// On a GPU with NVIDIA's driver: check reads the GPU through the real NVML and measures the copies
// (skipped without one).
TEST_CASE("Doctor.Check.OnAGpuNvmlAndTheCopiesAreMeasured") {
    const auto gpu = feedline::gpu_probe();
    if (!gpu) ft::skip(gpu.reason);
    ft::scratch_dir dir;
    auto r = ft::run(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor check --json --h2d", dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    MESSAGE(r.out);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["machine"]["cuda_devices"] == gpu.devices);
    const auto& h2d = j["h2d"];
    REQUIRE_MESSAGE(h2d.contains("pinned_bytes_per_s"), h2d.dump());
    CHECK(h2d["pinned_bytes_per_s"].get<double>() > 1e9);  // any PCIe link moves more than 1 GB/s
    CHECK(h2d["pageable_bytes_per_s"].get<double>() > 0);
    if (!feedline::nvml::get().available()) return;
    CHECK(j["machine"]["gpu_source"] == "nvml; cuda");
    int visible = 0;
    for (const auto& g : j["machine"]["gpus"]) {
        if (!g["visible"].get<bool>()) continue;
        ++visible;
        CHECK_FALSE(g["name"].get<std::string>().empty());
        CHECK(g["pci_bus_id"].get<std::string>().size() >= 12);
        if (!g["mig"].get<bool>()) CHECK(g["memory_total_bytes"].get<double>() > 1e9);
    }
    CHECK(visible == gpu.devices);  // CUDA's devices, matched to sysfs and NVML by PCI address
}

TEST_CASE("Doctor.Watch.SeesACommandsCpuItsChildProcessesAndItsMemoryAndWritesTheScenario") {
    ft::scratch_dir dir;
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor watch --json --interval 0.05";
    // A CPU-bound loop, stopped (SIGTERM) when --seconds runs out: one core of the tree's, busy.
    auto busy = ft::run(tool + " --seconds 1.5 -- sh -c 'while :; do :; done'", dir);
    REQUIRE_MESSAGE(busy.code != 2, busy.err);
    auto j = nlohmann::json::parse(busy.out);
    CHECK(j["watched"]["tree_cpu_cores"].get<double>() > 0.5);
    CHECK(j["watched"]["samples"].get<double>() >= 5);
    CHECK(j["watched"]["tree_locked_mib_peak"].get<double>() == 0);  // a shell loop locks nothing
    CHECK(j["scenario"]["host"]["cpu_utilization"].get<double>() > 0.2);
    CHECK(j["scenario"]["training"]["data_workers"].is_null());  // no child process: unknown, not 0
    // A trainer-like process with two loader child processes, growing its own memory to ~200 MiB and
    // locking 4 MiB (as pinned staging would); whether mlock was allowed is written to a file. The
    // system's python3 by its path: one found on PATH may be a shim that runs shells (more processes).
    const std::string grow =
        "/usr/bin/python3 -I -c \"import ctypes, mmap, subprocess, time\n"
        "kids = [subprocess.Popen(['sleep', '1.5']) for _ in range(2)]\n"
        "m = mmap.mmap(-1, 4 << 20); b = (ctypes.c_char * (4 << 20)).from_buffer(m)\n"
        "open('" +
        (dir / "mlock") +
        "', 'w').write(str(ctypes.CDLL(None).mlock(ctypes.addressof(b), 4 << 20)))\n"
        "a = []\n"
        "for _ in range(10): a.append(bytearray(20 << 20)); time.sleep(0.05)\n"
        "[k.wait() for k in kids]\"";
    auto grown = ft::run(tool + " --scenario " + (dir / "seen.json") + " -- " + grow, dir);
    REQUIRE_MESSAGE(grown.code != 2, grown.err);
    j = nlohmann::json::parse(grown.out);
    CHECK(j["watched"]["processes_peak"] == 3);
    CHECK(j["scenario"]["training"]["data_workers"] == 2);
    CHECK(j["scenario"]["process"]["rss_anon_mib"].get<double>() >= 150);
    if (ft::read_text(dir / "mlock") == "0") CHECK(j["watched"]["tree_locked_mib_peak"].get<double>() >= 3.9);
    CHECK(j["scenario"]["host"]["ram_used_mib"].get<double>() <= j["scenario"]["host"]["ram_total_mib"].get<double>());
    // The scenario it wrote is what diagnose reads: the same findings.
    auto again = ft::run(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor diagnose --json " + (dir / "seen.json"), dir);
    REQUIRE_MESSAGE(again.code != 2, again.err);
    CHECK(nlohmann::json::parse(again.out)["findings"] == j["findings"]);
    // Bad use: neither or both of --pid and a command, a pid that is not there, a command that is not.
    for (const std::string& args :
         {std::string(""), std::string("--pid 1 -- true"), std::string("--pid 999999999"), std::string("-- /nonexistent/trainer")}) {
        CAPTURE(args);
        auto r = ft::run(tool + " " + args, dir);
        CHECK(r.code == 2);
        CHECK_FALSE(r.err.empty());
    }
}

TEST_CASE("Doctor.Watch.ReadsTheStatsLinesOfTheFeedlinePipelinesItWatches") {
    // A command's feedline pipelines log their stats to a file of watch's own (FEEDLINE_STATS_JSONL):
    // watch reports the stall the loop measured, tokens/s, the batch and the worker threads (which /proc
    // cannot tell from the trainer's), and removes the file. A process watched by pid is read through
    // --log, a file watch leaves alone.
    ft::scratch_dir dir;
    {
        feedline::megatron_writer w(dir / "data", feedline::token_dtype::uint16);
        std::mt19937 rng(5);
        for (int d = 0; d < 400; ++d) {
            std::vector<std::uint32_t> t(50 + rng() % 300);
            for (auto& x : t) x = rng() % 1000;
            w.add_document(t);
        }
        w.finish();
    }
    const std::string iterate = std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate " + (dir / "data") +
                                " --batch-size 8 --seq-len 64 --workers 2 --max-steps 3000 --stats-every 50 > /dev/null";
    const std::string tool = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor watch --json --interval 0.05";
    auto r = ft::run(tool + " --scenario " + (dir / "seen.json") + " -- sh -c '" + iterate + "'", dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    auto j = nlohmann::json::parse(r.out);
    REQUIRE_MESSAGE(j["watched"].contains("feedline_log"), r.out);
    CHECK_FALSE(std::filesystem::exists(j["watched"]["feedline_log"].get<std::string>()));
    const auto& training = j["scenario"]["training"];
    REQUIRE(training["stall_fraction"].is_number());
    CHECK(training["stall_fraction"].get<double>() <= 1);
    CHECK(training["tokens_per_s"].get<double>() > 0);
    CHECK(training["micro_batch"] == 8);
    CHECK(training["data_workers"] == 2);  // the log's worker threads, not the tree's one child process
    auto again = ft::run(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor diagnose --json " + (dir / "seen.json"), dir);
    REQUIRE_MESSAGE(again.code != 2, again.err);
    CHECK(nlohmann::json::parse(again.out)["findings"] == j["findings"]);

    // By pid, with the run's own log named.
    const std::string log = dir / "own.jsonl";
    const std::string script = "FEEDLINE_STATS_JSONL=" + log + " " + iterate;
    pid_t pid = 0;
    char* const argv[] = {const_cast<char*>("sh"), const_cast<char*>("-c"), const_cast<char*>(script.c_str()), nullptr};
    REQUIRE(::posix_spawnp(&pid, "sh", nullptr, nullptr, argv, environ) == 0);
    r = ft::run(tool + " --log " + log + " --pid " + std::to_string(pid), dir);
    ::waitpid(pid, nullptr, 0);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    j = nlohmann::json::parse(r.out);
    CHECK(j["watched"]["feedline_log"] == log);
    CHECK(std::filesystem::exists(log));
    CHECK(j["scenario"]["training"]["stall_fraction"].is_number());
    CHECK(j["scenario"]["training"]["micro_batch"] == 8);
    // --log wins over a FEEDLINE_STATS_JSONL watch inherits: the command gets that one only.
    const std::string chosen = dir / "chosen.jsonl";
    r = ft::run("FEEDLINE_STATS_JSONL=" + (dir / "inherited.jsonl") + " " + tool + " --log " + chosen + " -- sh -c '" + iterate + "'", dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    j = nlohmann::json::parse(r.out);
    CHECK(j["watched"]["feedline_log"] == chosen);
    CHECK(j["scenario"]["training"]["stall_fraction"].is_number());
    CHECK_FALSE(std::filesystem::exists(dir / "inherited.jsonl"));
    // A log that is not one is reported, and the watch's own figures stand.
    ft::write_text(dir / "not-a-log", "{\"hello\": 1}\n");
    r = ft::run(tool + " --log " + (dir / "not-a-log") + " -- true", dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    j = nlohmann::json::parse(r.out);
    CHECK(j["watched"].contains("feedline_log_error"));
    CHECK(j["scenario"]["training"]["stall_fraction"].is_null());
}

TEST_CASE("Doctor.Watch.AProcessThatLeavesTheGpuIdleIsGpuUnderusedWithTheWayToMeasureWhy") {
    // A process that does nothing (a trainer starved by a slow reader looks the same from outside: its
    // CPUs idle, the GPU at the stand-in's 37%), watched by pid, with NVML through the stand-in.
    ft::scratch_dir dir;
    pid_t pid = 0;
    char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("20"), nullptr};
    REQUIRE(::posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ) == 0);
    auto r = ft::run(std::string("LD_LIBRARY_PATH=") + FEEDLINE_FAKE_NVML_DIR + " " + FEEDLINE_BIN_DIR +
                         "/feedline-doctor watch --json --seconds 1 --interval 0.1 --pid " + std::to_string(pid),
                     dir);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    CHECK(r.code == 1);  // an action: the GPU is underused
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["watched"]["pid"] == pid);
    CHECK(j["watched"]["tree_cpu_cores"].get<double>() < 0.2);
    REQUIRE(j["scenario"]["gpus"].size() == 1);  // the stand-in's MIG GPU gives nothing to sample
    CHECK(j["scenario"]["gpus"][0]["utilization"].get<double>() == doctest::Approx(0.37));
    REQUIRE(j["findings"].size() >= 1);
    CHECK(j["findings"][0]["code"] == "gpu-underused");
    CHECK(j["findings"][0]["action"].get<std::string>().find("stall_fraction") != std::string::npos);
}

TEST_CASE("Doctor.Check.GpusThroughNvml") {
    // NVML as the driver ships it (libnvidia-ml.so.1, opened at run time), here a stand-in describing two
    // GPUs (tests/support/fake_nvml.cpp): one with 24 of 80 GiB held by another process, one in MIG mode
    // that gives this process neither utilization nor memory. It finds GPUs by bus id only in NVML's
    // own spelling, so the tool's sysfs spelling goes through the fallback.
    ft::scratch_dir dir;
    auto r =
        ft::run(std::string("LD_LIBRARY_PATH=") + FEEDLINE_FAKE_NVML_DIR + " " + FEEDLINE_BIN_DIR + "/feedline-doctor check --json", dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["machine"]["gpu_source"].get<std::string>().rfind("nvml", 0) == 0);
    nlohmann::json fake = nlohmann::json::object();
    for (const auto& g : j["machine"]["gpus"])
        if (g.contains("name") && g["name"].get<std::string>().rfind("Fake", 0) == 0) fake[g["pci_bus_id"].get<std::string>()] = g;
    REQUIRE(fake.size() == 2);
    const auto& big = fake["0000:1a:00.0"];  // NVML's "00000000:1A:00.0", in sysfs's spelling
    CHECK(big["memory_total_bytes"].get<double>() == 80.0 * (1ull << 30));
    CHECK(big["utilization"].get<double>() == doctest::Approx(0.37));
    CHECK(big["pcie_gen"] == 5);
    CHECK(big["pcie_width"] == 16);
    const auto& mig = fake["0000:3b:00.0"];
    CHECK_FALSE(mig.contains("utilization"));  // not reported: absent, not zero
    CHECK_FALSE(mig.contains("memory_total_bytes"));
    CHECK(mig["mig"] == true);
    CHECK(big["mig"] == false);
    CHECK(mig["visible"] == true);
    std::set<std::string> held;
    for (const auto& f : j["findings"]) {
        CHECK(f["code"] != "no-gpu");
        if (f["code"] == "gpu-memory-in-use") held.insert(f["evidence"]["gpu"].get<std::string>());
    }
    CHECK(held.count("0000:1a:00.0") == 1);
    CHECK(held.count("0000:3b:00.0") == 0);  // no memory figure, and on MIG the whole GPU's would not be this job's

    // CUDA_VISIBLE_DEVICES hides one of the two: the job size is one GPU (the evidence of cores-short
    // says so when it fires; the description always does).
    auto one = ft::run(std::string("CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=") + FEEDLINE_FAKE_NVML_DIR + " " + FEEDLINE_BIN_DIR +
                           "/feedline-doctor check --json",
                       dir);
    REQUIRE_MESSAGE(one.code != 2, one.err);
    const auto jo = nlohmann::json::parse(one.out);
    CHECK(jo["machine"]["cuda_visible_devices"] == 1);
    for (const auto& f : jo["findings"])
        if (f["code"] == "cores-short") CHECK(f["evidence"]["gpus"] == 1);
}

// The library's NVML reader and sampler on the stand-in. NVML is opened once per process, through the
// library path the process started with, so this case runs only in a child started with the stand-in
// on LD_LIBRARY_PATH (the next case); skipped, it is not listed, and a plain run leaves it out.
TEST_CASE("Doctor.Nvml.ReaderOnStandIn" * doctest::skip()) {
    const auto& nv = feedline::nvml::get();
    REQUIRE_MESSAGE(nv.available(), nv.reason());
    REQUIRE(nv.count() == 2);
    // sysfs's spelling, which the stand-in's lookup refuses: found by comparing each GPU's numbers.
    const auto big = nv.read("0000:1a:00.0");
    REQUIRE(big);
    CHECK(big->name == "Fake GPU 80GB");
    CHECK(big->memory_total == 80ull << 30);
    CHECK(big->memory_used == 24ull << 30);
    CHECK(big->utilization == doctest::Approx(0.37));
    CHECK(big->pcie_width == 16u);
    CHECK_FALSE(big->mig);
    CHECK(nv.read("00000000:1A:00.0"));  // NVML's own spelling, directly
    CHECK(nv.read("0000:1A:00.0"));      // cudaDeviceGetPCIBusId's, by its numbers
    CHECK_FALSE(nv.read("0000:1a:00"));  // not a PCI address
    CHECK_FALSE(nv.read("0000:99:00.0"));
    CHECK_FALSE(nv.read(""));

    // MIG, unprivileged: the reading keeps what NVML gives (name, bus id, MIG) and leaves the rest empty.
    const auto mig = nv.read("0000:3b:00.0");
    REQUIRE(mig);
    CHECK(mig->mig);
    CHECK_FALSE(mig->memory_used);
    CHECK_FALSE(mig->memory_total);
    CHECK_FALSE(mig->utilization);
    std::string why;
    CHECK_FALSE(feedline::gpu_sampler::for_gpu("0000:3b:00.0", &why));  // nothing of this job's to sample
    CHECK(why.find("MIG") != std::string::npos);
    CHECK_FALSE(feedline::gpu_sampler::for_gpu("0000:99:00.0", &why));
    CHECK(why.find("does not report") != std::string::npos);

    // The sampler through the real reader: every 5 ms, means of the stand-in's constant figures.
    auto s = feedline::gpu_sampler::for_gpu("0000:1a:00.0", &why, std::chrono::milliseconds(5));
    REQUIRE_MESSAGE(s, why);
    while (s->samples_taken() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto g = s->take();
    REQUIRE(g);
    CHECK(g->samples >= 3);
    CHECK(g->utilization_samples == g->samples);
    CHECK(g->utilization == doctest::Approx(0.37));
    CHECK(g->memory_used == 24ull << 30);
    CHECK(g->memory_total == 80ull << 30);
}

TEST_CASE("Doctor.Nvml.PciAddressesCompareByNumberInEverySpelling") {
    using feedline::detail::parse_pci_bus_id;
    const std::array<unsigned, 3> want{0, 0x1a, 0};
    CHECK(parse_pci_bus_id("0000:1a:00.0") == want);                                     // sysfs
    CHECK(parse_pci_bus_id("0000:1A:00.0") == want);                                     // CUDA
    CHECK(parse_pci_bus_id("00000000:1A:00.0") == want);                                 // NVML
    CHECK(parse_pci_bus_id("10000:01:00.0") == std::array<unsigned, 3>{0x10000, 1, 0});  // a VMD domain
    CHECK_FALSE(parse_pci_bus_id(""));
    CHECK_FALSE(parse_pci_bus_id("0000:1a:00"));
    CHECK_FALSE(parse_pci_bus_id("0000:1a:00.0 "));
    CHECK_FALSE(parse_pci_bus_id("GPU-8f3c"));
}

TEST_CASE("Doctor.Nvml.LibraryOnStandIn") {
    ft::scratch_dir dir;
    const auto r = ft::run(std::string("LD_LIBRARY_PATH=") + FEEDLINE_FAKE_NVML_DIR + " " + FEEDLINE_BIN_DIR +
                               "/test_doctor --no-skip --test-case=Doctor.Nvml.ReaderOnStandIn",
                           dir);
    const std::string output = r.out + r.err;
    INFO(output);
    CHECK(r.code == 0);
    // It ran, and asserted: "assertions: N | N passed" with N > 0.
    CHECK(std::regex_search(r.out, std::regex(R"(assertions:\s*([1-9][0-9]*)\s*\|\s*\1 passed)")));
}

TEST_CASE("Doctor.Faults.HostileInputsAreRefusedNeverACrashOrAHang") {
    ft::scratch_dir dir;
    const std::string doctor = std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor ";
    // `timeout` turns a hang into 124; a crash would be 128 + its signal.
    auto run = [&](const std::string& args) { return ft::run("timeout 60 " + doctor + args, dir); };
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    for (const std::string& args : {"diagnose " + fifo, "plan --params 1e9 --config " + fifo, std::string("diagnose /dev/zero")}) {
        CAPTURE(args);
        const auto r = run(args);
        CHECK(r.code == 2);
        CHECK_MESSAGE(r.err.find(args.substr(args.rfind(' ') + 1)) != std::string::npos, r.err);
    }
    // A 280 KB line nested 20,000 deep: refused by a scan before any parser builds it.
    {
        std::ofstream deep(dir / "deep.jsonl");
        deep << "{\"step\": 1, \"stall_fraction\": 0.1, \"x\": " << std::string(20000, '[') << std::string(20000, ']') << "}\n";
    }
    const auto deep = run("diagnose " + (dir / "deep.jsonl"));
    CHECK(deep.code == 2);
    CHECK_MESSAGE(deep.err.find("deeper than") != std::string::npos, deep.err);
    std::istringstream nested("{\"step\": 1, \"stall_fraction\": 0.1, \"x\": " + std::string(5000, '{') + "}\n");
    CHECK_THROWS_AS(doctor::parse_log(nested, "nested.log"), feedline::format_error);

    // A one-line stats log is a log, not a scenario; a log whose last line is cut (still being
    // written) is read up to it, with a note.
    ft::write_text(dir / "one.jsonl", R"({"unix_time": 1.0, "batches": 10, "stall_fraction": 0.5, "tokens_per_s": 1, "workers": 1})"
                                      "\n");
    auto one = run("diagnose --json " + (dir / "one.jsonl"));
    REQUIRE_MESSAGE(one.code == 1, one.err);
    CHECK(nlohmann::json::parse(one.out)["input"] == "log");
    ft::write_text(dir / "cut.jsonl",
                   "{\"step\": 1, \"stall_fraction\": 0.5, \"tokens_per_s\": 10}\n{\"step\": 2, \"stall_fraction\": 0.5, \"tok");
    auto cut = run("diagnose --json " + (dir / "cut.jsonl"));
    REQUIRE_MESSAGE(cut.code == 1, cut.err);
    const auto cut_json = nlohmann::json::parse(cut.out);
    REQUIRE(cut_json["notes"].size() == 1);
    CHECK(cut_json["notes"][0].get<std::string>().find("line 2 (the last) is cut short") != std::string::npos);
    CHECK(cut_json["findings"][0]["code"] == "data-bound");

    // Crafted --root trees: a node number past int, a CPU list of two billion CPUs, a FIFO for a file.
    const std::filesystem::path root = dir / "root";
    std::filesystem::copy(fixture_root("vm_1node"), root, std::filesystem::copy_options::recursive);
    std::filesystem::create_directories(root / "sys/devices/system/node/node99999999999");
    ft::write_text((root / "sys/devices/system/node/node99999999999/cpulist").string(), "0\n");
    std::filesystem::remove(root / "proc/sys/vm/swappiness");
    REQUIRE(::mkfifo((root / "proc/sys/vm/swappiness").c_str(), 0600) == 0);
    auto crafted = run("check --json --root " + root.string());
    CHECK_MESSAGE((crafted.code == 0 || crafted.code == 1), crafted.err);
    CHECK(nlohmann::json::parse(crafted.out)["machine"]["numa_nodes"].size() == 1);
    ft::write_text((root / "sys/devices/system/node/node0/cpulist").string(), "0-2147483646\n");
    auto huge = run("check --json --root " + root.string());
    CHECK(huge.code == 2);
    CHECK_MESSAGE(huge.err.find("0-2147483646") != std::string::npos, huge.err);

    // A dataset path that is not UTF-8, with --json: the output is JSON (U+FFFD for the bad bytes).
    const std::string odd = dir / "data-\xff\xfe";
    std::filesystem::create_directories(odd);
    {
        feedline::megatron_writer w(odd + "/part", feedline::token_dtype::uint16);
        for (int d = 0; d < 200; ++d) w.add_document(std::vector<std::uint32_t>(300, static_cast<std::uint32_t>(d)));
        w.finish();
    }
    auto measured = run("check --json --seconds 0.2 --max-workers 1 --seq-len 64 --data '" + odd + "/part'");
    REQUIRE_MESSAGE(measured.code != 2, measured.err);
    CHECK(nlohmann::json::parse(measured.out).is_object());
}
