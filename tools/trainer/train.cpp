// feedline-train: a next-token model trained on batches from feedline::pipeline — the whole path from
// shards on disk to a falling loss. The model (model.hpp) runs on a GPU through cuBLAS when one is
// present (cuda_backend.cu) and on the CPU through OpenBLAS otherwise (cpu_backend.hpp); under
// `mpirun -np N` each rank trains on its slice of every global batch and gradients are summed with
// NCCL (GPUs) or MPI_Allreduce (CPUs). Checkpoints hold the model, the optimizer and the pipeline's
// state, so a resumed run sees exactly the batches the uninterrupted run would have.
//
// One optimizer step = grad_accum micro-batches of batch_size rows on each rank. Gradients are sums
// over target tokens, divided once by the global count of target tokens in the step, so 2 ranks with
// batch B and 1 rank with batch B and 2 accumulation steps compute the same update.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <feedline/doctor/diagnose.hpp>

#include "checkpoint.hpp"
#include "communicator.hpp"
#include "cpu_backend.hpp"
#include "model.hpp"
#include "tool_main.hpp"
#ifdef FEEDLINE_TRAINER_CUDA
#include "cuda_backend.hpp"
#endif

namespace doctor = feedline::doctor;

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
    std::string data, eval_data, tokenizer, device = "auto", mode = "windows", checkpoint, resume, precision = "auto";
    std::uint64_t max_steps = 1000, batch_size = 16, seq_len = 128, grad_accum = 1, seed = 1;
    double max_seconds = 0;
    std::uint64_t log_every = 10, eval_every = 100, eval_batches = 8, checkpoint_every = 0;
    std::size_t keep_checkpoints = 2;
    feedline::pipeline_config data_options;  // the pipeline options not above, from the command line
    unsigned workers = 1;
    bool json = false;
    trainer::model_config model;
    trainer::optimizer_config optimizer;
    std::uint64_t decay_steps = 0;
};

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// What feedline-doctor diagnose reads besides the stall: host RAM and swap, this process's own and
// file-backed memory, and the GPU's utilization and memory over the interval (NVML; absent without it).
void add_telemetry(nlohmann::json& j, const std::optional<feedline::gpu_interval>& gpu) {
    const auto h = feedline::read_host_memory();
    const auto p = feedline::read_process_memory();
    auto put = [&](const char* key, const auto& v) {
        if (v) j[key] = *v;
    };
    put("host_ram_total_bytes", h.total);
    put("host_ram_available_bytes", h.available);
    put("swap_total_bytes", h.swap_total);
    put("swap_used_bytes", h.swap_used());
    put("rss_anon_bytes", p.rss_anon);
    put("rss_file_bytes", p.rss_file);
    if (gpu) {
        put("gpu_utilization", gpu->utilization);
        put("gpu_memory_used_bytes", gpu->memory_used);
        put("gpu_memory_total_bytes", gpu->memory_total);
    }
}

std::uint32_t vocabulary_from(const options& o) {
    if (o.model.vocab) return o.model.vocab;
    if (!o.tokenizer.empty()) {
        return static_cast<std::uint32_t>(feedline::make_tokenizer({.model = o.tokenizer, .add_eos = false}, "--tokenizer")->vocab_size());
    }
    throw feedline::config_error("--vocab-size",
                                 "unknown: pass --vocab-size V or --tokenizer MODEL (the sentencepiece model the data was packed with)");
}

// Counts the step's target tokens and checks every id fits the model (host copy of the batch).
std::uint64_t check_batch(const feedline::batch& b, std::uint32_t vocab, std::vector<std::uint64_t>& unigram) {
    std::uint64_t count = 0;
    for (std::int32_t t : b.host_inputs())
        if (t < 0 || static_cast<std::uint32_t>(t) >= vocab)
            throw feedline::config_error(
                "--vocab-size", fmt::format("batch {} holds token id {}, outside the model's vocabulary of {}", b.step(), t, vocab));
    for (std::int32_t t : b.host_targets()) {
        if (t < 0) continue;
        if (static_cast<std::uint32_t>(t) >= vocab)
            throw feedline::config_error(
                "--vocab-size", fmt::format("batch {} holds token id {}, outside the model's vocabulary of {}", b.step(), t, vocab));
        ++count;
        ++unigram[static_cast<std::size_t>(t)];
    }
    return count;
}

trainer::batch_view view_of(const feedline::batch& b) { return {b.inputs(), b.targets(), b.position_ids(), b.size(), b.seq_len()}; }

double unigram_entropy(const std::vector<double>& counts) {
    double total = 0, h = 0;
    for (double c : counts) total += c;
    for (double c : counts)
        if (c > 0) h -= c / total * std::log(c / total);
    return h;
}

int run(options o, trainer::communicator& comm) {
    const bool lead = comm.rank() == 0;
    auto say = [&](const std::string& line) {
        if (lead) std::printf("%s\n", line.c_str()), std::fflush(stdout);
    };
    o.model.vocab = vocabulary_from(o);
    o.optimizer.decay_steps = o.decay_steps ? o.decay_steps : o.max_steps;

    // Where checkpoints go is checked now, not after the last step (the run would be lost).
    if (!o.checkpoint.empty() && lead) trainer::check_checkpoint_root(o.checkpoint);
    std::optional<trainer::checkpoint> resumed;
    std::string lineage_parent;  // the checkpoint this run goes on from: its saves continue that lineage
    if (!o.resume.empty()) {
        resumed = trainer::resume_from(o.resume, [&](const std::string& line) {
            if (lead) std::fprintf(stderr, "%s\n", line.c_str());
        });
        const auto& r = *resumed;
        if (r.model.vocab != o.model.vocab || r.model.context != o.model.context || r.model.embed != o.model.embed ||
            r.model.hidden != o.model.hidden)
            throw feedline::config_error("--resume", o.resume + ": the checkpoint's model (" + trainer::to_json(r.model).dump() +
                                                         ") differs from the one asked for (" + trainer::to_json(o.model).dump() + ")");
        if (r.seq_len != o.seq_len || r.mode != o.mode || r.seed != o.seed)
            throw feedline::config_error("--resume",
                                         fmt::format("{}: the checkpoint was trained with {} tokens per sample, mode {}, seed {}; "
                                                     "this run asks for {}, mode {}, seed {}",
                                                     o.resume, r.seq_len, r.mode, r.seed, o.seq_len, o.mode, o.seed));
    }

    // Where the model runs: the rank's GPU (by local rank) when there is one, else the CPU.
    std::string device = "cpu";
    [[maybe_unused]] int gpu = -1;  // read only by the CUDA backend
    if (o.device != "cpu") {
        const auto probe = feedline::gpu_probe();
        if (probe) {
#ifdef FEEDLINE_TRAINER_CUDA
            gpu = o.device.rfind("cuda:", 0) == 0 ? std::stoi(o.device.substr(5)) : comm.local_rank() % probe.devices;
            device = "cuda:" + std::to_string(gpu);
#else
            say("note: a GPU is present but this feedline-train was built without CUDA; training on the CPU");
#endif
        } else if (o.device != "auto") {
            throw feedline::config_error("--device", o.device + ": " + probe.reason);
        }
    }

    const std::vector<float> initial = trainer::initial_parameters(o.model, o.seed);
    std::unique_ptr<trainer::backend> model;
#ifdef FEEDLINE_TRAINER_CUDA
    if (gpu >= 0) {
        const auto precision = o.precision == "bf16"   ? trainer::gpu_precision::bf16
                               : o.precision == "fp32" ? trainer::gpu_precision::fp32
                                                       : trainer::gpu_precision::automatic;
        model = trainer::make_cuda_backend(o.model, o.optimizer, initial, gpu, precision, &comm);
    }
#endif
    if (!model) model = std::make_unique<trainer::cpu_backend>(o.model, o.optimizer, initial, &comm);
    // The GPU's utilization and memory, sampled every 100 ms on a side thread (NVML), for the log.
    std::unique_ptr<feedline::gpu_sampler> gpu_monitor;
    std::string gpu_monitor_note = "no GPU";
    if (gpu >= 0) gpu_monitor = feedline::gpu_sampler::for_gpu(feedline::gpu_pci_bus_id(gpu), &gpu_monitor_note);
    double gpu_busy_sum = 0, gpu_memory_peak = 0, gpu_memory_total = 0;
    unsigned gpu_samples = 0;
    auto take_gpu = [&]() -> std::optional<feedline::gpu_interval> {
        if (!gpu_monitor) return std::nullopt;
        auto g = gpu_monitor->take();
        if (g && g->samples > 0) {
            if (g->utilization) gpu_busy_sum += *g->utilization * g->utilization_samples, gpu_samples += g->utilization_samples;
            if (g->memory_used && g->memory_total) {
                gpu_memory_peak = std::max(gpu_memory_peak, static_cast<double>(*g->memory_used));
                gpu_memory_total = static_cast<double>(*g->memory_total);
            }
        }
        return g;
    };

    const auto mode = o.mode == "packed" ? feedline::sample_mode::packed : feedline::sample_mode::windows;
    // One pipeline config for training and evaluation data: shards, text tokenized on the fly (with
    // --tokenizer), or a blend of both in Megatron's --data-path form.
    auto data_config = [&](const std::string& spec, std::uint64_t seed, unsigned workers, std::uint64_t max_steps) {
        feedline::pipeline_config c = o.data_options;
        c.batch_size = o.batch_size;
        c.seq_len = o.seq_len;
        c.seed = seed;
        c.mode = mode;
        c.workers = workers;
        c.device = feedline::parse_device(device);
        c.rank = comm.rank();
        c.world_size = comm.size();
        c.max_steps = max_steps;
        if (feedline::kinds_of(feedline::parse_data_spec(spec)).text) c.text.tokenizer = o.tokenizer;
        return c;
    };
    // One pipeline batch per optimizer step: batch_size x grad_accum rows per rank, cut into grad_accum
    // micro-batches here. The sampler's global batch is then the optimizer's (rows per step over all
    // ranks), so a checkpoint resumes with any micro-batch x accumulation x ranks of the same product
    // (the doctor's "micro-batch 16 x 8 -> 32 x 4"): the sample stream does not depend on the split.
    // A checkpoint of an earlier feedline-train, whose pipeline took one batch per micro-batch, goes on
    // that way (same micro-batch, accumulation and ranks).
    // Another global batch (rows per optimizer step over all ranks) goes on from the sample the
    // checkpoint's run would have drawn next, with a warning: the steps from there match neither run.
    std::uint64_t batches_per_step = 1;
    const std::uint64_t global_batch = o.batch_size * comm.size() * o.grad_accum;
    auto change = feedline::global_batch_change::refuse;
    if (resumed) {
        const auto saved = feedline::pipeline_state_from_json(resumed->pipeline_state);
        const bool per_micro_batch = resumed->grad_accum > 1 && saved.global_batch * resumed->grad_accum == resumed->global_batch;
        if (per_micro_batch) {
            if (saved.global_batch != o.batch_size * comm.size() || resumed->grad_accum != o.grad_accum)
                throw feedline::config_error("--resume",
                                             fmt::format("{}: written by an earlier feedline-train, which resumes only with the same "
                                                         "ranks, --batch-size and --grad-accum ({} rows x {} per step)",
                                                         o.resume, saved.global_batch, resumed->grad_accum));
            batches_per_step = o.grad_accum;
        } else if (saved.global_batch != global_batch) {
            change = feedline::global_batch_change::from_same_sample;
            if (lead)
                std::fprintf(stderr, "%s\n",
                             fmt::format("feedline-train: warning: {} was trained with a global batch of {} samples per step; this run "
                                         "takes {} ({} rank(s) x {} x {} accumulation). It goes on after the {} samples drawn so far, "
                                         "from step {}; the batches from here match neither a run with the old batch nor one with "
                                         "the new, and the learning-rate schedule goes on by step, not by sample",
                                         o.resume, saved.global_batch, global_batch, comm.size(), o.batch_size, o.grad_accum,
                                         saved.drawn_before(saved.step), saved.step)
                                 .c_str());
        }
    }
    feedline::pipeline_config train_config = data_config(o.data, o.seed, o.workers, 0);
    train_config.batch_size = o.batch_size * (o.grad_accum / batches_per_step);
    feedline::pipeline data(o.data, train_config);
    std::uint64_t step = 0, tokens = 0;
    if (resumed) {
        model->load_state(resumed->params, resumed->m, resumed->v);
        data.restore(feedline::pipeline_state_from_json(resumed->pipeline_state), change);
        step = resumed->step;
        tokens = resumed->tokens;
        lineage_parent = resumed->id;
        resumed.reset();
    }
    const std::uint64_t tokens_at_start = tokens;

    say(fmt::format(
        "feedline-train: {} parameters (vocab {}, context {}, embed {}, hidden {}) on {}; {} rank(s) x {} x {} tokens x {} accumulation = "
        "{} tokens per step; data {} ({})",
        o.model.parameter_count(), o.model.vocab, o.model.context, o.model.embed, o.model.hidden, model->describe(), comm.size(),
        o.batch_size, o.seq_len, o.grad_accum, comm.size() * o.batch_size * o.seq_len * o.grad_accum, o.data, data.describe()));

    double pending_train_loss = 0;  // training loss taken off the device early (by an evaluation)
    auto evaluate = [&]() -> std::optional<double> {
        if (o.eval_data.empty() || o.eval_batches == 0) return std::nullopt;
        feedline::pipeline eval(o.eval_data, data_config(o.eval_data, 1, 1, o.eval_batches));
        std::vector<std::uint64_t> ignore(o.model.vocab);
        double sums[2] = {0, 0};
        pending_train_loss += model->take_loss_sum();  // training loss since the last progress line: kept for it
        for (auto& b : eval) {
            sums[1] += static_cast<double>(check_batch(b, o.model.vocab, ignore));
            b.wait_on(model->stream());
            model->forward_backward(view_of(b), /*backward=*/false);
            b.release(model->stream());
        }
        sums[0] = model->take_loss_sum();
        comm.allreduce_sum(sums, 2);
        return sums[1] > 0 ? std::optional(sums[0] / sums[1]) : std::nullopt;
    };

    auto save = [&](const std::string& dir) {
        trainer::checkpoint c;
        model->save_state(c.params, c.m, c.v);  // collective-free, but every rank syncs its device here
        if (!lead) return;
        c.step = step;
        c.tokens = tokens;
        c.model = o.model;
        c.global_batch = o.batch_size * comm.size() * o.grad_accum;
        c.seq_len = o.seq_len;
        c.grad_accum = o.grad_accum;
        c.seed = o.seed;
        c.mode = o.mode;
        c.pipeline_state = feedline::to_json(data.state());
        c.pipeline_options = feedline::options_to_json(train_config);
        c.parent = lineage_parent;
        lineage_parent = trainer::save_checkpoint(dir, c, o.keep_checkpoints).id;
    };

    std::vector<std::uint64_t> unigram(o.model.vocab, 0);
    const auto start = clock_type::now();
    auto window_start = start;
    double window_wait = 0, total_wait = 0, window_targets = 0, train_seconds = 0;
    std::uint64_t window_tokens = 0, window_steps = 0;
    std::optional<double> first_loss, last_loss, last_eval;
    bool out_of_data = false;

    while (step < o.max_steps && !out_of_data && (o.max_seconds <= 0 || seconds_since(start) < o.max_seconds)) {
        model->zero_grads();
        std::uint64_t targets = 0;
        for (std::uint64_t taken = 0; taken < batches_per_step; ++taken) {
            const auto t0 = clock_type::now();
            std::optional<feedline::batch> b = data.next();
            window_wait += seconds_since(t0);
            if (!b) {
                out_of_data = true;
                break;
            }
            targets += check_batch(*b, o.model.vocab, unigram);
            b->wait_on(model->stream());  // GPU: the compute stream waits for this batch's copy; no host sync
            const trainer::batch_view all = view_of(*b);
            for (std::uint64_t row = 0; row < all.rows; row += o.batch_size) {  // its micro-batches
                const std::uint64_t at = row * all.seq_len;
                model->forward_backward({all.inputs + at, all.targets + at, all.positions ? all.positions + at : nullptr,
                                         std::min(o.batch_size, all.rows - row), all.seq_len},
                                        /*backward=*/true);
            }
            b->release(model->stream());  // the slot is refilled only after this step's kernels read it
        }
        if (out_of_data) break;
        double global_targets = static_cast<double>(targets);
        comm.allreduce_sum(&global_targets, 1);
        model->allreduce_grads();
        ++step;
        const float lr = trainer::learning_rate(o.optimizer, step);
        model->adamw({.lr = lr, .grad_scale = global_targets > 0 ? static_cast<float>(1.0 / global_targets) : 0.0f, .step = step});
        tokens += comm.size() * o.batch_size * o.seq_len * o.grad_accum;
        window_tokens += comm.size() * o.batch_size * o.seq_len * o.grad_accum;
        window_targets += global_targets;
        ++window_steps;

        if (step == 1 || step % o.log_every == 0 || step == o.max_steps) {
            double loss_sum = model->take_loss_sum() + std::exchange(pending_train_loss, 0.0);  // waits for the device: only when logging
            comm.allreduce_sum(&loss_sum, 1);
            const double loss = window_targets > 0 ? loss_sum / window_targets : 0;
            const double seconds = seconds_since(window_start);
            const double stall = seconds > 0 ? std::min(1.0, window_wait / seconds) : 0;
            const double tps = seconds > 0 ? static_cast<double>(window_tokens) / seconds : 0;
            if (!first_loss) first_loss = loss;
            last_loss = loss;
            train_seconds += seconds;
            total_wait += window_wait;
            const auto gpu_now = take_gpu();
            if (o.json) {
                nlohmann::json j{{"step", step},
                                 {"loss", loss},
                                 {"lr", lr},
                                 {"tokens", tokens},
                                 {"tokens_per_s", tps},
                                 {"stall_fraction", stall},
                                 {"rss_bytes", feedline::resident_bytes()},
                                 {"gpu_bytes", model->device_bytes()}};
                add_telemetry(j, gpu_now);
                say(tools::json_text(j));
            } else {
                say(fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | {:>9.0f} tok/s | data stall {:5.2f}% | rss {} MiB | gpu {} MiB",
                                step, o.max_steps, loss, lr, tps, 100 * stall, feedline::resident_bytes() >> 20,
                                model->device_bytes() >> 20));
            }
            window_start = clock_type::now();
            window_wait = 0;
            window_tokens = 0;
            window_targets = 0;
            window_steps = 0;
        }
        if (o.eval_every && step % o.eval_every == 0)
            if (auto e = evaluate()) {
                last_eval = e;
                say(o.json ? tools::json_text(nlohmann::json{{"step", step}, {"eval_loss", *e}})
                           : fmt::format("step {:>5} | eval loss {:.4f}", step, *e));
                window_start = clock_type::now();  // evaluation time is not training time
            }
        if (!o.checkpoint.empty() && o.checkpoint_every && step % o.checkpoint_every == 0) {
            save(o.checkpoint);
            window_start = clock_type::now();
        }
    }
    if (window_steps > 0) {  // the tail since the last progress line counts for the summary
        double loss_sum = model->take_loss_sum() + std::exchange(pending_train_loss, 0.0);
        comm.allreduce_sum(&loss_sum, 1);
        if (window_targets > 0) last_loss = loss_sum / window_targets;
        train_seconds += seconds_since(window_start);
        total_wait += window_wait;
    }
    if (!o.checkpoint.empty()) save(o.checkpoint);
    if (auto e = evaluate()) last_eval = e;

    std::vector<double> counts(unigram.begin(), unigram.end());
    comm.allreduce_sum(counts.data(), counts.size());
    const double entropy = unigram_entropy(counts);
    const double tps = train_seconds > 0 ? static_cast<double>(tokens - tokens_at_start) / train_seconds : 0;
    const double stall = train_seconds > 0 ? total_wait / train_seconds : 0;
    // The summary line, and the finding feedline-doctor diagnose draws from it (the same rules).
    nlohmann::json j{{"summary", true},
                     {"steps", step},
                     {"tokens", tokens},
                     {"seconds", train_seconds},
                     {"tokens_per_s", tps},
                     {"stall_fraction", stall},
                     {"unigram_entropy", entropy},
                     {"device", model->describe()},
                     {"micro_batch", o.batch_size},
                     {"grad_accum", o.grad_accum},
                     {"data_workers", data.stats().workers},
                     {"cores", feedline::read_topology().usable_cores()},
                     {"gpu_telemetry", gpu_monitor ? "nvml" : gpu_monitor_note},
                     {"pipeline", nlohmann::json::parse(data.stats().to_json())}};
    if (first_loss) j["first_loss"] = *first_loss;
    if (last_loss) j["final_loss"] = *last_loss;
    if (last_eval) j["eval_loss"] = *last_eval;
    take_gpu();
    add_telemetry(j, std::nullopt);
    // Over the whole run: the mean utilization, and the highest interval's memory (what headroom must hold).
    if (gpu_samples > 0) j["gpu_utilization"] = gpu_busy_sum / gpu_samples;
    if (gpu_memory_total > 0) {
        j["gpu_memory_used_bytes"] = gpu_memory_peak;
        j["gpu_memory_total_bytes"] = gpu_memory_total;
    }
    std::vector<doctor::finding> findings;
    try {
        std::istringstream line(tools::json_text(j));
        findings = doctor::diagnose(doctor::parse_log(line, "this run's summary"));
    } catch (const feedline::error& e) {
        say(std::string("note: no diagnosis: ") + e.what());
    }
    nlohmann::json codes = nlohmann::json::array();
    for (const auto& f : findings) codes.push_back(f.code);
    j["findings"] = codes;
    if (o.json) {
        say(tools::json_text(j));
    } else if (first_loss && last_loss) {
        std::string verdict = findings.empty() ? std::string("no finding: the data path kept up") : std::string();
        for (const auto& f : findings) verdict += (verdict.empty() ? "" : "; ") + f.code + ": " + f.action;
        say(fmt::format(
            "\nSummary: {} steps on {} in {:.1f} s. The training loss fell from {:.3f} to {:.3f} nats per token ({:.0f}% lower){}; the "
            "unigram entropy of the tokens trained on is {:.3f}, so the model learned {:.3f} nats of context beyond token frequencies. "
            "Throughput {:.0f} tokens/s; the trainer waited for data {:.2f}% of the time.\nfeedline-doctor: {}",
            step, model->describe(), train_seconds, *first_loss, *last_loss, 100 * (1 - *last_loss / *first_loss),
            last_eval ? fmt::format(", held-out loss {:.3f}", *last_eval) : std::string(), entropy, entropy - *last_loss, tps, 100 * stall,
            verdict));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    o.model.vocab = 0;  // from --vocab-size, else from --tokenizer (vocabulary_from), never the model's default
    CLI::App app{"Train a small next-token model on a feedline dataset (GPU via cuBLAS if present, else CPU via OpenBLAS)"};
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides an earlier one
    app.add_option(
           "--data", o.data,
           "training data: Megatron prefix, llm.c shard pattern or directory, JSONL / text (tokenized on the fly with --tokenizer), "
           "or a blend: \"0.7 data/web 0.3 code/*.jsonl\"")
        ->required();
    app.add_option("--eval-data", o.eval_data, "held-out data for evaluation (same forms as --data)");
    app.add_option("--max-steps", o.max_steps, "optimizer steps in all (a resumed run continues up to this)")->capture_default_str();
    app.add_option("--max-seconds", o.max_seconds, "stop after this much wall time (0: no limit)")->capture_default_str();
    app.add_option("--batch-size", o.batch_size, "sequences per micro-batch on each rank")->capture_default_str();
    app.add_option("--seq-len", o.seq_len, "tokens per sequence")->capture_default_str();
    app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--mode", o.mode, "windows (GPT-style, crossing documents) or packed (whole documents, context kept inside each)")
        ->check(CLI::IsMember({"windows", "packed"}))
        ->capture_default_str();
    app.add_option("--device", o.device, "auto (GPU by local rank if present), cpu, or cuda:N")->capture_default_str();
    app.add_option("--precision", o.precision, "GPU GEMM operands: auto (bf16 on compute capability >= 8.0), bf16 or fp32")
        ->check(CLI::IsMember({"auto", "bf16", "fp32"}))
        ->capture_default_str();
    app.add_option("--seed", o.seed, "seed for the data order and the initial weights")->capture_default_str();
    app.add_option("--workers", o.workers, "feedline worker threads per rank (0: from the machine)")->capture_default_str();
    app.add_option("--vocab-size", o.model.vocab, "vocabulary size (default: from --tokenizer)");
    app.add_option("--tokenizer", o.tokenizer, "sentencepiece model the data was packed with (gives the vocabulary size)");
    app.add_option("--context", o.model.context, "tokens each prediction sees")->capture_default_str()->check(CLI::Range(1, 64));
    app.add_option("--embed", o.model.embed, "embedding width")->capture_default_str()->check(CLI::Range(1, 4096));
    app.add_option("--hidden", o.model.hidden, "hidden layer width")->capture_default_str()->check(CLI::Range(1, 65536));
    app.add_option("--lr", o.optimizer.lr, "peak learning rate (AdamW)")->capture_default_str();
    app.add_option("--warmup", o.optimizer.warmup, "linear warmup steps")->capture_default_str();
    app.add_option("--decay-steps", o.decay_steps, "cosine decay horizon (0: --max-steps)")->capture_default_str();
    app.add_option("--weight-decay", o.optimizer.weight_decay, "AdamW weight decay on the matrices")->capture_default_str();
    app.add_option("--log-every", o.log_every, "progress line every N steps")->capture_default_str()->check(CLI::PositiveNumber);
    app.add_option("--eval-every", o.eval_every, "evaluate on --eval-data every N steps (0: only at the end)")->capture_default_str();
    app.add_option("--eval-batches", o.eval_batches, "batches per evaluation")->capture_default_str();
    app.add_option(
        "--checkpoint", o.checkpoint,
        "directory to keep checkpoints in (DIR/step-N: model, optimizer, data position; at the end and every --checkpoint-every)");
    app.add_option("--keep-checkpoints", o.keep_checkpoints,
                   "checkpoints of this run's lineage to keep under --checkpoint, newest first (0: all); others are never removed")
        ->capture_default_str();
    app.add_option("--checkpoint-every", o.checkpoint_every, "also save every N steps (0: only at the end)")->capture_default_str();
    app.add_option("--resume", o.resume,
                   "continue from a --checkpoint directory (its newest intact checkpoint) or one DIR/step-N (same model and batch shape)");
    app.add_flag("--json", o.json, "progress as JSON lines (step, loss, tokens_per_s, stall_fraction, ...)");
    // The pipeline's other options (shuffle, tail, prefetch, io_backend, text options, ...) as they are
    // declared; the ones above are the trainer's own.
    tools::add_pipeline_options(
        app, o.data_options,
        {.except = {"batch_size", "seq_len", "seed", "mode", "workers", "device", "rank", "world_size", "max_steps", "tokenizer"}});
    if (const int code = tools::parse_command_line("feedline-train", 1, app, argc, argv); code >= 0) return code;
    std::unique_ptr<trainer::communicator> comm;
    try {
        comm = std::make_unique<trainer::communicator>(&argc, &argv);
        return run(o, *comm);
    } catch (...) {
        // One line naming what failed (a resource limit with its hint), then the other ranks, which
        // may be waiting in a collective, are ended too.
        const int code = tools::run_tool("feedline-train", 1, []() -> int { throw; });
        if (comm) comm->abort(code);
        return code;
    }
}
