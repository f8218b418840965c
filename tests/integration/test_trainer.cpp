// feedline-train, run as a user runs it on data packed by feedline-pack: the loss falls well below
// where it starts and below the data's unigram entropy, a resumed run reproduces the uninterrupted
// run's losses bit for bit (CPU), and bad flags, data or checkpoints fail with a message that says
// what and where.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <utility>

#include <feedline/device/cuda_runtime.hpp>
#include <feedline/pipeline/options.hpp>

#include "trainer_fixture.hpp"

namespace ft = feedline::test;

TEST_CASE("feedline-train: the loss falls on the demo corpus, with evaluation and a summary") {
    ft::trainer_corpus data;
    auto r = ft::run(data.train_command("--max-steps 80 --lr 1e-2 --warmup 5 --log-every 10 --eval-data " + data.eval + " --eval-every 40"),
                     data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto lines = ft::progress_lines(r.out);
    REQUIRE(lines.size() == 9);  // step 1, then every 10
    const double first = lines.front()["loss"], last = lines.back()["loss"];
    CHECK(last < 0.7 * first);
    for (const auto& l : lines) {
        CHECK(l["tokens_per_s"].get<double>() > 0);
        CHECK(l["stall_fraction"].get<double>() >= 0);
        CHECK(l["stall_fraction"].get<double>() <= 1);
    }
    const auto s = ft::summary_line(r.out);
    REQUIRE(s.is_object());
    CHECK(s["steps"] == 80);
    CHECK(s["tokens"] == 80 * 4 * 32);
    CHECK(s["final_loss"].get<double>() < s["unigram_entropy"].get<double>());
    CHECK(s["eval_loss"].get<double>() < 0.8 * first);
    CHECK(r.out.find("\"eval_loss\"") != std::string::npos);
}

TEST_CASE("feedline-train: a resumed run reproduces the uninterrupted run's losses exactly") {
    ft::trainer_corpus data;
    for (const char* mode : {"windows", "packed"}) {
        CAPTURE(mode);
        const std::string common = std::string("--mode ") + mode + " --decay-steps 12 --warmup 3 --grad-accum 2";
        auto full = ft::run(data.train_command(common + " --max-steps 12"), data.dir);
        REQUIRE_MESSAGE(full.code == 0, full.err);
        const std::string ck = data.dir / (std::string("ck-") + mode);
        auto first = ft::run(data.train_command(common + " --max-steps 5 --checkpoint " + ck), data.dir);
        REQUIRE_MESSAGE(first.code == 0, first.err);
        REQUIRE(std::filesystem::exists(ck + "/step-000000000005/tensors.bin"));
        // Another worker count on resume: the data order does not depend on it.
        auto second = ft::run(data.train_command(common + " --max-steps 12 --workers 2 --resume " + ck), data.dir);
        REQUIRE_MESSAGE(second.code == 0, second.err);

        const auto a = ft::progress_lines(full.out), b = ft::progress_lines(first.out), c = ft::progress_lines(second.out);
        REQUIRE(a.size() == 12);
        REQUIRE(b.size() == 5);
        REQUIRE(c.size() == 7);
        for (std::size_t i = 0; i < 5; ++i) CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
        for (std::size_t i = 0; i < 7; ++i) {
            CAPTURE(i);
            CHECK(c[i]["step"] == a[5 + i]["step"]);
            CHECK(c[i]["loss"].get<double>() == a[5 + i]["loss"].get<double>());  // bit for bit
        }
    }
}

TEST_CASE("feedline-train: a checkpoint resumes with another micro-batch x accumulation of the same global batch") {
    // The doctor's advice (micro-batch 2 x 4 -> 4 x 2, the global batch kept): the resumed run sees the
    // uninterrupted run's samples at every step, so its losses follow that run's to float rounding (the
    // gradient is summed over other micro-batches). Another global batch goes on from the same sample.
    ft::trainer_corpus data;
    for (const char* mode : {"windows", "packed"}) {
        CAPTURE(mode);
        const std::string common = std::string("--mode ") + mode + " --decay-steps 10 --warmup 2";
        auto full = ft::run(data.train_command(common + " --batch-size 2 --grad-accum 4 --max-steps 10"), data.dir);
        REQUIRE_MESSAGE(full.code == 0, full.err);
        const std::string ck = data.dir / (std::string("shape-") + mode);
        auto first = ft::run(data.train_command(common + " --batch-size 2 --grad-accum 4 --max-steps 4 --checkpoint " + ck), data.dir);
        REQUIRE_MESSAGE(first.code == 0, first.err);
        auto second = ft::run(data.train_command(common + " --batch-size 4 --grad-accum 2 --max-steps 10 --resume " + ck), data.dir);
        REQUIRE_MESSAGE(second.code == 0, second.err);
        auto third = ft::run(data.train_command(common + " --batch-size 8 --grad-accum 1 --max-steps 10 --resume " + ck), data.dir);
        REQUIRE_MESSAGE(third.code == 0, third.err);
        const auto a = ft::progress_lines(full.out);
        REQUIRE(a.size() == 10);
        for (const auto& run : {second, third}) {
            const auto c = ft::progress_lines(run.out);
            REQUIRE(c.size() == 6);
            for (std::size_t i = 0; i < 6; ++i) {
                CAPTURE(i);
                CHECK(c[i]["step"] == a[4 + i]["step"]);
                CHECK(c[i]["loss"].get<double>() == doctest::Approx(a[4 + i]["loss"].get<double>()).epsilon(1e-4));
            }
        }
        // Another global batch (4 instead of 8) goes on from the next sample, with a warning; the state
        // it saves remembers where the batch changed, and resumes exactly from there.
        const std::string ck_other = data.dir / (std::string("other-") + mode);
        auto other = ft::run(data.train_command(common + " --batch-size 2 --grad-accum 2 --max-steps 10 --resume " + ck), data.dir);
        REQUIRE_MESSAGE(other.code == 0, other.err);
        CHECK_MESSAGE(other.err.find("warning: " + ck + " was trained with a global batch of 8 samples per step; this run takes 4") !=
                          std::string::npos,
                      other.err);
        CHECK(other.err.find("after the 32 samples drawn so far, from step 4") != std::string::npos);
        auto part = ft::run(
            data.train_command(common + " --batch-size 2 --grad-accum 2 --max-steps 7 --resume " + ck + " --checkpoint " + ck_other),
            data.dir);
        REQUIRE_MESSAGE(part.code == 0, part.err);
        const auto saved = nlohmann::json::parse(ft::read_text(ck_other + "/step-000000000007/trainer.json"));
        const auto& state = saved["pipeline_state"];
        CHECK(state["global_batch"] == 4);
        CHECK(state["version"] == 2);
        CHECK(state["origin_step"] == 4);
        CHECK(state["origin_drawn"] == 32);
        CHECK(state["step"] == 7);
        auto rest = ft::run(data.train_command(common + " --batch-size 4 --grad-accum 1 --max-steps 10 --resume " + ck_other), data.dir);
        REQUIRE_MESSAGE(rest.code == 0, rest.err);
        CHECK(rest.err.find("warning") == std::string::npos);  // the same global batch as the checkpoint's
        const auto o = ft::progress_lines(other.out), r = ft::progress_lines(rest.out);
        REQUIRE(o.size() == 6);
        REQUIRE(r.size() == 3);
        for (std::size_t i = 0; i < 3; ++i) {
            CAPTURE(i);
            CHECK(r[i]["step"] == o[3 + i]["step"]);
            CHECK(r[i]["loss"].get<double>() == doctest::Approx(o[3 + i]["loss"].get<double>()).epsilon(1e-4));
        }
        // Another sequence length is still refused, naming both.
        auto longer =
            ft::run(data.train_command(common + " --seq-len 64 --batch-size 2 --grad-accum 4 --max-steps 10 --resume " + ck), data.dir);
        CHECK(longer.code == 1);
        CHECK_MESSAGE(longer.err.find("32 tokens per sample") != std::string::npos, longer.err);
    }
}

TEST_CASE("feedline-train: trains straight from JSONL tokenized on the fly, and resumes it exactly") {
    ft::trainer_corpus data;
    // The same flags as on shards, with the JSONL the shards were packed from as --data.
    auto on_text = [&](const std::string& extra) {
        std::string cmd = data.train_command("--decay-steps 10 --warmup 2 " + extra);
        return ft::run(cmd.replace(cmd.find(" --data " + data.train), 8 + data.train.size(), " --data " + (data.dir / "train.jsonl")),
                       data.dir);
    };
    auto full = on_text("--max-steps 10");
    REQUIRE_MESSAGE(full.code == 0, full.err);
    CHECK(full.out.find("text documents") != std::string::npos);  // the start line says what the data is
    const std::string ck = data.dir / "ck-text";
    auto first = on_text("--max-steps 4 --checkpoint " + ck);
    REQUIRE_MESSAGE(first.code == 0, first.err);
    auto second = on_text("--max-steps 10 --workers 2 --resume " + ck);
    REQUIRE_MESSAGE(second.code == 0, second.err);
    const auto a = ft::progress_lines(full.out), c = ft::progress_lines(second.out);
    REQUIRE(a.size() == 10);
    REQUIRE(c.size() == 6);
    for (std::size_t i = 0; i < 6; ++i) {
        CAPTURE(i);
        CHECK(c[i]["step"] == a[4 + i]["step"]);
        CHECK(c[i]["loss"].get<double>() == a[4 + i]["loss"].get<double>());  // the text state resumed mid-stream
    }
    CHECK(a.back()["loss"].get<double>() < a.front()["loss"].get<double>());
}

namespace {

// feedline-train --json on `dataset` with one data worker, then feedline-doctor diagnose on its log:
// the finding codes (which the trainer's own summary must name too), and the device it trained on.
std::pair<std::set<std::string>, std::string> diagnose_run(const ft::trainer_corpus& data, const std::string& name,
                                                           const std::string& dataset, const std::string& model_flags) {
    const std::string log = data.dir / (name + ".log");
    auto r =
        ft::run(data.bin + "/feedline-train --tokenizer " + data.model +
                    " --json --log-every 20 --eval-every 0 --max-steps 100 --workers 1 " + model_flags + " --data " + dataset + " > " + log,
                data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    auto d = ft::run(data.bin + "/feedline-doctor diagnose " + log + " --json", data.dir);
    REQUIRE_MESSAGE(d.code != 2, d.err);
    MESSAGE(name << ": " << d.out);
    std::set<std::string> codes;
    const auto found = nlohmann::json::parse(d.out);  // named: a range-for over a member of a temporary would dangle
    for (const auto& f : found["findings"]) codes.insert(f["code"].get<std::string>());
    std::ifstream in(log);
    const std::string out(std::istreambuf_iterator<char>(in), {});
    const auto summary = ft::summary_line(out);
    // The trainer names the same findings in its summary, and its lines carry the host telemetry.
    std::set<std::string> own;
    for (const auto& f : summary["findings"]) own.insert(f.get<std::string>());
    CHECK(own == codes);
    CHECK(summary["host_ram_total_bytes"].get<double>() > 0);
    CHECK(summary["rss_anon_bytes"].get<double>() > 0);
    CHECK(summary["micro_batch"].get<double>() > 0);
    for (const auto& line : ft::progress_lines(out)) CHECK(line.contains("host_ram_available_bytes"));
    if (summary["device"].get<std::string>().rfind("cuda", 0) != 0) {
        CHECK_FALSE(summary.contains("gpu_utilization"));  // absent, not zero
    } else if (summary["gpu_telemetry"] == "nvml") {
        // On a GPU with NVIDIA's driver: NVML's figures for the run, and on the lines that had samples.
        CHECK(summary["gpu_memory_used_bytes"].get<double>() > 0);
        CHECK(summary["gpu_memory_used_bytes"].get<double>() < summary["gpu_memory_total_bytes"].get<double>());
        if (summary.contains("gpu_utilization")) CHECK(summary["gpu_utilization"].get<double>() <= 1);
        bool any = false;
        for (const auto& line : ft::progress_lines(out)) any = any || line.contains("gpu_memory_used_bytes");
        CHECK(any);
    } else {
        MESSAGE("no NVML on this GPU machine: " << summary["gpu_telemetry"]);
    }
    return {codes, summary["device"].get<std::string>()};
}

}  // namespace

TEST_CASE("feedline-doctor diagnose: a trainer fed from shards is not data-bound by its own log") {
    if (!std::filesystem::exists(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor")) ft::skip("feedline-doctor was not built");
    ft::trainer_corpus data;
    // A step of a few milliseconds: one worker reading shards needs microseconds per batch, so even on a
    // busy machine (the other tests) the trainer does not wait; start-up stays under 1% of the run.
    const auto [codes, device] =
        diagnose_run(data, "shards", data.train, "--context 4 --embed 32 --hidden 128 --batch-size 32 --seq-len 64");
    CHECK(codes.count("data-bound") == 0);
}

TEST_CASE("feedline-doctor diagnose: on a GPU, a trainer starved by on-the-fly tokenization with one worker is data-bound by its own log") {
    // A model that outruns one tokenizing worker: the sample trainer on a GPU (6 M tokens/s on an
    // H100, against ~2 M tokens/s for a worker there). On a CPU it does not (~0.8 M tokens/s for its
    // smallest model on 2 cores, slower than the worker), so the case needs a GPU.
    if (!std::filesystem::exists(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor")) ft::skip("feedline-doctor was not built");
    // Asked first, so a machine without a GPU skips at once instead of after a CPU run of the trainer.
    if (const auto gpu = feedline::gpu_probe(); !gpu) ft::skip(gpu.reason);
    ft::trainer_corpus data;
    const std::string big_steps = "--device auto --batch-size 64 --seq-len 256";
    const auto [text, device] = diagnose_run(data, "text", data.dir / "train.jsonl", big_steps);
    if (device.rfind("cuda", 0) != 0) ft::skip("no GPU: the run trained on " + device);
    CHECK(text.count("data-bound") == 1);
    const auto [shards, again] = diagnose_run(data, "shards", data.train, big_steps);
    CHECK(shards.count("data-bound") == 0);
}

TEST_CASE("feedline-doctor check --data: JSONL tokenized on the fly gives the per-worker tokenization rate") {
    if (!std::filesystem::exists(std::string(FEEDLINE_BIN_DIR) + "/feedline-doctor")) ft::skip("feedline-doctor was not built");
    ft::trainer_corpus data;
    auto r = ft::run(data.bin + "/feedline-doctor check --json --seconds 0.3 --max-workers 1 --seq-len 64 --data " +
                         (data.dir / "train.jsonl") + " --tokenizer " + data.model,
                     data.dir);
    REQUIRE_MESSAGE(r.code != 2, r.err);
    const auto j = nlohmann::json::parse(r.out);
    REQUIRE(j["data"]["pipeline"].size() == 1);
    const auto& row = j["data"]["pipeline"][0];
    CHECK(row["batches"].get<double>() > 0);
    CHECK(row["tokenize_tokens_per_s_per_worker"].get<double>() > 0);
    // What one core updates as an offloaded optimizer, for plan --cpu-adam-params-per-s.
    CHECK(j["cpu_adam"]["steps"].get<double>() >= 1);
    CHECK(j["cpu_adam"]["params_per_s_per_core"].get<double>() > 0);
    // A tokenizer that is not there is bad input, named.
    auto bad = ft::run(
        data.bin + "/feedline-doctor check --data " + (data.dir / "train.jsonl") + " --tokenizer " + (data.dir / "nope.model"), data.dir);
    CHECK(bad.code == 2);
    CHECK(bad.err.find("nope.model") != std::string::npos);
}

TEST_CASE("feedline-train: bad flags, data and checkpoints fail with a clear message") {
    ft::trainer_corpus data;
    SUBCASE("token ids beyond --vocab-size") {
        auto r = ft::run(data.train_command("--max-steps 2 --vocab-size 10"), data.dir);
        CHECK(r.code == 1);
        CHECK(r.err.find("outside the model's vocabulary of 10") != std::string::npos);
    }
    SUBCASE("missing data") {
        auto r = ft::run(data.train_command("--max-steps 2 --data " + (data.dir / "nope")), data.dir);
        CHECK(r.code == 1);
        CHECK(r.err.find(data.dir / "nope") != std::string::npos);
    }
    SUBCASE("a checkpoint of another model") {
        const std::string ck = data.dir / "ck";
        REQUIRE(ft::run(data.train_command("--max-steps 2 --checkpoint " + ck), data.dir).code == 0);
        auto r = ft::run(data.train_command("--max-steps 4 --hidden 48 --resume " + ck), data.dir);
        CHECK(r.code == 1);
        CHECK(r.err.find("differs from the one asked for") != std::string::npos);
        r = ft::run(data.train_command("--max-steps 4 --seed 9 --resume " + ck), data.dir);
        CHECK(r.code == 1);
        CHECK_MESSAGE(r.err.find("seed 1; this run asks for 32, mode windows, seed 9") != std::string::npos, r.err);
    }
    SUBCASE("a checkpoint directory that cannot be written, before any step") {
        ft::write_text(data.dir / "plain-file", "x");
        auto r = ft::run(data.train_command("--max-steps 400 --checkpoint " + (data.dir / "plain-file") + "/ck"), data.dir);
        CHECK(r.code == 1);
        CHECK(r.err.find("plain-file/ck") != std::string::npos);
        CHECK(ft::progress_lines(r.out).empty());  // refused before the first step, not after the last
    }
    SUBCASE("--help documents every flag") {
        auto r = ft::run(data.bin + "/feedline-train --help", data.dir);
        CHECK(r.code == 0);
        for (const char* flag : {"--data", "--max-steps", "--max-seconds", "--batch-size", "--seq-len", "--device", "--checkpoint",
                                 "--resume", "--json", "--grad-accum", "--eval-data", "--tokenizer", "--vocab-size"})
            CHECK_MESSAGE(r.out.find(flag) != std::string::npos, flag);
    }
}

TEST_CASE("feedline-train: after going back to an earlier checkpoint, retention and --resume follow the new run, not step numbers") {
    ft::trainer_corpus data;
    namespace fs = std::filesystem;
    const std::string ck = data.dir / "ck";
    auto r = ft::run(data.train_command("--max-steps 4 --checkpoint-every 2 --keep-checkpoints 0 --checkpoint " + ck), data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    // Back to step 2, on to step 3, keeping one checkpoint: step 3 survives its own save.
    r = ft::run(data.train_command("--max-steps 3 --keep-checkpoints 1 --checkpoint " + ck + " --resume " + ck + "/step-000000000002"),
                data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(fs::exists(ck + "/step-000000000003/manifest.json"));
    CHECK_FALSE(fs::exists(ck + "/step-000000000002"));
    CHECK(fs::exists(ck + "/step-000000000004"));  // the abandoned run's: not this lineage's to remove
    // --resume ROOT goes on from step 3, the checkpoint written last, not the abandoned step 4.
    r = ft::run(data.train_command("--max-steps 5 --checkpoint " + ck + " --resume " + ck), data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto lines = ft::progress_lines(r.out);
    REQUIRE_FALSE(lines.empty());
    CHECK(lines.front()["step"] == 4);
    const auto step3 = nlohmann::json::parse(ft::read_text(ck + "/step-000000000003/trainer.json"));
    const auto step5 = nlohmann::json::parse(ft::read_text(ck + "/step-000000000005/trainer.json"));
    CHECK(step5["parent"] == step3["id"]);
    // The pipeline's options are recorded in the form --config reads: they say what made the batches.
    CHECK(step5["pipeline_options"]["seq_len"] == step5["seq_len"]);
    CHECK(step5["pipeline_options"]["seed"] == step5["seed"]);
    feedline::pipeline_config recorded;
    feedline::options_from_json(recorded, step5["pipeline_options"], "trainer.json");
    CHECK(feedline::options_to_json(recorded) == step5["pipeline_options"]);
    CHECK(step5["generation"].get<int>() > step3["generation"].get<int>());
}
