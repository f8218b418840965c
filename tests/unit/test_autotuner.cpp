// The autotuner's rules on measured intervals: which waits deepen the ring, wake a worker or park one,
// within the limits, with the start-up interval never judged.
#include <doctest/doctest.h>

#include <feedline/pipeline/detail/autotuner.hpp>

using namespace feedline;
using feedline::detail::autotuner;
using namespace std::chrono_literals;

namespace {

// Feeds intervals of 10 ms with the given waits (fractions of the interval, summed over producers).
struct driver {
    std::chrono::steady_clock::time_point t = std::chrono::steady_clock::time_point{} + 1s;  // before tuner, which starts at t
    autotuner tuner;
    ring_stats r;
    std::uint64_t delivered = 0;
    explicit driver(autotuner::limits l) : tuner(l, t) {}
    autotuner::knobs interval(autotuner::knobs now, double stalled, double producers_waited, unsigned producer_threads) {
        autotuner::knobs out = now;
        for (std::uint64_t i = 0; i < autotuner::every; ++i) {
            ++delivered;
            t += std::chrono::nanoseconds(10ms) / autotuner::every;
            if (i + 1 == autotuner::every) {
                r.consumer_wait_ns += static_cast<std::uint64_t>(stalled * 1e7);
                r.producer_wait_ns += static_cast<std::uint64_t>(producers_waited * 1e7);
            }
            out = tuner.after_batch(delivered, r, now, producer_threads, t);
            if (i + 1 < autotuner::every) CHECK(out.workers == now.workers);  // judged only every `every` batches
        }
        return out;
    }
};

constexpr autotuner::limits both{.tune_workers = true, .tune_depth = true, .max_workers = 3, .max_depth = 6};

}  // namespace

TEST_CASE("Autotuner.StartUp.TheFirstIntervalIsNotJudged") {
    driver d(both);
    const autotuner::knobs start{.workers = 3, .depth = 2};
    CHECK(d.interval(start, 0.9, 0.0, 3).workers == 3);  // a huge stall while the ring fills: ignored
    auto k = d.interval(start, 0.0, 3 * 0.9, 3);         // then: trainer never waits, workers idle
    CHECK(k.workers == 2);
    CHECK(k.depth == 2);
}

TEST_CASE("Autotuner.Workers.ParkedWhenTheTrainerIsSlowWokenWhenItStalls") {
    driver d(both);
    autotuner::knobs k{.workers = 3, .depth = 2};
    (void)d.interval(k, 0, 0, 3);
    // Slow trainer: each running worker waits for room most of the time; parks down to one, no lower.
    for (int i = 0; i < 5; ++i) k = d.interval(k, 0.001, 0.8 * k.workers, k.workers);
    CHECK(k.workers == 1);
    CHECK(k.depth == 2);
    // Half the workers' time waiting is not enough to park (they are busy half the interval).
    k = {.workers = 2, .depth = 2};
    CHECK(d.interval(k, 0.001, 0.4 * 2, 2).workers == 2);
    // The trainer stalls and the data side is busy: wake one per interval, up to the threads started.
    k = {.workers = 1, .depth = 2};
    for (int i = 0; i < 5; ++i) k = d.interval(k, 0.3, 0.0, k.workers);
    CHECK(k.workers == 3);
    CHECK(k.depth == 2);  // busy producers: a deeper ring would not help
}

TEST_CASE("Autotuner.Depth.DeepenedForABurstyTrainerUpToTheSlots") {
    driver d(both);
    autotuner::knobs k{.workers = 1, .depth = 2};
    (void)d.interval(k, 0, 0, 1);
    // Bursts: the trainer stalls (> 1%) while the producer also waited for room (> 10%).
    // Each raise adds half the depth (at least one): 2, 3, 4, 6.
    for (const std::size_t want : {3, 4, 6}) {
        k = d.interval(k, 0.2, 0.3, 1);
        CHECK(k.depth == want);
    }
    CHECK(k.workers == 1);  // depth first: the workers were idle, not short
    // At the slots allocated the ring cannot deepen: a stall is then answered with one more worker.
    k = d.interval(k, 0.2, 0.3, 1);
    CHECK(k.depth == 6);
    CHECK(k.workers == 2);
    // With one assembler as the only producer (text): its wait is judged alone, whatever the workers.
    driver text(both);
    autotuner::knobs t{.workers = 3, .depth = 2};
    (void)text.interval(t, 0, 0, 1);
    CHECK(text.interval(t, 0.2, 0.25, 1).depth == 3);
    // The same waits spread over 3 producers are 8% each: not a shallow ring.
    CHECK(text.interval(t, 0.2, 0.25, 3).depth == 2);
}

TEST_CASE("Autotuner.Fixed.NothingChangesWhatTheConfigFixed") {
    driver workers_fixed({.tune_workers = false, .tune_depth = true, .max_workers = 3, .max_depth = 6});
    autotuner::knobs k{.workers = 3, .depth = 2};
    (void)workers_fixed.interval(k, 0, 0, 3);
    CHECK(workers_fixed.interval(k, 0.0, 2.7, 3).workers == 3);
    driver depth_fixed({.tune_workers = true, .tune_depth = false, .max_workers = 3, .max_depth = 6});
    (void)depth_fixed.interval(k, 0, 0, 3);
    k = depth_fixed.interval(k, 0.2, 0.9, 3);
    CHECK(k.depth == 2);
    CHECK(k.workers == 3);  // already all running
    driver none({});
    CHECK_FALSE(none.tuner.enabled());
    CHECK(none.interval(k, 0.9, 0.9, 3).depth == 2);
}
