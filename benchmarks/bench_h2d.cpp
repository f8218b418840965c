// bench_h2d: does the pinned ring move batches to the GPU as fast as the copy engine allows, and does
// the trainer wait for batches when producers keep up?
//
// Same run, interleaved rounds (medians):
//   single_pinned  one pinned buffer, back-to-back cudaMemcpyAsync on one stream (the copy engine's limit)
//   pageable       the same from ordinary malloc'd memory (what a ring without pinning would get)
//   ring           a producer thread publishing batches through pinned_ring, a consumer taking them
//                  with wait_on + release on its own stream (the full slot protocol, no fill cost)
// Then a paced run: the consumer runs a synthetic compute step (~2x a copy) per batch while a producer
// fills every batch (memset) and publishes: consumer wait per batch, p50 / p99.
// Last line: one JSON object with ring_gbps, single_pinned_gbps, pageable_gbps, ring_vs_pinned,
// pageable_vs_pinned, wait_p50_us, wait_p99_us (or {"skipped": reason} without a GPU).
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
    const std::uint64_t first = seq;
    const int paced = 200;
    std::thread producer([&] {
        for (std::uint64_t k = first; k < first + paced; ++k) {
            std::byte* p = ring.acquire(k);
            if (p == nullptr) return;
            std::memset(p, static_cast<int>(k & 0xff), batch_bytes);
            ring.publish(k, batch_bytes);
        }
    });
    std::vector<double> waits;
    for (int i = 0; i < paced; ++i) {
        auto t0 = clock_type::now();
        auto h = ring.next();
        waits.push_back(seconds_since(t0) * 1e6);
        h->wait_on(s);
        FEEDLINE_CUDA_CHECK(test::launch_spin(s, cycles));
        h->release(s);
        // A trainer reads its loss now and then: keep the host within a few steps of the GPU.
        if (i % 4 == 3) FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    producer.join();
    FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<double> steady(waits.begin() + 8, waits.end());
    std::sort(steady.begin(), steady.end());
    const double p50 = steady[steady.size() / 2], p99 = steady[steady.size() * 99 / 100];
    std::printf(
        "paced (compute %.2f ms per batch; copy %.2f ms, producer memsets %zu MiB in %.2f ms): consumer wait p50 %.1f us, "
        "p99 %.1f us\n",
        step_ms, copy_ms, batch_bytes >> 20, fill_ms, p50, p99);
    std::printf(
        "{\"ring_gbps\": %.2f, \"single_pinned_gbps\": %.2f, \"pageable_gbps\": %.2f, \"ring_vs_pinned\": %.3f, "
        "\"pageable_vs_pinned\": %.3f, \"step_ms\": %.3f, \"wait_p50_us\": %.1f, \"wait_p99_us\": %.1f}\n",
        via_ring, single, page, via_ring / single, page / single, step_ms, p50, p99);
    cudaFreeHost(pinned);
    cudaFree(device);
    return 0;
}
