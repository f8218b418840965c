// Bounded queues: every item arrives exactly once and in order per producer, at 1..4 producers and
// consumers and at capacities small enough that full/empty transitions happen constantly; close() wakes
// every waiter and drains; move-only payloads work through the slot-index path. The reorder window hands
// results out in sequence order and never holds more than its capacity.
#include <doctest/doctest.h>

#include <feedline/exec/queue.hpp>
#include <feedline/exec/reorder.hpp>

#include <memory>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

TEST_CASE("Queue.OneProducerOneConsumer.StressItemsArriveInOrder") {
    for (std::size_t capacity : {1ul, 3ul, 1024ul}) {
        CAPTURE(capacity);
        mpmc_queue<std::uint64_t> q(capacity);
        const std::uint64_t n = capacity == 1024 ? ft::stress_items : ft::stress_items / 10;
        std::thread producer([&] {
            for (std::uint64_t i = 0; i < n; ++i) REQUIRE(q.push(i));
            q.close();
        });
        std::uint64_t expected = 0;
        bool in_order = true;
        while (auto v = q.pop()) {
            in_order &= (*v == expected);
            ++expected;
        }
        producer.join();
        CHECK(in_order);
        CHECK(expected == n);
    }
}

namespace {
// P producers push (p << 40 | i); C consumers pop. Checks exactly-once and per-producer FIFO order.
void mpmc_stress(unsigned producers, unsigned consumers, std::size_t capacity, std::uint64_t total) {
    CAPTURE(producers);
    CAPTURE(consumers);
    CAPTURE(capacity);
    mpmc_queue<std::uint64_t> q(capacity);
    const std::uint64_t per = total / producers;
    std::vector<std::thread> threads;
    std::atomic<unsigned> done_producers{0};
    for (unsigned p = 0; p < producers; ++p)
        threads.emplace_back([&, p] {
            for (std::uint64_t i = 0; i < per; ++i) q.push((std::uint64_t(p) << 40) | i);
            if (++done_producers == producers) q.close();
        });
    std::vector<std::vector<std::uint64_t>> seen(consumers, std::vector<std::uint64_t>(producers, 0));
    std::vector<std::uint64_t> counts(consumers, 0);
    std::vector<char> ordered(consumers, 1);
    for (unsigned c = 0; c < consumers; ++c)
        threads.emplace_back([&, c] {
            std::vector<std::uint64_t> last(producers, 0);
            std::vector<char> any(producers, 0);
            while (auto v = q.pop()) {
                auto p = static_cast<unsigned>(*v >> 40);
                std::uint64_t i = *v & ((std::uint64_t(1) << 40) - 1);
                if (any[p] && i <= last[p]) ordered[c] = 0;
                last[p] = i;
                any[p] = 1;
                seen[c][p] += i;
                ++counts[c];
            }
        });
    for (auto& t : threads) t.join();
    std::uint64_t count = 0;
    for (auto n : counts) count += n;
    CHECK(count == per * producers);
    for (unsigned p = 0; p < producers; ++p) {
        std::uint64_t sum = 0;
        for (unsigned c = 0; c < consumers; ++c) sum += seen[c][p];
        CHECK(sum == per * (per - 1) / 2);  // every index 0..per-1 exactly once
    }
    for (unsigned c = 0; c < consumers; ++c) CHECK(ordered[c]);
}
}  // namespace

TEST_CASE("Queue.Mpmc.StressExactlyOnce.1x1") { mpmc_stress(1, 1, 64, ft::stress_items); }
TEST_CASE("Queue.Mpmc.StressExactlyOnce.2x2") { mpmc_stress(2, 2, 8, ft::stress_items); }
TEST_CASE("Queue.Mpmc.StressExactlyOnce.4x4") { mpmc_stress(4, 4, 2, ft::stress_items / 4); }
TEST_CASE("Queue.Mpmc.StressExactlyOnce.1x4") { mpmc_stress(1, 4, 16, ft::stress_items / 4); }
TEST_CASE("Queue.Mpmc.StressExactlyOnce.4x1") { mpmc_stress(4, 1, 16, ft::stress_items / 4); }

TEST_CASE("Queue.MoveOnly.UniquePointersTravelThroughSlots") {
    mpmc_queue<std::unique_ptr<std::uint64_t>> s(2);
    mpmc_queue<std::unique_ptr<std::uint64_t>> m(3);
    const std::uint64_t n = 100'000;
    std::thread ps([&] {
        for (std::uint64_t i = 0; i < n; ++i) s.push(std::make_unique<std::uint64_t>(i));
        s.close();
    });
    std::thread pm([&] {
        for (std::uint64_t i = 0; i < n; ++i) m.push(std::make_unique<std::uint64_t>(i));
        m.close();
    });
    std::uint64_t sum_s = 0, sum_m = 0;
    while (auto v = s.pop()) sum_s += **v;
    while (auto v = m.pop()) sum_m += **v;
    ps.join();
    pm.join();
    CHECK(sum_s == n * (n - 1) / 2);
    CHECK(sum_m == n * (n - 1) / 2);
    // A failed try_push leaves the value with the caller.
    mpmc_queue<std::unique_ptr<int>> full(1);
    REQUIRE(full.try_push(std::make_unique<int>(1)));
    auto keep = std::make_unique<int>(2);
    CHECK_FALSE(full.try_push(std::move(keep)));
    REQUIRE(keep != nullptr);
    CHECK(*keep == 2);
}

TEST_CASE("Queue.Close.DrainsThenReportsClosed") {
    mpmc_queue<int> q(4);
    CHECK(q.push(1));
    CHECK(q.push(2));
    q.close();
    CHECK_FALSE(q.push(3));
    CHECK_FALSE(q.try_push(3));
    CHECK(q.pop() == 1);
    CHECK(q.pop_for(std::chrono::seconds(10)) == 2);
    CHECK_FALSE(q.pop().has_value());
    CHECK(q.closed());
}

TEST_CASE("Queue.Close.WakesBlockedConsumersAndProducers") {
    for (int round = 0; round < 50; ++round) {
        mpmc_queue<int> empty(2);
        mpmc_queue<int> full(1);
        REQUIRE(full.push(0));
        std::optional<int> got = 7;
        bool pushed = true;
        std::thread consumer([&] { got = empty.pop(); });
        std::thread producer([&] { pushed = full.push(1); });
        empty.close();
        full.close();
        consumer.join();
        producer.join();
        CHECK_FALSE(got.has_value());
        CHECK_FALSE(pushed);
    }
}

TEST_CASE("Queue.Close.RaceLosesNoAcceptedItem") {
    // Producers push until close; every push that returned true must be popped exactly once.
    for (int round = 0; round < 12; ++round) {
        mpmc_queue<std::uint64_t> q(4);
        std::atomic<std::uint64_t> accepted{0}, popped{0};
        std::vector<std::thread> threads;
        for (int p = 0; p < 2; ++p)
            threads.emplace_back([&] {
                for (std::uint64_t i = 1; q.push(i); ++i) accepted += i;
            });
        for (int c = 0; c < 2; ++c)
            threads.emplace_back([&] {
                while (auto v = q.pop()) popped += *v;
            });
        std::thread closer([&] {
            for (int i = 0; i < 50 * round; ++i) std::this_thread::yield();
            q.close();
        });
        closer.join();
        for (auto& t : threads) t.join();
        CHECK(accepted.load() == popped.load());
    }
}

TEST_CASE("Queue.Timed.TimeoutsReturnWithoutAnItem") {
    mpmc_queue<int> q(1);
    CHECK_FALSE(q.pop_for(std::chrono::milliseconds(5)).has_value());
    REQUIRE(q.push_for(1, std::chrono::milliseconds(5)));
    CHECK_FALSE(q.push_for(2, std::chrono::milliseconds(5)));
    CHECK_FALSE(q.closed());
    CHECK(q.size_approx() == 1);
}

TEST_CASE("Queue.Capacity.ZeroOrTooLargeIsAConfigError") {
    CHECK_THROWS_AS(mpmc_queue<int>(0), config_error);
    CHECK_THROWS_AS(mpmc_queue<int>(100000), config_error);
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
