// bench_worker_pool: does the ordered pool's hand-off beat a mutex design, and does it scale?
//
// 1. Hand-off: 2 workers produce numbered items with trivial work; the consumer takes them in order.
//    feedline::ordered_pool (atomic ticket + lock-free reorder window) vs the same protocol built on a
//    std::mutex + std::condition_variable (ticket under the lock, results in a window guarded by the
//    lock), same window size, same run. Items/s.
// 2. Scaling: a CPU-bound transform (~20 us of hashing per item): 2 workers vs 1 worker, items/s.
// Last line: one JSON object with pool_handoff_vs_mutex and pool_speedup_2w.
#include <condition_variable>
#include <mutex>
#include <thread>

#include <feedline/exec/worker_pool.hpp>

#include "bench_common.hpp"

using namespace feedline;
using namespace feedline::bench;

namespace {

std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    return x ^ (x >> 27);
}

std::uint64_t cpu_work(std::uint64_t seq, int rounds) {
    std::uint64_t acc = seq;
    for (int i = 0; i < rounds; ++i) acc = mix(acc + static_cast<std::uint64_t>(i));
    return acc;
}

double feedline_pool(unsigned workers, std::uint64_t n, int rounds, std::size_t window) {
    auto t0 = clock_type::now();
    ordered_pool<std::uint64_t> pool(pool_options{.workers = workers, .window = window, .count = n}, [](unsigned) { return 0; },
                                     [rounds](int&, std::uint64_t seq) { return cpu_work(seq, rounds); });
    std::uint64_t sum = 0;
    while (auto v = pool.next()) sum += *v;
    double rate = static_cast<double>(n) / seconds_since(t0);
    return sum == 42 ? 0 : rate;  // keeps the work observable
}

// The same ordered protocol with a mutex: workers take tickets and park results under one lock.
double mutex_pool(unsigned workers, std::uint64_t n, int rounds, std::size_t window) {
    std::mutex m;
    std::condition_variable room, ready;
    std::vector<std::optional<std::uint64_t>> slots(window);
    std::uint64_t next_ticket = 0, next_out = 0;
    auto t0 = clock_type::now();
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < workers; ++w)
        ts.emplace_back([&] {
            for (;;) {
                std::uint64_t seq;
                {
                    std::unique_lock lock(m);
                    seq = next_ticket++;
                    if (seq >= n) return;
                    room.wait(lock, [&] { return seq < next_out + window; });
                }
                std::uint64_t v = cpu_work(seq, rounds);
                std::lock_guard lock(m);
                slots[seq % window] = v;
                ready.notify_one();
            }
        });
    std::uint64_t sum = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
        std::unique_lock lock(m);
        ready.wait(lock, [&] { return slots[i % window].has_value(); });
        sum += *slots[i % window];
        slots[i % window].reset();
        ++next_out;
        room.notify_all();
    }
    for (auto& t : ts) t.join();
    double rate = static_cast<double>(n) / seconds_since(t0);
    return sum == 42 ? 0 : rate;
}

}  // namespace

int main() {
    std::printf("bench_worker_pool (hardware threads: %u)\n\n", std::thread::hardware_concurrency());
    interleaved handoff;
    const std::uint64_t n_handoff = 2'000'000;
    handoff.add("handoff 2 workers/feedline ordered_pool", [&] { return feedline_pool(2, n_handoff, 0, 64); });
    handoff.add("handoff 2 workers/mutex+condvar", [&] { return mutex_pool(2, n_handoff, 0, 64); });
    auto h = handoff.run(5, "items/s");

    std::printf("\n");
    interleaved scaling;
    const std::uint64_t n_cpu = 40'000;
    const int rounds = 4000;  // ~20 us per item here
    scaling.add("cpu-bound 1 worker/feedline", [&] { return feedline_pool(1, n_cpu, rounds, 16); });
    scaling.add("cpu-bound 2 workers/feedline", [&] { return feedline_pool(2, n_cpu, rounds, 16); });
    auto s = scaling.run(5, "items/s");

    std::printf("{\"pool_handoff_vs_mutex\": %.3f, \"pool_speedup_2w\": %.3f}\n",
                h["handoff 2 workers/feedline ordered_pool"].median / h["handoff 2 workers/mutex+condvar"].median,
                s["cpu-bound 2 workers/feedline"].median / s["cpu-bound 1 worker/feedline"].median);
    return 0;
}
