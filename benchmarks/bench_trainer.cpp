// bench_trainer: does feeding the sample trainer from disk through feedline cost it anything?
// The same model and optimizer step run (a) fed by a feedline::pipeline over a real dataset and (b) fed
// from a handful of batches already in memory (no I/O, no sampling, no staging), interleaved round by
// round so machine drift hits both alike. Reports tokens/s of each, their ratio (target >= 0.99), the
// fed run's data stall (time the trainer waited in next()), the GEMM rate, and on a GPU the GEMM
// utilisation against the card's dense bf16 peak. Last line: one JSON object.
// Usage: bench_trainer --data DATASET --vocab-size V [--rounds R] [--steps S] [--device auto|cpu]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <feedline/pipeline.hpp>

#include <cstdio>
#include <memory>
#include <vector>

#include "bench_common.hpp"
#include "cpu_backend.hpp"
#include "model.hpp"
#ifdef FEEDLINE_TRAINER_CUDA
#include <cuda_runtime_api.h>

#include "cuda_backend.hpp"
#endif

namespace fb = feedline::bench;

namespace {

// Batches held in memory (device memory for the GPU backend), cycled: the "synthetic" source.
struct resident_batches {
    std::vector<std::vector<std::int32_t>> host;  // inputs then targets, [2, B, T] each
    std::vector<trainer::batch_view> views;
    std::vector<void*> device;
    ~resident_batches() {
#ifdef FEEDLINE_TRAINER_CUDA
        for (void* p : device) cudaFree(p);
#endif
    }
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"The sample trainer fed by feedline vs fed from memory"};
    std::string data = "demo-output/corpus", device = "auto";
    trainer::model_config model;
    std::uint64_t batch_size = 16, seq_len = 128, steps = 30;
    int rounds = 5;
    double peak_tflops = 0;
    app.add_option("--data", data, "dataset (e.g. the demo's shards)")->capture_default_str();
    app.add_option("--vocab-size", model.vocab, "vocabulary of the dataset's tokenizer")->capture_default_str();
    app.add_option("--hidden", model.hidden, "hidden width")->capture_default_str();
    app.add_option("--batch-size", batch_size, "rows per step")->capture_default_str();
    app.add_option("--seq-len", seq_len, "tokens per row")->capture_default_str();
    app.add_option("--steps", steps, "optimizer steps per measurement")->capture_default_str();
    app.add_option("--rounds", rounds, "interleaved rounds (medians reported)")->capture_default_str();
    app.add_option("--device", device, "auto or cpu")->capture_default_str();
    app.add_option("--peak-tflops", peak_tflops, "GPU dense bf16 peak for the utilisation figure (0: from the device name)");
    CLI11_PARSE(app, argc, argv);

    const trainer::optimizer_config opt;
    const auto initial = trainer::initial_parameters(model, 1);
    std::unique_ptr<trainer::backend> backend;
    feedline::device_choice pipeline_device = feedline::device_kind::cpu;
#ifdef FEEDLINE_TRAINER_CUDA
    if (device != "cpu" && feedline::gpu_probe()) {
        backend = trainer::make_cuda_backend(model, opt, initial, 0, trainer::gpu_precision::automatic, nullptr);
        pipeline_device = {feedline::device_kind::cuda, 0};
    }
#endif
    if (!backend) backend = std::make_unique<trainer::cpu_backend>(model, opt, initial);
    std::printf("bench_trainer: %s, %llu x %llu tokens per step, %llu steps per measurement, %d rounds\n", backend->describe().c_str(),
                (unsigned long long)batch_size, (unsigned long long)seq_len, (unsigned long long)steps, rounds);

    feedline::pipeline fed(data, {.batch_size = batch_size, .seq_len = seq_len, .seed = 7, .workers = 1, .device = pipeline_device});

    // The in-memory source: 8 real batches from the same data, copied out once.
    resident_batches resident;
    {
        feedline::pipeline source(
            data,
            {.batch_size = batch_size, .seq_len = seq_len, .seed = 8, .workers = 1, .device = feedline::device_kind::cpu, .max_steps = 8});
        for (auto& b : source) {
            std::vector<std::int32_t> v(b.host_inputs().begin(), b.host_inputs().end());
            v.insert(v.end(), b.host_targets().begin(), b.host_targets().end());
            resident.host.push_back(std::move(v));
        }
        for (auto& v : resident.host) {
            const std::int32_t* p = v.data();
#ifdef FEEDLINE_TRAINER_CUDA
            if (pipeline_device.kind != feedline::device_kind::cpu) {
                void* d = nullptr;
                FEEDLINE_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(std::int32_t)));
                FEEDLINE_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
                resident.device.push_back(d);
                p = static_cast<const std::int32_t*>(d);
            }
#endif
            resident.views.push_back({p, p + batch_size * seq_len, nullptr, batch_size, seq_len});
        }
    }
    const float scale = 1.0f / static_cast<float>(batch_size * seq_len);
    std::uint64_t step = 0;
    auto finish_step = [&] { backend->adamw({.lr = 1e-3f, .grad_scale = scale, .step = ++step}); };
    double stall_s = 0, fed_s = 0;

    fb::interleaved cases;
    cases.add("fed by feedline (tokens/s)", [&] {
        (void)backend->take_loss_sum();  // drains the device before timing
        const auto t0 = fb::clock_type::now();
        double waited = 0;
        for (std::uint64_t s = 0; s < steps; ++s) {
            backend->zero_grads();
            const auto w0 = fb::clock_type::now();
            auto b = fed.next();
            waited += fb::seconds_since(w0);
            b->wait_on(backend->stream());
            backend->forward_backward({b->inputs(), b->targets(), nullptr, b->size(), b->seq_len()}, true);
            b->release(backend->stream());
            finish_step();
        }
        (void)backend->take_loss_sum();  // waits for the last step's kernels
        const double seconds = fb::seconds_since(t0);
        stall_s += waited;
        fed_s += seconds;
        return static_cast<double>(steps * batch_size * seq_len) / seconds;
    });
    cases.add("fed from memory (tokens/s)", [&] {
        (void)backend->take_loss_sum();
        const auto t0 = fb::clock_type::now();
        for (std::uint64_t s = 0; s < steps; ++s) {
            backend->zero_grads();
            backend->forward_backward(resident.views[s % resident.views.size()], true);
            finish_step();
        }
        (void)backend->take_loss_sum();
        return static_cast<double>(steps * batch_size * seq_len) / fb::seconds_since(t0);
    });
    auto results = cases.run(rounds, "tokens/s");
    const double fed_tps = results["fed by feedline (tokens/s)"].median, mem_tps = results["fed from memory (tokens/s)"].median;
    const double gflops = fed_tps * model.gemm_flops_per_token() * 1e-9;

    nlohmann::json j{{"device", backend->describe()},
                     {"fed_tokens_per_s", fed_tps},
                     {"synthetic_tokens_per_s", mem_tps},
                     {"fed_vs_synthetic", fed_tps / mem_tps},
                     {"stall_fraction", fed_s > 0 ? stall_s / fed_s : 0},
                     {"gemm_gflops", gflops}};
    if (pipeline_device.kind != feedline::device_kind::cpu) {
        if (peak_tflops <= 0) {
            const std::string name = feedline::gpu_probe().reason;
            peak_tflops = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ? 989.0
                          : name.find("A100") != std::string::npos                                         ? 312.0
                                                                                                           : 0.0;
        }
        if (peak_tflops > 0) j["gemm_utilisation_vs_bf16_peak"] = gflops * 1e-3 / peak_tflops;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
}
