// The staging ring's slot protocol, through the host ring: batches come out in sequence order whatever
// order producers finish in, a slot is refilled only after its batch was released, close() drains what
// was published, a producer's exception reaches the consumer with its type, handles release their
// slot when dropped, and a sleeping consumer can be woken once per burst instead of once per batch.
// Real threads throughout (run under ThreadSanitizer in CI).
#include <doctest/doctest.h>

#include <feedline/device/make_ring.hpp>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Batch seq: bytes derived from seq, so any mix-up of slots or sequence numbers shows.
void fill(std::byte* p, std::size_t n, std::uint64_t seq) {
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((seq * 131 + i * 7) & 0xff);
}
bool holds(const std::byte* p, std::size_t n, std::uint64_t seq) {
    for (std::size_t i = 0; i < n; ++i)
        if (p[i] != static_cast<std::byte>((seq * 131 + i * 7) & 0xff)) return false;
    return true;
}

// `producers` threads take sequence numbers from a shared counter, fill and publish them with random
// pauses so they finish out of order; the consumer checks order and content.
void run_producers_and_consumer(staging_ring& ring, unsigned producers, std::uint64_t first, std::uint64_t count) {
    std::atomic<std::uint64_t> ticket{first};
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < producers; ++t)
        threads.emplace_back([&, t] {
            std::mt19937 rng(t);
            for (;;) {
                std::uint64_t seq = ticket.fetch_add(1);
                if (seq >= first + count) return;
                std::byte* p = ring.acquire(seq);
                if (p == nullptr) return;
                const std::size_t bytes = 1 + seq % ring.slot_bytes();
                fill(p, bytes, seq);
                if (rng() % 4 == 0) std::this_thread::yield();
                ring.publish(seq, bytes, {seq, 3});
            }
        });
    for (std::uint64_t seq = first; seq < first + count; ++seq) {
        auto h = ring.next();
        REQUIRE(h.has_value());
        REQUIRE(h->sequence() == seq);
        REQUIRE(h->slot() == seq % ring.slots());
        REQUIRE(h->bytes() == 1 + seq % ring.slot_bytes());
        REQUIRE(h->shape() == batch_shape{seq, 3});
        REQUIRE(holds(h->host(), h->bytes(), seq));
    }
    for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("HostRing.Order.InSequenceWhateverOrderProducersFinish") {
    for (unsigned producers : {1u, 2u, 4u})
        for (std::size_t slots : {std::size_t(1), std::size_t(2), std::size_t(5)}) {
            host_ring ring({.slots = slots, .slot_bytes = 300});
            run_producers_and_consumer(ring, producers, 0, 2000);
            auto st = ring.stats();
            CHECK(st.published == 2000);
            CHECK(st.consumed == 2000);
            CHECK(ring.outstanding() == 0);
        }
}

TEST_CASE("HostRing.Order.StartsAtTheFirstSequence") {
    host_ring ring({.slots = 3, .slot_bytes = 64, .first_sequence = 1001});
    CHECK(ring.next_sequence() == 1001);
    run_producers_and_consumer(ring, 2, 1001, 500);
}

namespace {
// Waits (bounded) until a producer sleeps in acquire() or `done` is set: the handshake before checking
// that something has not happened yet, instead of a sleep that only makes it unlikely.
void until_blocked_or(const staging_ring& ring, const std::atomic<bool>& done) {
    for (int i = 0; i < 100000 && ring.producers_asleep() == 0 && !done.load(); ++i)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
}
}  // namespace

TEST_CASE("HostRing.Slots.RefilledOnlyAfterRelease") {
    host_ring ring({.slots = 2, .slot_bytes = 16});
    for (std::uint64_t s = 0; s < 2; ++s) {
        fill(ring.acquire(s), 16, s);
        ring.publish(s, 16);
    }
    auto h0 = ring.next();
    REQUIRE(h0);
    const void* slot0 = h0->data();
    std::atomic<bool> got{false};
    std::byte* p2 = nullptr;
    std::thread producer([&] {
        p2 = ring.acquire(2);  // slot 0 again: must wait for batch 0's release
        got.store(true);
    });
    until_blocked_or(ring, got);  // the producer sleeps in acquire(): only a release can wake it
    CHECK_FALSE(got.load());
    CHECK(holds(h0->host(), 16, 0));  // still intact while held
    h0.reset();                       // the handle's destructor releases the slot
    producer.join();
    CHECK(got.load());
    CHECK(p2 == slot0);  // the one free buffer: batch 0's, released
    fill(p2, 16, 2);
    ring.publish(2, 16);
    auto h1 = ring.next();
    auto h2 = ring.next();
    CHECK(h1->sequence() == 1);
    CHECK(h2->sequence() == 2);
    CHECK(h2->data() == slot0);
    CHECK(ring.outstanding() == 2);
    batch_handle moved = std::move(*h1);
    CHECK_FALSE(*h1);
    moved.release();
    moved.release();  // idempotent
    CHECK(ring.outstanding() == 1);
}

// A slot orders batches; the buffer a batch goes into is the one its producer thread filled last and the
// consumer released since (warm in that thread's caches), whichever slot the batch takes. With fixed
// memory per slot, producer 0's batches 0, 2, 4, 6 would land in four different buffers.
TEST_CASE("HostRing.Memory.AProducerRefillsTheBufferItFilledLast") {
    constexpr std::size_t slots = 8, bytes = 4096;
    constexpr int rounds = 20;
    host_ring ring({.slots = slots, .slot_bytes = bytes});
    std::atomic<int> turn{0};  // 3r: producer 0 fills batch 2r, 3r + 1: producer 1 fills 2r + 1, 3r + 2: the consumer takes both
    std::vector<const std::byte*> filled[2];
    auto wait_turn = [&](int t) {
        for (int i = 0; i < 10'000'000 && turn.load() != t; ++i) std::this_thread::yield();
        return turn.load() == t;
    };
    auto producer = [&](int who) {
        for (int r = 0; r < rounds; ++r) {
            if (!wait_turn(3 * r + who)) return;
            const std::uint64_t seq = 2 * r + who;
            std::byte* p = ring.acquire(seq);
            if (p == nullptr) return;
            filled[who].push_back(p);
            fill(p, bytes, seq);
            ring.publish(seq, bytes);
            turn.fetch_add(1);
        }
    };
    std::thread first(producer, 0), second(producer, 1);
    for (int r = 0; r < rounds; ++r) {  // CHECK, not REQUIRE: a failure must still join the producers below
        const bool ours = wait_turn(3 * r + 2);
        CHECK(ours);
        if (!ours) break;
        auto a = ring.next();
        auto b = ring.next();
        CHECK(a);
        CHECK(b);
        if (!a || !b) break;
        CHECK(a->slot() == (2 * r) % slots);  // the slot still follows the sequence
        CHECK(b->slot() == (2 * r + 1) % slots);
        CHECK(holds(a->host(), bytes, 2 * r));
        CHECK(holds(b->host(), bytes, 2 * r + 1));
        CHECK(a->data() == a->host());
        a->release();
        b->release();
        turn.fetch_add(1);
    }
    ring.close();  // after a failure, a producer waiting in acquire() gets nullptr
    turn.store(-1);
    first.join();
    second.join();
    REQUIRE(filled[0].size() == rounds);
    REQUIRE(filled[1].size() == rounds);
    CHECK(filled[0][0] != filled[1][0]);
    for (int r = 1; r < rounds; ++r) {
        CHECK(filled[0][r] == filled[0][0]);
        CHECK(filled[1][r] == filled[1][0]);
    }
}

// Batches held by the consumer keep their memory: every batch in flight has a buffer of its own.
TEST_CASE("HostRing.Memory.BatchesInFlightNeverShareABuffer") {
    constexpr std::size_t slots = 6, bytes = 512;
    host_ring ring({.slots = slots, .slot_bytes = bytes});
    std::vector<batch_handle> held;
    std::uint64_t seq = 0;
    for (int round = 0; round < 50; ++round) {
        // Fill every free slot from this thread, then hold a varying number of them.
        const std::uint64_t end = seq + slots - held.size();
        for (std::uint64_t q = seq; q < end; ++q) {
            std::byte* p = ring.acquire(q);
            REQUIRE(p != nullptr);
            for (const auto& h : held) CHECK(p != h.host());
            fill(p, bytes, q);
            ring.publish(q, bytes);
        }
        for (; seq < end; ++seq) {
            auto h = ring.next();
            REQUIRE(h);
            held.push_back(std::move(*h));
        }
        for (const auto& h : held) CHECK(holds(h.host(), bytes, h.sequence()));
        const std::size_t keep = static_cast<std::size_t>(round % static_cast<int>(slots));
        held.erase(held.begin(), held.end() - static_cast<std::ptrdiff_t>(std::min(keep, held.size())));  // releases the oldest
    }
}

TEST_CASE("HostRing.Depth.ProducersRunAtMostDepthAheadOfReleases") {
    host_ring ring({.slots = 5, .slot_bytes = 16, .first_sequence = 10});
    CHECK(ring.depth() == 5);
    ring.set_depth(2);
    CHECK(ring.depth() == 2);
    for (std::uint64_t s = 10; s < 12; ++s) {
        fill(ring.acquire(s), 16, s);
        ring.publish(s, 16);
    }
    std::atomic<bool> got{false};
    std::thread producer([&] {
        std::byte* p = ring.acquire(12);  // slot free, but 2 batches are already ahead of the releases
        fill(p, 16, 12);
        ring.publish(12, 16);
        got.store(true);
    });
    until_blocked_or(ring, got);
    CHECK_FALSE(got.load());
    auto h = ring.next();
    REQUIRE(h);
    CHECK_FALSE(got.load());  // taking a batch is not enough: it is still held
    h.reset();
    producer.join();
    CHECK(got.load());
    ring.set_depth(100);  // clamped to the slots; deeper takes effect at once
    CHECK(ring.depth() == 5);
    for (std::uint64_t s = 13; s < 15; ++s) {
        fill(ring.acquire(s), 16, s);
        ring.publish(s, 16);
    }
    for (std::uint64_t s = 11; s < 15; ++s) {
        auto b = ring.next();
        REQUIRE(b);
        CHECK(b->sequence() == s);
        CHECK(holds(b->host(), 16, s));
    }
    ring.set_depth(0);
    CHECK(ring.depth() == 1);
}

// Below full depth each release lets exactly one more batch start: it wakes that batch's producer
// and no other (before, every sleeping producer woke at each release, and 15 of 16 went back to sleep).
TEST_CASE("HostRing.Depth.AReleaseWakesOnlyTheProducerItAdmits") {
    host_ring ring({.slots = 8, .slot_bytes = 16});
    ring.set_depth(2);
    for (std::uint64_t s = 0; s < 2; ++s) {
        fill(ring.acquire(s), 16, s);
        ring.publish(s, 16);
    }
    std::atomic<int> started{0};
    std::vector<std::thread> producers;
    for (std::uint64_t s = 2; s < 5; ++s)
        producers.emplace_back([&ring, &started, s] {
            std::byte* p = ring.acquire(s);
            if (p == nullptr) return;
            fill(p, 16, s);
            ring.publish(s, 16);
            started.fetch_add(1);
        });
    for (int i = 0; i < 100000 && ring.producers_asleep() < 3; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    REQUIRE(ring.producers_asleep() == 3);
    const std::uint64_t woken = ring.producer_wakeups();
    auto h0 = ring.next();
    REQUIRE(h0);
    h0.reset();  // admits batch 2 only
    for (int i = 0; i < 100000 && started.load() < 1; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    CHECK(started.load() == 1);
    CHECK(ring.producer_wakeups() == woken + 1);
    CHECK(ring.producers_asleep() == 2);  // 3 and 4 never woke
    for (std::uint64_t s = 1; s < 5; ++s) {
        auto b = ring.next();  // each release admits the next producer in turn
        REQUIRE(b);
        CHECK(b->sequence() == s);
        CHECK(holds(b->host(), 16, s));
    }
    for (auto& t : producers) t.join();
    CHECK(started.load() == 3);
    CHECK(ring.producer_wakeups() == woken + 3);
}

// Coalesced wake-ups (the pipelines' setting): a consumer that had to sleep is woken once half the
// depth is ready, not by every publish; closing, a held batch or the time limit end the wait early.
namespace {
// Waits (bounded) until the consumer thread has gone to sleep in next().
void until_consumer_sleeps(const staging_ring& ring, std::uint64_t sleeps) {
    for (int i = 0; i < 100000 && ring.stats().consumer_sleeps < sleeps; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    REQUIRE(ring.stats().consumer_sleeps == sleeps);
}
// Waits (bounded) until `taken` reaches `n`; a consumer stuck past that is freed by closing the ring.
bool until_taken(staging_ring& ring, const std::atomic<int>& taken, int n) {
    for (int i = 0; i < 100000 && taken.load() < n; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (taken.load() >= n) return true;
    ring.close();
    return false;
}
}  // namespace

TEST_CASE("HostRing.Coalesce.InSequenceWhateverOrderProducersFinish") {
    for (unsigned producers : {1u, 3u}) {
        host_ring ring({.slots = 8, .slot_bytes = 300, .coalesce_wakeups = std::chrono::milliseconds(1)});
        run_producers_and_consumer(ring, producers, 0, 3000);
        CHECK(ring.stats().consumed == 3000);
    }
}

TEST_CASE("HostRing.Coalesce.ASleepingConsumerWakesForABurstOfHalfTheDepth") {
    host_ring ring({.slots = 8, .slot_bytes = 16, .coalesce_wakeups = std::chrono::hours(1)});  // depth 8: bursts of 4
    std::vector<std::uint64_t> got;
    std::atomic<int> taken{0};
    std::thread consumer([&] {
        for (int i = 0; i < 4; ++i) {
            auto h = ring.next();
            if (!h || !holds(h->host(), 16, h->sequence())) return;
            got.push_back(h->sequence());
            ++taken;
        }
    });
    until_consumer_sleeps(ring, 1);
    const std::uint64_t wakeups = ring.consumer_wakeups();
    for (std::uint64_t s = 0; s < 3; ++s) {
        fill(ring.acquire(s), 16, s);
        ring.publish(s, 16);
    }
    CHECK(ring.consumer_wakeups() == wakeups);  // three of the four are ready: nobody was woken
    CHECK(taken.load() == 0);
    fill(ring.acquire(3), 16, 3);
    ring.publish(3, 16);
    CHECK(until_taken(ring, taken, 4));
    consumer.join();
    CHECK(got == std::vector<std::uint64_t>{0, 1, 2, 3});
    CHECK(ring.stats().consumer_sleeps == 1);  // 1, 2 and 3 were taken without sleeping again
}

TEST_CASE("HostRing.Coalesce.AConsumerThatDoesNotSpinSleepsAtOnceAndEveryWayOutStillWorks") {
    // set_consumer_spins(false) (the pipeline's choice when its workers take every CPU): next() skips
    // the spin, not the checks. A batch already published is taken without sleeping; a missing one
    // is slept for (a burst of half the depth) and woken by its publish; close() and the wait check
    // still end the wait.
    SUBCASE("bursts: one sleep each, batches in order") {
        host_ring ring({.slots = 8, .slot_bytes = 16, .coalesce_wakeups = std::chrono::hours(1)});  // depth 8: bursts of 4
        ring.set_consumer_spins(false);
        std::vector<std::uint64_t> got;
        std::atomic<int> taken{0};
        std::thread consumer([&] {
            for (int i = 0; i < 8; ++i) {
                auto h = ring.next();
                if (!h || !holds(h->host(), 16, h->sequence())) return;
                got.push_back(h->sequence());
                h.reset();  // released: the next wait holds nothing, so it sleeps for a burst again
                ++taken;
            }
        });
        for (std::uint64_t burst = 0; burst < 2; ++burst) {
            until_consumer_sleeps(ring, burst + 1);
            for (std::uint64_t s = 4 * burst; s < 4 * burst + 4; ++s) {
                fill(ring.acquire(s), 16, s);
                ring.publish(s, 16);
            }
            REQUIRE(until_taken(ring, taken, static_cast<int>(4 * burst + 4)));
        }
        consumer.join();
        CHECK(got == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7});
        CHECK(ring.stats().consumer_sleeps == 2);
    }
    SUBCASE("close ends the wait") {
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::hours(1)});
        ring.set_consumer_spins(false);
        std::atomic<bool> ended{false};
        std::thread consumer([&] { ended = !ring.next().has_value(); });
        until_consumer_sleeps(ring, 1);
        ring.close();
        consumer.join();
        CHECK(ended.load());
    }
    SUBCASE("the wait check ends the wait") {
        // The pipeline's 1 ms: the wait for a burst ends at that limit, and the wait check runs after it.
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::milliseconds(1)});
        ring.set_consumer_spins(false);
        std::atomic<bool> interrupt{false};
        ring.set_wait_check([&] { return interrupt.load(); }, std::chrono::milliseconds(1));
        std::atomic<bool> interrupted{false};
        std::thread consumer([&] {
            try {
                (void)ring.next();
            } catch (const wait_interrupted&) {
                interrupted = true;
            }
        });
        until_consumer_sleeps(ring, 1);
        interrupt = true;
        consumer.join();
        CHECK(interrupted.load());
    }
}

TEST_CASE("HostRing.Coalesce.AConsumerThatPollsTakesBatchesPublishedMeanwhileWithoutSleeping") {
    // set_consumer_poll (the pipeline's choice while its workers leave the trainer a CPU): next() polls
    // that long past the short spin, so a batch published within it wakes nobody.
    SUBCASE("batches published within the poll: no sleeps") {
        // Each of 40 batches is published about 300 us after the consumer starts waiting for it, past
        // the short spin and well within a 10 ms poll. Without the poll each wait ends in a sleep (39
        // of the 40 on an idle machine).
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::milliseconds(1)});
        ring.set_consumer_poll(std::chrono::milliseconds(10));
        CHECK(ring.consumer_poll() == std::chrono::milliseconds(10));
        constexpr int batches = 40;
        std::atomic<int> waiting{-1}, taken{0};
        std::vector<std::uint64_t> got;
        std::thread consumer([&] {
            for (int i = 0; i < batches; ++i) {
                waiting = i;
                auto h = ring.next();
                if (!h || !holds(h->host(), 16, h->sequence())) return;
                got.push_back(h->sequence());
                h.reset();
                ++taken;
            }
        });
        for (int s = 0; s < batches; ++s) {
            while (waiting.load() < s) std::this_thread::yield();
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
            while (std::chrono::steady_clock::now() < until) detail::cpu_relax();
            fill(ring.acquire(static_cast<std::uint64_t>(s)), 16, static_cast<std::uint64_t>(s));
            ring.publish(static_cast<std::uint64_t>(s), 16);
            REQUIRE(until_taken(ring, taken, s + 1));
        }
        consumer.join();
        REQUIRE(got.size() == batches);
        for (int s = 0; s < batches; ++s) CHECK(got[static_cast<std::size_t>(s)] == static_cast<std::uint64_t>(s));
        // A poll that did nothing would leave (nearly) all 40 waits asleep; a few may still sleep on a
        // loaded machine (the producer descheduled for the whole 10 ms).
        CHECK(ring.stats().consumer_sleeps < batches / 2);
    }
    SUBCASE("past the poll it sleeps, and the publish wakes it") {
        // No coalescing and no time limit: once asleep, only the publish of its batch (or close)
        // ends the wait. Bounded: a consumer not woken within 10 s is freed by close(), and fails.
        host_ring late({.slots = 4, .slot_bytes = 16});
        late.set_consumer_poll(std::chrono::microseconds(200));
        std::atomic<int> taken{0};
        std::atomic<bool> ok{false};
        std::thread c([&] {
            auto h = late.next();
            ok = h && h->sequence() == 0 && holds(h->host(), 16, 0);
            ++taken;
        });
        until_consumer_sleeps(late, 1);
        fill(late.acquire(0), 16, 0);
        late.publish(0, 16);
        CHECK(until_taken(late, taken, 1));
        c.join();
        CHECK(ok.load());
        CHECK(late.stats().consumer_sleeps == 1);
    }
    SUBCASE("at most 10 ms: the wait check runs only once it sleeps") {
        host_ring capped({.slots = 4, .slot_bytes = 16});
        capped.set_consumer_poll(std::chrono::hours(1));
        CHECK(capped.consumer_poll() == std::chrono::milliseconds(10));
        capped.set_consumer_poll(std::chrono::microseconds(-5));
        CHECK(capped.consumer_poll() == std::chrono::microseconds(0));
    }
}

TEST_CASE("HostRing.Coalesce.CloseAHeldBatchOrTheTimeLimitEndTheWait") {
    SUBCASE("close: the consumer takes what was published, then the end") {
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::hours(1)});
        std::atomic<int> taken{0};
        std::atomic<bool> ended{false};
        std::thread consumer([&] {
            if (auto h = ring.next(); h && h->sequence() == 0) ++taken;
            ended = !ring.next().has_value();
        });
        until_consumer_sleeps(ring, 1);
        const std::uint64_t wakeups = ring.consumer_wakeups();
        fill(ring.acquire(0), 16, 0);
        ring.publish(0, 16);  // a burst is 2: not enough to wake it
        CHECK(ring.consumer_wakeups() == wakeups);
        CHECK(taken.load() == 0);
        ring.close();
        consumer.join();
        CHECK(taken.load() == 1);
        CHECK(ended.load());
    }
    SUBCASE("a held batch: producers may not get a burst ahead, so the consumer waits for its own") {
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::hours(1)});
        fill(ring.acquire(0), 16, 0);
        ring.publish(0, 16);
        auto held = ring.next();
        REQUIRE(held);
        std::atomic<int> taken{0};
        std::thread consumer([&] {
            if (auto h = ring.next(); h && h->sequence() == 1) ++taken;
        });
        until_consumer_sleeps(ring, 1);
        fill(ring.acquire(1), 16, 1);
        ring.publish(1, 16);
        CHECK(until_taken(ring, taken, 1));
        consumer.join();
    }
    SUBCASE("the time limit: a producer that waits for each batch to be taken still makes progress") {
        host_ring ring({.slots = 4, .slot_bytes = 16, .coalesce_wakeups = std::chrono::milliseconds(2)});
        std::atomic<int> taken{0};
        std::thread consumer([&] {
            for (std::uint64_t s = 0; s < 10; ++s)
                if (auto h = ring.next(); h && h->sequence() == s) ++taken;
        });
        for (int s = 0; s < 10; ++s) {
            fill(ring.acquire(static_cast<std::uint64_t>(s)), 16, static_cast<std::uint64_t>(s));
            ring.publish(static_cast<std::uint64_t>(s), 16);
            if (!until_taken(ring, taken, s + 1)) break;  // lock step: the next batch only after this one is taken
        }
        consumer.join();
        CHECK(taken.load() == 10);
    }
}

TEST_CASE("HostRing.Close.WakesProducersAndDrainsWhatWasPublished") {
    host_ring ring({.slots = 2, .slot_bytes = 8});
    fill(ring.acquire(0), 8, 0);
    ring.publish(0, 8);
    fill(ring.acquire(1), 8, 1);
    ring.publish(1, 8);
    std::atomic<int> nulls{0};
    std::atomic<bool> returned{false};
    std::thread blocked([&] {
        nulls += ring.acquire(2) == nullptr;  // waits for slot 0
        returned = true;
    });
    until_blocked_or(ring, returned);
    CHECK_FALSE(returned.load());
    ring.close();
    blocked.join();
    CHECK(nulls == 1);
    auto a = ring.next();
    auto b = ring.next();
    REQUIRE(a);
    REQUIRE(b);
    CHECK(holds(b->host(), 8, 1));
    CHECK_FALSE(ring.next().has_value());
    CHECK(ring.acquire(5) == nullptr);
}

TEST_CASE("HostRing.Fail.ProducerErrorReachesTheConsumerWithItsType") {
    host_ring ring({.slots = 4, .slot_bytes = 8});
    std::thread producer([&] {
        try {
            fill(ring.acquire(0), 8, 0);
            ring.publish(0, 8);
            throw format_error("shard_3.bin", 4096, "token id past the vocabulary");
        } catch (...) {
            ring.fail(std::current_exception());
        }
    });
    producer.join();
    try {
        ring.next();
        FAIL("no exception");
    } catch (const format_error& e) {
        CHECK(e.file() == "shard_3.bin");
        CHECK(e.offset() == 4096);
    }
    CHECK_THROWS_AS(ring.next(), format_error);  // stays failed
    CHECK(ring.acquire(1) == nullptr);
}

TEST_CASE("HostRing.Config.BadShapesAndOversizedBatches") {
    CHECK_THROWS_AS(host_ring({.slots = 0, .slot_bytes = 8}), config_error);
    CHECK_THROWS_AS(host_ring({.slots = 2, .slot_bytes = 0}), config_error);
    host_ring ring({.slots = 1, .slot_bytes = 8});
    CHECK(reinterpret_cast<std::uintptr_t>(ring.acquire(0)) % 4096 == 0);  // page-aligned slots
    CHECK_THROWS_AS(ring.publish(0, 9), config_error);
}

TEST_CASE("HostRing.Stats.ConsumerWaitIsCountedWhenProducersAreLate") {
    host_ring ring({.slots = 2, .slot_bytes = 8});
    std::thread producer([&] {  // publishes once the consumer has gone to sleep waiting for it
        for (int i = 0; i < 100000 && ring.stats().consumer_sleeps == 0; ++i) std::this_thread::sleep_for(std::chrono::microseconds(100));
        ring.publish(0, 8);
    });
    ring.acquire(0);  // the slot is free from the start; the producer publishes it late
    auto h = ring.next();
    producer.join();
    CHECK(h);
    CHECK(ring.stats().consumer_wait_ns > 0);
}

TEST_CASE("MakeRing.Choice.CpuAutoAndCudaFollowTheMachine") {
    auto cpu = make_ring({.slots = 2, .slot_bytes = 64}, parse_device("cpu"));
    CHECK_FALSE(cpu.ring->on_device());
    CHECK(cpu.reason.find("cpu") != std::string::npos);
    auto gpu = gpu_probe();
    auto chosen = make_ring({.slots = 2, .slot_bytes = 64}, parse_device("auto"));
    CHECK(chosen.ring->on_device() == bool(gpu));
    if (!gpu) {
        CHECK(chosen.reason.find("no usable GPU") != std::string::npos);
        CHECK_THROWS_AS(make_ring({.slots = 2, .slot_bytes = 64}, parse_device("cuda:0")), config_error);
    }
    CHECK(parse_device("cuda:3").index == 3);
    CHECK(parse_device("2").kind == device_kind::cuda);
    // Without a number: the current device, resolved when the ring (or the pipeline) is made; a
    // numbered one stays as named.
    CHECK(parse_device("cuda").index < 0);
    CHECK(to_string(parse_device("cuda")) == "cuda");
    CHECK(to_string(parse_device("cuda:1")) == "cuda:1");
    CHECK(resolve_device(parse_device("cuda:3")).index == 3);
    int current = 0;
#if FEEDLINE_HAS_CUDA
    if (gpu) REQUIRE(cudaGetDevice(&current) == cudaSuccess);
#endif
    CHECK(resolve_device(parse_device("auto")).index == current);
    CHECK(resolve_device(parse_device("cuda")).index == current);
    CHECK_THROWS_AS(parse_device("tpu"), config_error);
    CHECK_THROWS_AS(parse_device("cuda:x"), config_error);
    // The whole protocol through whatever auto chose.
    run_producers_and_consumer(*chosen.ring, 2, 0, 300);
}

TEST_CASE("MakeRing.Numa.PinnedSlotsGoOnTheGpusNode") {
    auto two = read_topology({.root = std::string(FEEDLINE_SOURCE_DIR) + "/tests/fixtures/topology/two_socket_8gpu"});
    CHECK(detail::gpu_numa_node(two, "0000:18:00.0") == 0);
    CHECK(detail::gpu_numa_node(two, "0000:db:00.0") == 1);
    CHECK(detail::gpu_numa_node(two, "0000:ff:00.0") == -1);  // not a GPU of this machine
    CHECK(detail::gpu_numa_node(two, "") == -1);              // the runtime could not say
    auto vm = read_topology({.root = std::string(FEEDLINE_SOURCE_DIR) + "/tests/fixtures/topology/vm_1node"});
    CHECK(detail::gpu_numa_node(vm, "0000:18:00.0") == -1);  // one node: placement would be a no-op
}

TEST_CASE("HostRing.WaitCheck.EndsAWaitAndTakesNothing") {
    // A consumer whose wait check fires (Ctrl-C in the Python binding) gets wait_interrupted while the
    // batch is late, and the same batch, intact, on its next call.
    host_ring ring({.slots = 2, .slot_bytes = 16});
    std::atomic<int> checks{0};
    ring.set_wait_check([&] { return checks.fetch_add(1) + 1 >= 3; }, std::chrono::milliseconds(5));
    CHECK_THROWS_AS(ring.next(), feedline::wait_interrupted);
    CHECK(checks.load() == 3);  // it slept and checked until the check said stop
    fill(ring.acquire(0), 16, 0);
    ring.publish(0, 16);
    auto h = ring.next();
    REQUIRE(h);
    CHECK(h->sequence() == 0);
    CHECK(holds(h->host(), 16, 0));
}
