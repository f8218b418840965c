// The pinned ring on a real GPU: device batches equal host batches (checksums computed on the GPU),
// the H2D copy of a batch runs while the previous batch's compute runs (event timestamps around a
// synthetic compute kernel), and creating/destroying rings leaks no device memory. Every case skips
// with the reason when this machine has no usable GPU (ctest label gpu).
#include <doctest/doctest.h>

#include <feedline/device/make_ring.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "spin_kernel.hpp"
#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

void need_gpu() {
    auto gpu = gpu_probe();
    if (!gpu) ft::skip(gpu.reason);
}

void fill(std::byte* p, std::size_t n, std::uint64_t seq) {
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((seq * 131 + i * 7) & 0xff);
}

struct stream_guard {
    cudaStream_t s = nullptr;
    stream_guard() { FEEDLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~stream_guard() { cudaStreamDestroy(s); }
};

float ms_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    FEEDLINE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

}  // namespace

TEST_CASE("PinnedRing.Content.DeviceBatchesEqualHostBatches") {
    need_gpu();
    for (bool pin : {true, false}) {
        CAPTURE(pin);
        pinned_ring ring({.slots = 3, .slot_bytes = 1 << 20, .pin = pin});
        if (!pin) CHECK_FALSE(ring.pinned());
        MESSAGE(ring.description());
        stream_guard compute;
        unsigned long long* dsum = nullptr;
        FEEDLINE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dsum), sizeof *dsum));
        const std::uint64_t n = 64;
        std::thread producer([&] {
            for (std::uint64_t seq = 0; seq < n; ++seq) {
                std::byte* p = ring.acquire(seq);
                if (p == nullptr) return;  // the consumer's checks report what went wrong
                fill(p, (1 << 20) - seq * 1000, seq);
                ring.publish(seq, (1 << 20) - seq * 1000, {seq, 1});
            }
        });
        std::vector<std::byte> expected(1 << 20);
        for (std::uint64_t seq = 0; seq < n; ++seq) {
            auto h = ring.next();
            REQUIRE(h);
            h->wait_on(compute.s);
            FEEDLINE_CUDA_CHECK(ft::launch_checksum(compute.s, h->data(), h->bytes(), dsum));
            unsigned long long got = 0;
            FEEDLINE_CUDA_CHECK(cudaMemcpyAsync(&got, dsum, sizeof got, cudaMemcpyDeviceToHost, compute.s));
            h->release(compute.s);
            FEEDLINE_CUDA_CHECK(cudaStreamSynchronize(compute.s));
            fill(expected.data(), (1 << 20) - seq * 1000, seq);
            REQUIRE(got == ft::host_checksum(expected.data(), (1 << 20) - seq * 1000));
        }
        producer.join();
        cudaFree(dsum);
    }
}

TEST_CASE("PinnedRing.Overlap.CopyOfTheNextBatchRunsDuringCompute") {
    need_gpu();
    const std::size_t bytes = 64 << 20;
    const std::uint64_t n = 10;
    pinned_ring ring({.slots = 2, .slot_bytes = bytes});
    if (!ring.pinned()) ft::skip("host memory could not be pinned here: " + ring.description());
    stream_guard compute;
    // Calibrate the synthetic step to ~4x the time of one copy.
    std::vector<cudaEvent_t> ev(4 * n + 4);
    for (auto& e : ev) FEEDLINE_CUDA_CHECK(cudaEventCreate(&e));
    std::byte* p0 = ring.acquire(0);
    std::memset(p0, 1, bytes);
    FEEDLINE_CUDA_CHECK(cudaEventRecord(ev[0], ring.copy_stream()));
    ring.publish(0, bytes);
    FEEDLINE_CUDA_CHECK(cudaEventRecord(ev[1], ring.copy_stream()));
    FEEDLINE_CUDA_CHECK(cudaEventRecord(ev[2], compute.s));
    FEEDLINE_CUDA_CHECK(ft::launch_spin(compute.s, 10'000'000));
    FEEDLINE_CUDA_CHECK(cudaEventRecord(ev[3], compute.s));
    FEEDLINE_CUDA_CHECK(cudaDeviceSynchronize());
    const float copy_ms = ms_between(ev[0], ev[1]);
    const long long cycles = static_cast<long long>(10'000'000.0 * 4 * copy_ms / std::max(0.001f, ms_between(ev[2], ev[3])));
    MESSAGE("one 64 MiB copy: " << copy_ms << " ms; compute step: " << cycles << " cycles");

    // Batch 0 is already published. The producer publishes 1..n-1 as slots free up, timing each copy
    // on the copy stream; the consumer runs one synthetic step per batch.
    std::vector<cudaEvent_t> copy_end(n), comp_begin(n), comp_end(n);
    for (std::uint64_t k = 0; k < n; ++k) {
        copy_end[k] = ev[4 + 3 * k];
        comp_begin[k] = ev[5 + 3 * k];
        comp_end[k] = ev[6 + 3 * k];
    }
    FEEDLINE_CUDA_CHECK(cudaEventRecord(copy_end[0], ring.copy_stream()));
    std::thread producer([&] {
        for (std::uint64_t k = 1; k < n; ++k) {
            std::byte* p = ring.acquire(k);
            if (p == nullptr) return;
            p[0] = static_cast<std::byte>(k);  // the copy's cost is what is measured, not the fill's
            ring.publish(k, bytes);
            FEEDLINE_CUDA_CHECK(cudaEventRecord(copy_end[k], ring.copy_stream()));
        }
    });
    for (std::uint64_t k = 0; k < n; ++k) {
        auto h = ring.next();
        REQUIRE(h);
        h->wait_on(compute.s);
        FEEDLINE_CUDA_CHECK(cudaEventRecord(comp_begin[k], compute.s));
        FEEDLINE_CUDA_CHECK(ft::launch_spin(compute.s, cycles));
        FEEDLINE_CUDA_CHECK(cudaEventRecord(comp_end[k], compute.s));
        h->release(compute.s);
    }
    producer.join();
    FEEDLINE_CUDA_CHECK(cudaDeviceSynchronize());
    // With two slots, batch k's copy must wait for batch k-2's compute to release the device buffer,
    // and it finishes while batch k-1 computes: copy and compute overlap, and compute never waits.
    int inside = 0;
    float worst_gap = 0;
    for (std::uint64_t k = 2; k < n; ++k) {
        const float start = ms_between(comp_begin[k - 1], copy_end[k]), end = ms_between(copy_end[k], comp_end[k - 1]);
        inside += start > 0 && end > 0;
        worst_gap = std::max(worst_gap, ms_between(comp_end[k - 1], comp_begin[k]));
    }
    MESSAGE("copies finished inside the previous batch's compute: " << inside << " of " << n - 2 << "; worst gap between steps "
                                                                    << worst_gap << " ms");
    CHECK(inside == static_cast<int>(n - 2));
    CHECK(worst_gap < copy_ms / 2);  // the step never waited for a whole copy
    for (auto& e : ev) cudaEventDestroy(e);
}

TEST_CASE("PinnedRing.Lifetime.NoDeviceMemoryLeakAcrossCycles") {
    need_gpu();
    FEEDLINE_CUDA_CHECK(cudaSetDevice(0));
    FEEDLINE_CUDA_CHECK(cudaFree(nullptr));  // create the context before measuring
    std::size_t free_before = 0, free_after = 0, total = 0;
    { pinned_ring warm({.slots = 4, .slot_bytes = 16 << 20}); }
    FEEDLINE_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 20; ++i) {
        pinned_ring ring({.slots = 4, .slot_bytes = 16 << 20});
        std::byte* p = ring.acquire(0);
        std::memset(p, i, 16 << 20);
        ring.publish(0, 16 << 20);
        auto h = ring.next();
        h->wait_on(nullptr);
    }  // the handle is released before the ring goes
    FEEDLINE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    MESSAGE("device free before " << free_before << ", after " << free_after);
    CHECK(free_after + (4u << 20) >= free_before);  // 20 cycles x 64 MiB would show as a GiB
}

TEST_CASE("PinnedRing.Choice.AutoPicksTheGpu") {
    need_gpu();
    auto chosen = make_ring({.slots = 2, .slot_bytes = 4096}, parse_device("auto"));
    CHECK(chosen.ring->on_device());
    CHECK(chosen.reason.find("pinned ring") != std::string::npos);
    CHECK_THROWS_AS(make_ring({.slots = 2, .slot_bytes = 4096}, parse_device("cuda:999")), config_error);
}
