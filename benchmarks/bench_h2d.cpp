// bench_h2d: does the pinned ring move batches to the GPU as fast as the copy engine allows, and does
// the trainer wait for batches when producers keep up?
//
// Same run, interleaved rounds (medians):
//   single_pinned  one pinned buffer, back-to-back cudaMemcpyAsync on one stream (the copy engine's limit)
//   pageable       the same from ordinary malloc'd memory (what a ring without pinning would get)
//   ring           a producer thread publishing batches through pinned_ring, a consumer taking them
//                  with wait_on + release on its own stream (the full slot protocol, no fill cost)
// Then a paced run with 4 slots and with 8: the consumer runs a synthetic compute step (~2x a copy or
// a fill) per batch while a producer fills every batch (memset) and publishes: the consumer's wait in
// next() and the GPU's idle time between steps (what a stall costs), p50 / p99.
// Last line: one JSON object with ring_gbps, single_pinned_gbps, pageable_gbps, ring_vs_pinned,
// pageable_vs_pinned, wait_p50_us, wait_p99_us, gpu_gap_p50_us, gpu_gap_p99_us, gpu_idle_fraction (4
// slots), gpu_idle_fraction_8_slots, wait_p99_us_8_slots (or {"skipped": reason} without a GPU).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <feedline/device/make_ring.hpp>

#include "bench_common.hpp"
#include "spin_kernel.hpp"

using namespace feedline;
using namespace feedline::bench;

namespace {

constexpr std::size_t batch_bytes = 32u << 20;  // B=32, T=1024 as int64 inputs + targets is 0.5 MiB; 32 MiB
                                                // is a large-batch, long-context step and amortises launch costs
constexpr int batches = 64;

double copy_loop_gbps(const void* src, void* dst, cudaStream_t s) {
    auto t0 = clock_type::now();
    for (int i = 0; i < batches; ++i) FEEDLINE_CUDA_CHECK(cudaMemcpyAsync(dst, src, batch_bytes, cudaMemcpyHostToDevice, s));
    FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    return double(batch_bytes) * batches / seconds_since(t0) / 1e9;
}

double ring_gbps(pinned_ring& ring, std::uint64_t& next_seq, cudaStream_t s) {
    const std::uint64_t first = next_seq;
    std::thread producer([&] {
        for (std::uint64_t k = first; k < first + batches; ++k) {
            std::byte* p = ring.acquire(k);
            if (p == nullptr) return;
            ring.publish(k, batch_bytes);
        }
    });
    auto t0 = clock_type::now();
    for (int i = 0; i < batches; ++i) {
        auto h = ring.next();
        h->wait_on(s);
        h->release(s);
    }
    FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    double gbps = double(batch_bytes) * batches / seconds_since(t0) / 1e9;
    producer.join();
    next_seq = first + batches;
    return gbps;
}

struct paced_result {
    double wait_p50_us = 0, wait_p99_us = 0;  // the trainer's host thread in next()
    double gap_p50_us = 0, gap_p99_us = 0;    // the GPU between the end of one step's compute and the start of the next
    double idle_fraction = 0;                 // those gaps over the whole run, from the first step's start
};

// Paced: the consumer launches a compute step of `cycles` per batch and synchronizes every 4 steps (a
// trainer reading its loss), while a producer fills every batch (memset) and publishes. The host's
// wait in next() is not what costs: the GPU's idle time between steps is (events around each step;
// the gap includes any wait for the batch's copy), so both are reported.
paced_result paced(pinned_ring& ring, std::uint64_t& next_seq, cudaStream_t s, long long cycles) {
    const std::uint64_t first = next_seq;
    const int paced = 200;
    std::thread producer([&] {
        for (std::uint64_t k = first; k < first + paced; ++k) {
            std::byte* p = ring.acquire(k);
            if (p == nullptr) return;
            std::memset(p, static_cast<int>(k & 0xff), batch_bytes);
            ring.publish(k, batch_bytes);
        }
    });
    std::vector<cudaEvent_t> began(paced), ended(paced);
    for (int i = 0; i < paced; ++i) FEEDLINE_CUDA_CHECK(cudaEventCreate(&began[i])), FEEDLINE_CUDA_CHECK(cudaEventCreate(&ended[i]));
    std::vector<double> waits;
    for (int i = 0; i < paced; ++i) {
        auto t0 = clock_type::now();
        auto h = ring.next();
        waits.push_back(seconds_since(t0) * 1e6);
        h->wait_on(s);
        FEEDLINE_CUDA_CHECK(cudaEventRecord(began[i], s));
        FEEDLINE_CUDA_CHECK(test::launch_spin(s, cycles));
        FEEDLINE_CUDA_CHECK(cudaEventRecord(ended[i], s));
        h->release(s);
        // A trainer reads its loss now and then: keep the host within a few steps of the GPU.
        if (i % 4 == 3) FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    producer.join();
    FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    next_seq = first + paced;
    constexpr int warmup = 8;
    std::vector<double> gaps;
    double idle_ms = 0;
    for (int i = warmup + 1; i < paced; ++i) {
        float ms = 0;
        FEEDLINE_CUDA_CHECK(cudaEventElapsedTime(&ms, ended[i - 1], began[i]));
        gaps.push_back(double(ms) * 1e3);
        idle_ms += ms;
    }
    float total_ms = 0;
    FEEDLINE_CUDA_CHECK(cudaEventElapsedTime(&total_ms, began[warmup], ended[paced - 1]));
    for (int i = 0; i < paced; ++i) cudaEventDestroy(began[i]), cudaEventDestroy(ended[i]);
    std::vector<double> steady(waits.begin() + warmup, waits.end());
    std::sort(steady.begin(), steady.end());
    std::sort(gaps.begin(), gaps.end());
    return {.wait_p50_us = steady[steady.size() / 2],
            .wait_p99_us = steady[steady.size() * 99 / 100],
            .gap_p50_us = gaps[gaps.size() / 2],
            .gap_p99_us = gaps[gaps.size() * 99 / 100],
            .idle_fraction = idle_ms / total_ms};
}

}  // namespace

int main() {
    auto gpu = gpu_probe();
    if (!gpu) {
        std::printf("bench_h2d: %s\n{\"skipped\": \"%s\"}\n", gpu.reason.c_str(), gpu.reason.c_str());
        return 0;
    }
    FEEDLINE_CUDA_CHECK(cudaSetDevice(0));
    std::printf("bench_h2d: %s, batches of %zu MiB, %d per measurement\n", gpu.reason.c_str(), batch_bytes >> 20, batches);

    cudaStream_t s;
    FEEDLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void* pinned = nullptr;
    void* device = nullptr;
    FEEDLINE_CUDA_CHECK(cudaHostAlloc(&pinned, batch_bytes, cudaHostAllocPortable));
    FEEDLINE_CUDA_CHECK(cudaMalloc(&device, batch_bytes));
    std::vector<std::byte> pageable(batch_bytes, std::byte{1});
    std::memset(pinned, 1, batch_bytes);
    pinned_ring ring({.slots = 4, .slot_bytes = batch_bytes});
    std::printf("%s\n", ring.description().c_str());
    std::uint64_t seq = 0;

    interleaved cases;
    cases.add("single_pinned (GB/s)", [&] { return copy_loop_gbps(pinned, device, s); });
    cases.add("pageable (GB/s)", [&] { return copy_loop_gbps(pageable.data(), device, s); });
    cases.add("ring (GB/s)", [&] { return ring_gbps(ring, seq, s); });
    auto r = cases.run(7, "GB/s");
    const double single = r["single_pinned (GB/s)"].median, page = r["pageable (GB/s)"].median, via_ring = r["ring (GB/s)"].median;

    // Paced: compute ~2x a copy per batch, producer fills every batch.
    cudaEvent_t a, b;
    FEEDLINE_CUDA_CHECK(cudaEventCreate(&a));
    FEEDLINE_CUDA_CHECK(cudaEventCreate(&b));
    FEEDLINE_CUDA_CHECK(cudaEventRecord(a, s));
    FEEDLINE_CUDA_CHECK(test::launch_spin(s, 10'000'000));
    FEEDLINE_CUDA_CHECK(cudaEventRecord(b, s));
    FEEDLINE_CUDA_CHECK(cudaEventSynchronize(b));
    float spin_ms = 0;
    FEEDLINE_CUDA_CHECK(cudaEventElapsedTime(&spin_ms, a, b));
    const double copy_ms = double(batch_bytes) / (single * 1e9) * 1e3;
    // The producer's fill (one thread memsetting a slot) can be slower than the copy itself: on PCIe 5
    // the copy runs at ~50 GB/s, a memset at ~10. Compute is sized to twice the slower of the two, so
    // the case measures whether staging overlaps with compute, not whether one thread can fill faster.
    const auto fill_start = clock_type::now();
    for (int i = 0; i < 4; ++i) std::memset(pinned, i, batch_bytes);
    const double fill_ms = seconds_since(fill_start) * 1e3 / 4;
    const double step_ms = 2 * std::max(copy_ms, fill_ms);
    const long long cycles = static_cast<long long>(10'000'000.0 * step_ms / spin_ms);
    const paced_result p4 = paced(ring, seq, s, cycles);
    pinned_ring deeper({.slots = 8, .slot_bytes = batch_bytes});
    std::uint64_t deeper_seq = 0;
    const paced_result p8 = paced(deeper, deeper_seq, s, cycles);
    for (const auto& [slots, p] : {std::pair{4, p4}, std::pair{8, p8}})
        std::printf(
            "paced, %d slots (compute %.2f ms per batch; copy %.2f ms, producer memsets %zu MiB in %.2f ms): consumer wait p50 "
            "%.1f us, p99 %.1f us; GPU idle between steps p50 %.1f us, p99 %.1f us, %.4f of the time\n",
            slots, step_ms, copy_ms, batch_bytes >> 20, fill_ms, p.wait_p50_us, p.wait_p99_us, p.gap_p50_us, p.gap_p99_us, p.idle_fraction);
    std::printf(
        "{\"ring_gbps\": %.2f, \"single_pinned_gbps\": %.2f, \"pageable_gbps\": %.2f, \"ring_vs_pinned\": %.3f, "
        "\"pageable_vs_pinned\": %.3f, \"step_ms\": %.3f, \"wait_p50_us\": %.1f, \"wait_p99_us\": %.1f, \"gpu_gap_p50_us\": %.1f, "
        "\"gpu_gap_p99_us\": %.1f, \"gpu_idle_fraction\": %.5f, \"gpu_idle_fraction_8_slots\": %.5f, \"wait_p99_us_8_slots\": %.1f}\n",
        via_ring, single, page, via_ring / single, page / single, step_ms, p4.wait_p50_us, p4.wait_p99_us, p4.gap_p50_us, p4.gap_p99_us,
        p4.idle_fraction, p8.idle_fraction, p8.wait_p99_us);
    cudaFreeHost(pinned);
    cudaFree(device);
    return 0;
}
