// bench_queue: what does the blocking layer cost, and does an idle consumer really sleep?
//
// Items/s through one producer and one consumer (and 2 x 2 for MPMC), capacity 1024, 8-byte items:
//   feedline mpmc_queue (blocking push/pop) vs raw Boost.Lockfree (spinning try-loops)
//   vs a std::mutex + std::condition_variable bounded queue, all in the same run.
// Wake-up latency: a consumer asleep in pop() (idle long enough to reach the futex), the producer
// pushes a timestamp; p50/p99 of push -> pop returned. Idle CPU: CPU time of a consumer blocked in
// pop() for one second. Last line: one JSON object.
#include <boost/lockfree/queue.hpp>

#include <ctime>
#include <thread>

#include <feedline/exec/queue.hpp>

#include "bench_common.hpp"
#include "mutex_queue.hpp"

using namespace feedline;
using namespace feedline::bench;

namespace {

constexpr std::size_t capacity = 1024;
constexpr std::uint64_t items = 20'000'000;

// Runs P producers and C consumers over a closable blocking queue (feedline's, or the mutex+condvar
// baseline): consumers stop when the last producer closes it. Returns items/s.
template <class Queue>
double blocking_rate(unsigned producers, unsigned consumers) {
    Queue q(capacity);
    const std::uint64_t per = items / producers;
    std::atomic<unsigned> done{0};
    auto t0 = clock_type::now();
    std::vector<std::thread> ts;
    for (unsigned p = 0; p < producers; ++p)
        ts.emplace_back([&] {
            for (std::uint64_t i = 1; i <= per; ++i) q.push(i);
            if (++done == producers) q.close();
        });
    for (unsigned c = 0; c < consumers; ++c)
        ts.emplace_back([&] {
            while (q.pop()) {
            }
        });
    for (auto& t : ts) t.join();
    return static_cast<double>(per * producers) / seconds_since(t0);
}

template <class BoostQueue>
double boost_rate(unsigned producers, unsigned consumers) {
    BoostQueue q(capacity);
    const std::uint64_t per = items / producers, total = per * producers;
    std::atomic<std::uint64_t> got{0};
    auto t0 = clock_type::now();
    std::vector<std::thread> ts;
    for (unsigned p = 0; p < producers; ++p)
        ts.emplace_back([&] {
            for (std::uint64_t i = 1; i <= per; ++i)
                while (!q.push(i)) detail::cpu_relax();
        });
    for (unsigned c = 0; c < consumers; ++c)
        ts.emplace_back([&] {
            std::uint64_t v;
            while (got.load(std::memory_order_relaxed) < total)
                if (q.pop(v))
                    got.fetch_add(1, std::memory_order_relaxed);
                else
                    detail::cpu_relax();
        });
    for (auto& t : ts) t.join();
    return static_cast<double>(total) / seconds_since(t0);
}

double thread_cpu_seconds() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main() {
    std::printf("bench_queue: %llu items of 8 bytes, capacity %zu, 1 producer + 1 consumer unless named\n\n",
                static_cast<unsigned long long>(items), capacity);
    interleaved cases;
    cases.add("mpmc/feedline (blocking)", [] { return blocking_rate<mpmc_queue<std::uint64_t>>(1, 1); });
    cases.add("mpmc/boost queue (spinning)",
              [] { return boost_rate<boost::lockfree::queue<std::uint64_t, boost::lockfree::fixed_sized<true>>>(1, 1); });
    cases.add("mpmc/mutex+condvar", [] { return blocking_rate<mutex_queue<std::uint64_t>>(1, 1); });
    cases.add("mpmc 2x2/feedline (blocking)", [] { return blocking_rate<mpmc_queue<std::uint64_t>>(2, 2); });
    cases.add("mpmc 2x2/mutex+condvar", [] { return blocking_rate<mutex_queue<std::uint64_t>>(2, 2); });
    auto r = cases.run(5, "items/s");

    // Wake-up latency of a sleeping consumer.
    mpmc_queue<clock_type::time_point> q(16);
    std::vector<double> lat_us;
    std::thread consumer([&] {
        while (auto t = q.pop()) lat_us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - *t).count());
    });
    for (int i = 0; i < 500; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // long enough for the consumer to reach the futex
        q.push(clock_type::now());
    }
    q.close();
    consumer.join();
    std::sort(lat_us.begin(), lat_us.end());
    double p50 = lat_us[lat_us.size() / 2], p99 = lat_us[lat_us.size() * 99 / 100];

    // CPU burnt by an idle consumer blocked in pop() for one second.
    mpmc_queue<int> idle(4);
    double cpu = 0;
    std::thread sleeper([&] {
        double c0 = thread_cpu_seconds();
        (void)idle.pop_for(std::chrono::seconds(1));
        cpu = thread_cpu_seconds() - c0;
    });
    sleeper.join();

    std::printf("\nwake-up latency (sleeping consumer): p50 %.1f us, p99 %.1f us\n", p50, p99);
    std::printf("idle consumer CPU: %.3f ms per second\n", cpu * 1e3);
    auto m = [&](const char* k) { return r[k].median; };
    std::printf(
        "{\"mpmc_vs_boost\": %.3f, \"mpmc_vs_mutex\": %.3f, "
        "\"mpmc_2x2_vs_mutex\": %.3f, \"wake_p50_us\": %.1f, \"wake_p99_us\": %.1f, \"idle_cpu_ms_per_s\": %.3f}\n",
        m("mpmc/feedline (blocking)") / m("mpmc/boost queue (spinning)"), m("mpmc/feedline (blocking)") / m("mpmc/mutex+condvar"),
        m("mpmc 2x2/feedline (blocking)") / m("mpmc 2x2/mutex+condvar"), p50, p99, cpu * 1e3);
    return 0;
}
