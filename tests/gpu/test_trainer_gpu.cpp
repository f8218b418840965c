// The sample trainer's CUDA backend against its CPU backend on the same batch: losses and gradients
// agree (tightly in fp32, within bf16 rounding with bf16 operands), a few AdamW steps keep the
// parameters together, and feedline-train on a GPU lowers the loss. Every case skips with the reason
// on a machine without a GPU.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <feedline/device/cuda_runtime.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "cpu_backend.hpp"
#include "cuda_backend.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace ft = feedline::test;

namespace {

void require_gpu() {
    if (auto gpu = feedline::gpu_probe(); !gpu) ft::skip(gpu.reason);
}

// [4, 33] batch in host and device memory; row 2 is packed with a document starting at 10, and its
// last 3 targets are padding.
struct gpu_batch {
    static constexpr std::uint64_t rows = 4, T = 33;
    std::vector<std::int32_t> host;  // inputs, targets, positions
    void* device = nullptr;
    explicit gpu_batch(std::uint32_t vocab) {
        std::mt19937 rng(11);
        host.resize(3 * rows * T);
        for (std::uint64_t i = 0; i < rows * T; ++i) {
            host[i] = static_cast<std::int32_t>(rng() % vocab);
            host[rows * T + i] = static_cast<std::int32_t>(rng() % vocab);
            const std::uint64_t r = i / T, t = i % T;
            host[2 * rows * T + i] = static_cast<std::int32_t>(r == 2 && t >= 10 ? t - 10 : t);
        }
        for (std::uint64_t t = T - 3; t < T; ++t) host[rows * T + 2 * T + t] = -1;
        FEEDLINE_CUDA_CHECK(cudaMalloc(&device, host.size() * sizeof(std::int32_t)));
        FEEDLINE_CUDA_CHECK(cudaMemcpy(device, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
        FEEDLINE_CUDA_CHECK(
            cudaDeviceSynchronize());  // pageable copies may finish after cudaMemcpy returns; the backends use their own streams
    }
    ~gpu_batch() { cudaFree(device); }
    trainer::batch_view view(const std::int32_t* base, bool packed) const {
        return {base, base + rows * T, packed ? base + 2 * rows * T : nullptr, rows, T};
    }
    trainer::batch_view on_host(bool packed) const { return view(host.data(), packed); }
    trainer::batch_view on_device(bool packed) const { return view(static_cast<const std::int32_t*>(device), packed); }
};

double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::abs(x)));
    return m;
}

}  // namespace

TEST_CASE("trainer on GPU: losses and gradients equal the CPU backend's (fp32 tightly, bf16 within rounding)") {
    require_gpu();
    const trainer::model_config c{.vocab = 300, .context = 3, .embed = 16, .hidden = 32};
    const auto initial = trainer::initial_parameters(c, 2);
    // eps = 1 makes AdamW's update nearly linear in the gradient, so rounding differences between the
    // backends cannot flip the sign of a near-zero gradient's full-size update.
    trainer::optimizer_config o;
    o.eps = 1.0f;
    gpu_batch batch(c.vocab);
    for (auto precision : {trainer::gpu_precision::fp32, trainer::gpu_precision::bf16}) {
        const bool bf16 = precision == trainer::gpu_precision::bf16;
        CAPTURE(bf16);
        for (bool packed : {false, true}) {
            CAPTURE(packed);
            trainer::cpu_backend cpu(c, o, initial);
            auto gpu = trainer::make_cuda_backend(c, o, initial, 0, precision, nullptr);
            cpu.zero_grads();
            gpu->zero_grads();
            cpu.forward_backward(batch.on_host(packed), true);
            gpu->forward_backward(batch.on_device(packed), true);
            const double cpu_loss = cpu.take_loss_sum(), gpu_loss = gpu->take_loss_sum();
            CHECK(gpu_loss == doctest::Approx(cpu_loss).epsilon(bf16 ? 1e-2 : 1e-5));
            std::vector<float> g_cpu, g_gpu;
            cpu.save_gradients(g_cpu);
            gpu->save_gradients(g_gpu);
            REQUIRE(g_cpu.size() == g_gpu.size());
            const double scale = max_abs(g_cpu);
            double worst = 0;
            for (std::size_t i = 0; i < g_cpu.size(); ++i) worst = std::max(worst, double(std::abs(g_cpu[i] - g_gpu[i])));
            CHECK(worst <= (bf16 ? 3e-2 : 1e-4) * scale);

            // Three AdamW steps on the same batch keep the two models together.
            for (std::uint64_t s = 1; s <= 3; ++s) {
                for (trainer::backend* b : {static_cast<trainer::backend*>(&cpu), gpu.get()}) {
                    if (s > 1) {
                        b->zero_grads();
                        b->forward_backward(b == &cpu ? batch.on_host(packed) : batch.on_device(packed), true);
                    }
                    b->adamw({.lr = 1e-3f, .grad_scale = 1.0f / 100, .step = s});
                }
            }
            std::vector<float> p_cpu, p_gpu, m, v;
            cpu.save_state(p_cpu, m, v);
            gpu->save_state(p_gpu, m, v);
            double drift = 0;
            for (std::size_t i = 0; i < p_cpu.size(); ++i) drift = std::max(drift, double(std::abs(p_cpu[i] - p_gpu[i])));
            CHECK(drift <= (bf16 ? 1e-4 : 1e-6));
        }
    }
}

TEST_CASE("trainer on GPU: feedline-train --device auto trains on the GPU and the loss falls") {
    require_gpu();
    ft::trainer_corpus data;
    auto r = ft::run(data.train_command("--device auto --max-steps 60 --lr 1e-2 --warmup 5 --log-every 10"), data.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(r.out.find("on cuda:0") != std::string::npos);
    const auto lines = ft::progress_lines(r.out);
    REQUIRE(lines.size() >= 2);
    CHECK(lines.back()["loss"].get<double>() < 0.7 * lines.front()["loss"].get<double>());
    CHECK(lines.back()["gpu_bytes"].get<double>() > 0);
}
