// Ordered worker pool and reorder window: output equals the sequential result at 1, 2 and 4 workers
// under random per-task delays; state is built on the worker's own thread; a worker's exception reaches
// the consumer with its type; shutdown joins every thread even when the consumer stopped consuming.
#include <doctest/doctest.h>

#include <feedline/exec/worker_pool.hpp>

#include <random>
#include <thread>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {
std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    return x ^ (x >> 27);
}
// Work whose duration varies from item to item (busy work, no sleeping), so workers finish out of order.
std::uint64_t uneven_work(std::uint64_t seq) {
    std::uint64_t spins = mix(seq) % 2000, acc = seq;
    for (std::uint64_t i = 0; i < spins; ++i) acc = mix(acc);
    return mix(seq) + (acc & 0);  // result depends on seq only
}

void ordered_equals_sequential(unsigned workers) {
    const std::uint64_t n = 20'000;
    ordered_pool<std::uint64_t> pool(pool_options{.workers = workers, .window = 8, .count = n},
                                     [](unsigned) { return 0; }, [](int&, std::uint64_t seq) { return uneven_work(seq); });
    std::uint64_t seq = 0;
    bool equal = true;
    while (auto v = pool.next()) equal &= (*v == mix(seq++));
    CHECK(equal);
    CHECK(seq == n);
}
}  // namespace

TEST_CASE("Pool.Ordered.EqualsSequentialUnderRandomDelays.1") { ordered_equals_sequential(1); }
TEST_CASE("Pool.Ordered.EqualsSequentialUnderRandomDelays.2") { ordered_equals_sequential(2); }
TEST_CASE("Pool.Ordered.EqualsSequentialUnderRandomDelays.4") { ordered_equals_sequential(4); }

TEST_CASE("Pool.State.BuiltOnTheWorkersOwnThread") {
    struct state {
        std::thread::id owner;
        unsigned index;
    };
    ordered_pool<bool> pool(pool_options{.workers = 3, .count = 3000},
                            [](unsigned i) { return state{std::this_thread::get_id(), i}; },
                            [](state& s, std::uint64_t) { return s.owner == std::this_thread::get_id() && s.index < 3; });
    std::uint64_t n = 0;
    while (auto ok = pool.next()) {
        REQUIRE(*ok);
        ++n;
    }
    CHECK(n == 3000);
}

TEST_CASE("Pool.Exception.ReachesTheConsumerWithItsType") {
    const auto threads_before = ft::baseline_thread_count();
    {
        ordered_pool<int> pool(pool_options{.workers = 4, .window = 4}, [](unsigned) { return 0; }, [](int&, std::uint64_t seq) {
            if (seq == 500) throw format_error("shard.bin", 1234, "corrupt on purpose");
            return static_cast<int>(seq);
        });
        bool thrown = false;
        try {
            while (pool.next()) {
            }
        } catch (const format_error& e) {
            thrown = true;
            CHECK(e.file() == "shard.bin");
            CHECK(e.offset() == 1234);
        }
        CHECK(thrown);
        // A failed pool stays failed: ending quietly would look like the end of the data.
        CHECK_THROWS_AS(pool.next(), format_error);
    }
    CHECK(ft::thread_count() == threads_before);
}

TEST_CASE("Pool.Exception.FromStateConstructionReachesTheConsumer") {
    ordered_pool<int> pool(pool_options{.workers = 2}, [](unsigned i) -> int {
        if (i == 1) throw io_error("tokenizer.model", ENOENT, "cannot load");
        return 0;
    }, [](int&, std::uint64_t seq) { return static_cast<int>(seq); });
    CHECK_THROWS_AS(
        [&] {
            for (;;)
                if (!pool.next()) break;
        }(),
        io_error);
}

TEST_CASE("Pool.Stop.JoinsWhenTheConsumerStoppedAndTheWindowIsFull") {
    const auto threads_before = ft::baseline_thread_count();
    for (unsigned workers : {1u, 2u, 4u}) {
        ordered_pool<std::vector<int>> pool(pool_options{.workers = workers, .window = 2}, [](unsigned) { return 0; },
                                            [](int&, std::uint64_t seq) { return std::vector<int>(100, static_cast<int>(seq)); });
        CHECK(pool.next().has_value());  // take one, then walk away with the window full
        // The destructor must join: blocked producers are woken, nothing waits for the consumer.
    }
    CHECK(ft::thread_count() == threads_before);
}

TEST_CASE("Pool.ActiveWorkers.ChangingThemNeverChangesTheData") {
    ordered_pool<std::uint64_t> pool(pool_options{.workers = 4, .window = 8, .count = 30'000}, [](unsigned) { return 0; },
                                     [](int&, std::uint64_t seq) { return uneven_work(seq); });
    std::uint64_t seq = 0;
    bool equal = true;
    while (auto v = pool.next()) {
        if (seq == 5000) pool.set_active_workers(1);
        if (seq == 15000) pool.set_active_workers(3);
        equal &= (*v == mix(seq++));
    }
    CHECK(equal);
    CHECK(seq == 30'000);
    CHECK(pool.active_workers() == 3);
}

TEST_CASE("Pool.Pinning.WorkersRunOnTheirCpuSet") {
    ordered_pool<int> pool(pool_options{.workers = 2, .cpu_sets = {{0}}, .count = 200}, [](unsigned) { return 0; },
                           [](int&, std::uint64_t) { return ::sched_getcpu(); });
    if (!pool.pinning_warnings().empty()) ft::skip(pool.pinning_warnings().front());
    while (auto cpu = pool.next()) REQUIRE(*cpu == 0);
    CHECK_THROWS_AS(ordered_pool<int>(pool_options{.workers = 2, .cpu_sets = {{0}, {0}, {0}}}, [](unsigned) { return 0; },
                                      [](int&, std::uint64_t) { return 0; }),
                    config_error);
}

TEST_CASE("Reorder.Window.NeverHoldsMoreThanItsCapacity") {
    reorder_window<std::uint64_t> w(4);
    std::atomic<std::uint64_t> ticket{0};
    std::atomic<bool> over{false};
    std::vector<std::thread> producers;
    const std::uint64_t n = 20'000;
    for (int p = 0; p < 3; ++p)
        producers.emplace_back([&] {
            for (;;) {
                std::uint64_t seq = ticket++;
                if (seq >= n || !w.wait_for_room(seq)) return;
                if (seq >= w.next_sequence() + w.capacity()) over = true;
                w.put(seq, seq * 3);
            }
        });
    bool ordered = true;
    for (std::uint64_t i = 0; i < n; ++i) {
        auto v = w.pop();
        ordered &= v && *v == i * 3;
        if (w.ready_count() > w.capacity()) over = true;
    }
    for (auto& t : producers) t.join();
    CHECK(ordered);
    CHECK_FALSE(over.load());
    w.close();
    CHECK_FALSE(w.pop().has_value());
}
