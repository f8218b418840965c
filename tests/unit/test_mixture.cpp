// Mixture schedules and the mixer: the within-one-sample guarantee over random schedules (stages,
// ramps, zero weights, domains that start mid-run), resume from any sample, and bad schedules.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <feedline/detail/quaternary_heap.hpp>
#include <feedline/detail/scratch_arena.hpp>
#include <feedline/sampling/mixer.hpp>
#include <feedline/sampling/mixture_schedule.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/sampling/state_io.hpp>

#include "synthetic_lengths.hpp"
#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

std::vector<std::string> names(std::size_t n) {
    std::vector<std::string> r;
    for (std::size_t i = 0; i < n; ++i) r.push_back(ft::numbered("d", i));
    return r;
}

// The first n in [lo, hi] where `reaches` holds, given that it holds at hi and never stops holding:
// a plain bisection, the tests' own answer to what first_reaching finds its way.
template <class Reaches>
std::uint64_t first_by_bisection(std::uint64_t lo, std::uint64_t hi, Reaches&& reaches) {
    while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (reaches(mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// A random schedule: 1-4 stages over the first ~60 steps, weights from a few values including 0 (at
// least one positive per stage), ramps of random length within their stage.
std::shared_ptr<const mixture_schedule> random_schedule(std::mt19937_64& rng, std::size_t domains) {
    const std::size_t stages = 1 + rng() % 4;
    std::vector<mixture_stage> st;
    std::uint64_t at = 0;
    const double values[] = {0, 0, 0.1, 1, 2.5, 7, 1000};
    for (std::size_t k = 0; k < stages; ++k) {
        mixture_stage s;
        s.at_step = at;
        for (std::size_t d = 0; d < domains; ++d) s.weights.push_back(values[rng() % 7]);
        if (std::all_of(s.weights.begin(), s.weights.end(), [](double w) { return w == 0; })) s.weights[rng() % domains] = 3;
        st.push_back(s);
        at += 1 + rng() % 20;
    }
    for (std::size_t k = 1; k < st.size(); ++k) {
        const std::uint64_t room = (k + 1 < st.size() ? st[k + 1].at_step : st[k].at_step + 30) - st[k].at_step;
        if (rng() % 2) st[k].ramp_steps = 1 + rng() % room;
        if (k + 1 < st.size()) st[k].ramp_steps = std::min(st[k].ramp_steps, room);
    }
    return std::make_shared<const mixture_schedule>(names(domains), st);
}

}  // namespace

TEST_CASE("Mixture.Bound.EveryDomainWithinOneSampleOfItsTargetAfterEverySample") {
    std::mt19937_64 rng(20261127);
    for (int trial = 0; trial < 300; ++trial) {
        const std::size_t D = 1 + rng() % 6;
        const auto schedule = random_schedule(rng, D);
        const std::uint64_t B = 1 + rng() % 9;
        mixer m(schedule, B);
        const std::uint64_t n = (schedule->stage_step(schedule->stages() - 1) + 40) * B;
        for (std::uint64_t i = 0; i < n; ++i) {
            const std::uint32_t d = m.next();
            REQUIRE(d < D);
            for (std::uint32_t x = 0; x < D; ++x) {
                INFO("trial ", trial, ", sample ", i, ", domain ", x, ": count ", m.taken()[x], ", target ",
                     m.targets().expected(x, i + 1));
                REQUIRE(m.within_bound(x));
            }
        }
    }
}

TEST_CASE("Mixture.Bound.SharesSumToOneAndRampsMoveLinearly") {
    std::vector<mixture_stage> st{{0, {1, 3}, 0, ""}, {10, {1, 0}, 4, ""}, {20, {0, 1}, 0, ""}};
    mixture_schedule s(names(2), st);
    CHECK(s.share(0, 0) == doctest::Approx(0.25));
    CHECK(s.share(0, 10) == doctest::Approx(0.25));   // the ramp starts at the weights before it
    CHECK(s.share(0, 12) == doctest::Approx(0.625));  // halfway to (1, 0)
    CHECK(s.share(0, 14) == doctest::Approx(1.0));
    CHECK(s.share(1, 25) == doctest::Approx(1.0));
    for (std::uint64_t step : {0u, 3u, 10u, 11u, 13u, 19u, 20u, 99u}) CHECK(s.share(0, step) + s.share(1, step) == doctest::Approx(1.0));
    // Exact targets: after the first stage (10 steps of 4 samples) domain 0 expects a quarter of 40.
    mixture_targets t(std::make_shared<const mixture_schedule>(s), 4);
    const auto f = t.target(0, 40);
    CHECK(f.num == 10 * f.den);
    // The ramp's 4 steps give domain 0 shares 1/4, 7/16, 5/8, 13/16 of 4 samples each: 8.5 samples.
    const auto g = t.target(0, 56);
    CHECK(g.num * 2 == 37 * g.den);
}

// first_reaching from a sample `from` is the first n >= from whose target reaches x, found here by
// walking n one by one: from before, inside and after each stage and ramp, for counts the target
// reaches in an earlier segment, in from's, in a later one, or never (zero weights at the end).
TEST_CASE("Mixture.Targets.ASearchFromAnySampleIsTheFirstSampleFromThereThatReaches") {
    std::mt19937_64 rng(20261129);
    for (int trial = 0; trial < 200; ++trial) {
        const std::size_t D = 1 + rng() % 5;
        const auto schedule = random_schedule(rng, D);
        const std::uint64_t B = 1 + rng() % 7;
        const mixture_targets t(schedule, B);
        const std::uint64_t horizon = (schedule->stage_step(schedule->stages() - 1) + 40) * B;
        for (int q = 0; q < 40; ++q) {
            const std::size_t d = rng() % D;
            const bool strictly = rng() % 2;
            const std::uint64_t from = rng() % horizon, x = rng() % (static_cast<std::uint64_t>(t.expected(d, horizon)) + 3);
            auto reaches = [&](std::uint64_t n) {
                const auto f = t.target(d, n);
                return strictly ? f.num > mixture_uint128{x} * f.den : f.num >= mixture_uint128{x} * f.den;
            };
            std::optional<std::uint64_t> want;
            for (std::uint64_t n = from; n < horizon + 2 * B; ++n)
                if (reaches(n)) {
                    want = n;
                    break;
                }
            const auto got = t.first_reaching(d, x, strictly, from);
            INFO("trial ", trial, ", domain ", d, ", x ", x, ", from ", from, strictly ? ", strictly" : "");
            if (want) {
                REQUIRE(got.has_value());
                CHECK(*got == *want);
                const auto from_zero = t.first_reaching(d, x, strictly);
                REQUIRE(from_zero.has_value());
                CHECK(std::max(*from_zero, from) == *want);
            } else {  // not within the horizon: later (a last stage's closed form) or never
                CHECK((!got || *got >= horizon + 2 * B));
            }
        }
    }
}

TEST_CASE("Mixture.Resume.AMixerRebuiltFromItsCountsGoesOnWithTheSameStream") {
    std::mt19937_64 rng(7);
    for (int trial = 0; trial < 60; ++trial) {
        const std::size_t D = 2 + rng() % 5;
        const auto schedule = random_schedule(rng, D);
        const std::uint64_t B = 1 + rng() % 8;
        mixer whole(schedule, B);
        std::vector<std::uint32_t> stream;
        const std::uint64_t n = (schedule->stage_step(schedule->stages() - 1) + 20) * B;
        for (std::uint64_t i = 0; i < n; ++i) stream.push_back(whole.next());
        for (int cut = 0; cut < 5; ++cut) {
            const std::uint64_t at = rng() % n;
            mixer first(schedule, B);
            for (std::uint64_t i = 0; i < at; ++i) first.next();
            mixer resumed(schedule, B, first.drawn(), first.taken());
            for (std::uint64_t i = at; i < n; ++i) {
                INFO("trial ", trial, ", resumed at ", at, ", sample ", i);
                REQUIRE(resumed.next() == stream[i]);
            }
        }
    }
}

TEST_CASE("Mixture.Resume.ADomainThatStartsMidRunDrawsNothingBefore") {
    std::vector<mixture_stage> st{{0, {1, 1, 0}, 0, ""}, {50, {1, 1, 2}, 0, ""}};
    const auto s = std::make_shared<const mixture_schedule>(names(3), st);
    mixer m(s, 16);
    for (int i = 0; i < 50 * 16; ++i) CHECK(m.next() != 2);
    std::uint64_t third = 0;
    for (int i = 0; i < 10 * 16; ++i) third += m.next() == 2;
    CHECK(third == 80);  // half of each step from step 50 on
}

TEST_CASE("Mixture.Scale.TenThousandDomainsStayWithinTheBound") {
    std::mt19937_64 rng(3);
    const std::size_t D = 10000;
    mixture_stage a{0, {}, 0, ""}, b{40, {}, 10, ""};
    for (std::size_t d = 0; d < D; ++d) {
        a.weights.push_back(static_cast<double>(1 + rng() % 100));
        b.weights.push_back(d % 3 == 0 ? 0.0 : static_cast<double>(1 + rng() % 100));
    }
    const auto s = std::make_shared<const mixture_schedule>(names(D), std::vector<mixture_stage>{a, b});
    mixer m(s, 1024);
    for (int i = 0; i < 60 * 1024; ++i) m.next();
    for (std::uint32_t d = 0; d < D; ++d) REQUIRE(m.within_bound(d));
}

// The mixer's heap pops in (key, id) order, as any correct priority queue would: a mixture's stream,
// and so every saved state, does not depend on which heap the mixer uses.
TEST_CASE("Mixture.Heap.PopsInKeyThenIdOrderUnderRandomPushesAndPops") {
    std::mt19937_64 rng(11);
    for (int round = 0; round < 20; ++round) {
        detail::quaternary_heap heap;
        std::set<std::pair<std::uint64_t, std::uint32_t>> reference;
        std::uint32_t next_id = 0;
        const std::uint64_t keys = 1 + rng() % 64;  // few keys: many ties broken by id
        for (int op = 0; op < 5000; ++op) {
            if (reference.empty() || rng() % 3 != 0) {
                // ids in a scrambled order, so a tie's lower id is not always the one pushed first
                const auto id = static_cast<std::uint32_t>(std::uint64_t{next_id++} * 2654435761u % 1000003u);  // unique: a prime modulus
                const std::uint64_t key = rng() % keys;
                heap.push({key, id});
                reference.insert({key, id});
            } else {
                REQUIRE(heap.top().key == reference.begin()->first);
                REQUIRE(heap.top().id == reference.begin()->second);
                heap.pop();
                reference.erase(reference.begin());
            }
            REQUIRE(heap.size() == reference.size());
        }
        while (!reference.empty()) {
            REQUIRE(heap.top().key == reference.begin()->first);
            REQUIRE(heap.top().id == reference.begin()->second);
            heap.pop();
            reference.erase(reference.begin());
        }
        CHECK(heap.empty());
    }
}

// Long stages and ramps (thousands of steps of 32 samples) and domains of small shares: first_reaching
// starts from an estimate in floating point there (a ramp moves its share step by step, not
// continuously), and must still give the first sample that reaches, as a plain bisection of the
// targets from `from` finds it.
TEST_CASE("Mixture.Targets.LongStagesAndRampsGiveTheFirstSampleThatReaches") {
    std::mt19937_64 rng(20261129);
    const std::size_t D = 300;
    const double values[] = {0, 0.01, 0.3, 1, 7, 1000};
    std::vector<mixture_stage> st{{0, {}, 0, ""}, {5000, {}, 3000, ""}, {9000, {}, 1, ""}, {20000, {}, 6000, ""}};
    for (auto& s : st) {
        for (std::size_t d = 0; d < D; ++d) s.weights.push_back(values[rng() % 6]);
        s.weights[0] = 1;
    }
    st[1].weights[1] = 0, st[2].weights[1] = 5;  // a domain whose share ramps up from 0
    const auto schedule = std::make_shared<const mixture_schedule>(names(D), st);
    const std::uint64_t B = 32, horizon = 30000 * B;
    const mixture_targets t(schedule, B);
    for (int q = 0; q < 3000; ++q) {
        const std::size_t d = q % 10 == 0 ? 1 : rng() % D;
        const bool strictly = rng() % 2;
        const std::uint64_t from = rng() % horizon;
        // Targets near from's (the mixer's questions) and anywhere up to the horizon's.
        const std::uint64_t at_from = static_cast<std::uint64_t>(t.expected(d, from)),
                            at_end = static_cast<std::uint64_t>(t.expected(d, horizon));
        const std::uint64_t x = rng() % 2 ? at_from + rng() % 3 : rng() % (at_end + 2);
        auto reaches = [&](std::uint64_t n) {
            const auto f = t.target(d, n);
            return strictly ? f.num > mixture_uint128{x} * f.den : f.num >= mixture_uint128{x} * f.den;
        };
        const auto got = t.first_reaching(d, x, strictly, from);
        INFO("query ", q, ", domain ", d, ", x ", x, ", from ", from, strictly ? ", strictly" : "");
        if (!reaches(horizon)) {  // later (the last stage's closed form) or never
            CHECK((!got || *got > horizon));
            continue;
        }
        REQUIRE(got.has_value());
        CHECK(*got == first_by_bisection(from, horizon, reaches));
    }
}

// The stream itself is pinned: states saved by earlier versions resume only if the mixer still draws
// the same domains. The hash was recorded with the binary-heap mixer (c84ca35) and must not change.
TEST_CASE("Mixture.Stream.TheDomainsDrawnAreThoseOfEarlierVersions") {
    std::mt19937_64 rng(5);
    const std::size_t D = 50;
    mixture_stage a{0, {}, 0, ""}, b{30, {}, 20, ""}, c{90, {}, 0, ""};  // a ramp, many ties, zero weights
    const double values[] = {0, 1, 1, 2, 3, 7};
    for (std::size_t d = 0; d < D; ++d) {
        a.weights.push_back(static_cast<double>(1 + d % 3));
        b.weights.push_back(values[rng() % 6]);
        c.weights.push_back(values[rng() % 6]);
    }
    b.weights[0] = c.weights[0] = 1;
    mixer m(std::make_shared<const mixture_schedule>(names(D), std::vector<mixture_stage>{a, b, c}), 64);
    std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the domains of 20,000 samples
    for (int i = 0; i < 20000; ++i) {
        hash ^= m.next();
        hash *= 1099511628211ull;
    }
    CHECK(hash == 17984278612134940215ull);
}

namespace {

// Draws `slots` samples from a mixer started at (drawn, taken), rebuilt from its counts at `rebuild_at`,
// each checked against the rule computed directly: among the domains whose next sample may be drawn
// (target after the slot passes their count), the earliest deadline (the slot where the target
// reaches count + 1), ties to the lower domain. Returns the counts.
std::vector<std::uint64_t> draw_by_the_rule(const std::shared_ptr<const mixture_schedule>& schedule, std::uint64_t batch,
                                            std::uint64_t drawn, std::vector<std::uint64_t> taken, std::uint64_t slots,
                                            std::uint64_t rebuild_at) {
    const std::size_t D = taken.size();
    const mixture_targets targets(schedule, batch);
    // Domain d's deadline for its next sample, by bisecting the targets themselves (not
    // first_reaching, which the mixer uses): kept until d draws.
    std::vector<std::optional<std::uint64_t>> deadlines(D);
    auto deadline_of = [&](std::uint32_t d) {
        if (!deadlines[d]) {
            auto reaches = [&](std::uint64_t n) {
                const auto f = targets.target(d, n);
                return f.num >= mixture_uint128{taken[d] + 1} * f.den;
            };
            const std::uint64_t last = mixture_schedule::max_samples - 1;
            deadlines[d] = reaches(last) ? first_by_bisection(0, last, reaches) - 1 : ~std::uint64_t{0};  // else never due
        }
        return *deadlines[d];
    };
    auto rule = [&](std::uint64_t slot) {
        std::uint32_t best = 0;
        std::uint64_t best_deadline = 0;
        bool any = false;
        for (std::uint32_t d = 0; d < D; ++d) {
            const auto f = targets.target(d, slot + 1);
            if (!(f.num > mixture_uint128{taken[d]} * f.den)) continue;  // may not draw yet
            const std::uint64_t deadline = deadline_of(d);
            if (!any || deadline < best_deadline) best = d, best_deadline = deadline, any = true;
        }
        REQUIRE(any);
        return best;
    };
    auto m = std::make_unique<mixer>(schedule, batch, drawn, taken);
    for (std::uint64_t slot = drawn; slot < drawn + slots; ++slot) {
        if (slot == rebuild_at) m = std::make_unique<mixer>(schedule, batch, slot, taken);
        const std::uint32_t d = m->next(), want = rule(slot);
        INFO("sample ", slot);
        REQUIRE(d == want);
        ++taken[d];
        deadlines[d].reset();
    }
    return taken;
}

}  // namespace

// The mixer files waiting samples on a wheel of slots and in a heap for those further off, and ready
// ones on a wheel by deadline and in a heap for those further off; its choices must be the rule's.
// Shares from 1,000 down to 0.001 put some domains' next samples and deadlines within the wheels and
// others far past them, in stages and a ramp; a mixer rebuilt from the counts mid-run files its domains
// from that slot on. 24 domains keep a wheel of one 64-bit word of marks, 100 one of four.
TEST_CASE("Mixture.Stream.TheWheelAndTheFarHeapDrawWhatTheRuleSays") {
    for (const std::size_t D : {std::size_t{24}, std::size_t{100}}) {
        const double values[] = {1000, 7, 1, 0.1, 0.01, 0.001, 0};
        std::mt19937_64 rng(11);
        mixture_stage a{0, {}, 0, ""}, b{200, {}, 150, ""}, c{700, {}, 0, ""};
        for (std::size_t d = 0; d < D; ++d) {
            a.weights.push_back(values[d % 6]);
            b.weights.push_back(values[rng() % 7]);
            c.weights.push_back(values[rng() % 7]);
        }
        b.weights[1] = c.weights[2] = 1;
        const auto schedule = std::make_shared<const mixture_schedule>(names(D), std::vector<mixture_stage>{a, b, c});
        const auto taken = draw_by_the_rule(schedule, 8, 0, std::vector<std::uint64_t>(D, 0), 12000, 5003);
        // Shares under one over the wheel's slots drew too: their samples waited in the far heap.
        const std::uint64_t wheel = std::bit_ceil(std::max<std::size_t>(2 * D, 64));
        std::size_t far = 0;
        for (std::uint32_t d = 0; d < D; ++d)
            if (taken[d] > 0 && taken[d] < 12000 / wheel) ++far;
        CHECK(far >= 4);
    }
}

// Domains of one weight keep the same deadlines, and others meet them wherever their targets reach
// whole numbers together: hundreds of domains can be due at one slot. The mixer files them in any
// order and sorts a slot's list when it comes first (then keeps it in order as more arrive); the
// draws must still be the rule's, ties to the lower domain, from the start and from a rebuilt mixer.
TEST_CASE("Mixture.Stream.HundredsOfDomainsDueAtOneSlotDrawWhatTheRuleSays") {
    const std::size_t D = 400;
    const double values[] = {1, 2, 3, 5};
    std::mt19937_64 rng(5);
    mixture_stage a{0, {}, 0, ""}, b{300, {}, 0, ""};
    for (std::size_t d = 0; d < D; ++d) {
        a.weights.push_back(values[rng() % 4]);
        b.weights.push_back(d % 2 ? 1 : 4);
    }
    const auto schedule = std::make_shared<const mixture_schedule>(names(D), std::vector<mixture_stage>{a, b});
    const auto taken = draw_by_the_rule(schedule, 4, 0, std::vector<std::uint64_t>(D, 0), 4000, 2501);
    for (std::uint32_t d = 0; d < D; ++d) CHECK(taken[d] > 0);
}

// A state within the bound from which not every deadline can be met (not one this schedule reaches
// drawing in order; an edited state file): domains 2 and 3 are both due at sample 4 and one must be
// late. The late one's deadline has passed while it waits, and it still goes first, as the rule says.
TEST_CASE("Mixture.Stream.AStateWithADeadlineThatCannotBeMetDrawsAsTheRuleSays") {
    const auto schedule = std::make_shared<const mixture_schedule>(
        names(4), std::vector<mixture_stage>{{0, {0.1, 0.1, 0.4, 0.4}, 0, ""}, {1, {0, 0, 1, 1}, 0, ""}});
    const auto taken = draw_by_the_rule(schedule, 4, 4, {1, 1, 1, 1}, 400, ~std::uint64_t{0});
    CHECK(taken[2] + taken[3] == 400 + 2);
}

TEST_CASE("Mixture.Config.BadSchedulesAreRefusedNamingTheField") {
    auto refused = [](std::vector<std::string> n, std::vector<mixture_stage> st, const std::string& field, const std::string& words) {
        try {
            mixture_schedule s(std::move(n), std::move(st));
            FAIL("accepted a schedule that should be refused: ", field);
        } catch (const config_error& e) {
            CHECK(e.field() == field);
            CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
        }
    };
    refused(names(2), {{0, {1, -1}, 0, "m.json:4"}}, "stages[0].weights.d1", "at least 0");
    refused(names(2), {{0, {1, std::nan("")}, 0, "m.json:4"}}, "stages[0].weights.d1", "m.json:4");
    refused(names(2), {{0, {0, 0}, 0, ""}}, "stages[0].weights", "every weight is 0");
    refused(names(2), {{0, {1, 1}, 0, ""}, {10, {1, 2}, 0, ""}, {5, {1, 1}, 0, "m.json:9"}}, "stages[2].at_step", "stages go forward");
    refused(names(2), {{0, {1, 1}, 0, ""}, {10, {1, 2}, 0, ""}, {10, {1, 1}, 0, ""}}, "stages[2].at_step", "does not come after");
    refused(names(2), {{3, {1, 1}, 0, ""}}, "stages[0].at_step", "step 0");
    refused({"web", "web"}, {{0, {1, 1}, 0, ""}}, "domains", "appears twice");
    refused(names(2), {{0, {1, 1, 1}, 0, ""}}, "stages[0].weights", "3 weights for 2 domains");
    refused(names(2), {{0, {1, 1}, 0, ""}, {10, {1, 2}, 11, ""}, {20, {1, 1}, 0, ""}}, "stages[1].ramp_steps", "past the next stage");
    refused(names(2), {{0, {1, 1}, 2, ""}}, "stages[0].ramp_steps", "ramp from");
    refused(names(2), {{0, {1, 1e-12}, 0, ""}}, "stages[0].weights.d1", "rounds to 0");
    refused(names(2), {}, "stages", "at least one stage");
    refused({}, {{0, {}, 0, ""}}, "domains", "at least one domain");
    refused(names(2), {{0, {1, 1}, 0, ""}, {std::uint64_t{1} << 48, {1, 2}, 0, ""}}, "stages[1].at_step", "past what a run can reach");
    refused(names(2), {{0, {1, 1}, 0, ""}, {~std::uint64_t{0} - 5, {1, 2}, 100, ""}}, "stages[1].at_step", "past what a run can reach");
}

TEST_CASE("Mixture.Resume.StatesThatThisScheduleCannotProduceAreRefused") {
    const auto s = std::make_shared<const mixture_schedule>(names(2), std::vector<mixture_stage>{{0, {1, 1}, 0, ""}});
    CHECK_THROWS_AS(mixer(s, 4, 10, {5, 4}), config_error);     // counts add up to 9, not 10
    CHECK_THROWS_AS(mixer(s, 4, 10, {8, 2}), config_error);     // 8 is 3 past a target of 5
    CHECK_THROWS_AS(mixer(s, 4, 10, {5, 5, 0}), config_error);  // three counts for two domains
    CHECK_NOTHROW(mixer(s, 4, 10, {5, 5}));
}

#if FEEDLINE_HAS_JSON
#include <feedline/sampling/mixture_file.hpp>

TEST_CASE("Mixture.File.AScheduleWithStagesAtStepsAndTokensAndARamp") {
    const std::string text = R"({
  "domains": [
    {"name": "web", "data": "/data/web/shard_*.bin"},
    {"name": "code", "data": ["/data/a_text_document", "/data/b_text_document"]},
    "math"
  ],
  "stages": [
    {"at_step": 0, "weights": {"web": 6, "code": 3, "math": 1}},
    {"at_tokens": 4096000, "ramp_steps": 10, "weights": {"web": 3, "code": 3, "math": 4}},
    {"at_step": 2000, "weights": {"math": 1}}
  ]
})";
    const mixture_file f = parse_mixture(text, "mix.json", 8 * 512);
    const mixture_schedule& s = *f.schedule;
    REQUIRE(s.domains() == 3);
    CHECK(s.names() == std::vector<std::string>{"web", "code", "math"});
    CHECK(f.data[0] == std::vector<std::string>{"/data/web/shard_*.bin"});
    CHECK(f.data[1].size() == 2);
    CHECK(f.data[2].empty());
    CHECK(f.declared_at[2] == "mix.json:5");
    CHECK(s.stage_step(1) == 1000);  // 4,096,000 tokens at 4096 per step
    CHECK(s.stage_ramp(1) == 10);
    CHECK(s.share(0, 999) == doctest::Approx(0.6));
    CHECK(s.share(0, 1005) == doctest::Approx(0.45));  // halfway from 0.6 to 0.3
    CHECK(s.share(2, 1010) == doctest::Approx(0.4));
    CHECK(s.share(2, 2000) == doctest::Approx(1.0));
    CHECK(s.share(0, 2000) == 0);
    // at_tokens rounds up to the first step by which that many tokens were delivered.
    CHECK(parse_mixture(
              R"({"domains": ["a", "b"], "stages": [{"at_step": 0, "weights": {"a": 1}}, {"at_tokens": 4097, "weights": {"b": 1}}]})", "m",
              4096)
              .schedule->stage_step(1) == 2);
}

// A mixture file's JSON tree takes its memory from a scratch arena (detail/scratch_arena.hpp), so that
// freeing it leaves no holes between the domains opened next. The arena's contract, then a parse of
// 3,000 domains with names too long for a string's inline buffer, inside an arena of the caller's
// (arenas nest: it takes nothing from the caller's), checked against what the file says
// (AddressSanitizer checks every free).
TEST_CASE("Mixture.File.TheParseTreeLivesInAScratchArenaGivenBackWhole") {
    using detail::scratch_allocator;
    using detail::scratch_arena;
    REQUIRE(scratch_arena::current() == nullptr);
    std::vector<int, scratch_allocator<int>> on_the_heap(1000, 7);  // no arena: the heap
    {
        scratch_arena outer;
        CHECK(scratch_arena::current() == &outer);
        CHECK_FALSE(outer.owns(on_the_heap.data()));
        std::vector<std::uint64_t, scratch_allocator<std::uint64_t>> v;
        for (std::uint64_t i = 0; i < 100000; ++i) v.push_back(i);  // grows past the first block: more blocks
        CHECK(outer.owns(v.data()));
        CHECK(outer.blocks() >= 2);
        CHECK(outer.bytes_used() >= v.size() * sizeof(std::uint64_t));
        CHECK(outer.bytes_mapped() >= outer.bytes_used());
        for (std::uint64_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == i);
        struct alignas(64) line {
            char bytes[64];
        };
        scratch_allocator<line> lines;
        line* l = lines.allocate(3);
        CHECK(reinterpret_cast<std::uintptr_t>(l) % 64 == 0);
        lines.deallocate(l, 3);
        const std::size_t used = outer.bytes_used();
        std::vector<int, scratch_allocator<int>>(5000, 1).swap(on_the_heap);  // freeing the heap's block while an arena lives
        CHECK(outer.owns(on_the_heap.data()));
        CHECK(outer.bytes_used() > used);
        std::vector<int, scratch_allocator<int>>().swap(on_the_heap);  // freed into the arena: nothing back until it goes
        scratch_allocator<char> bytes;
        char* big = bytes.allocate(scratch_arena::largest_block * 2);  // larger than any block: one of its own
        CHECK(outer.owns(big));
        CHECK(outer.owns(big + scratch_arena::largest_block * 2 - 1));
        {
            scratch_arena inner;
            CHECK(scratch_arena::current() == &inner);
            std::vector<int, scratch_allocator<int>> w(10, 3);
            CHECK(inner.owns(w.data()));
            CHECK_FALSE(outer.owns(w.data()));
            v.clear();
            v.shrink_to_fit();  // the outer arena's memory, freed while the inner one is current
        }
        CHECK(scratch_arena::current() == &outer);

        std::string text = R"({"domains": [)";
        for (int d = 0; d < 3000; ++d)
            text += (d ? "," : "") + std::string(R"({"name": "a_domain_with_a_long_name_)") + std::to_string(d) +
                    R"(", "data": "/data/a_directory_with_a_long_name/)" + std::to_string(d) + R"(.bin"})";
        text += R"(], "stages": [{"at_step": 0, "weights": {)";
        for (int d = 0; d < 3000; ++d)
            text += (d ? "," : "") + std::string(R"("a_domain_with_a_long_name_)") + std::to_string(d) + "\": " + std::to_string(d % 7 + 1);
        text += "}}]}";
        const std::size_t before_parse = outer.bytes_used();
        const mixture_file f = parse_mixture(text, "big.json");
        CHECK(scratch_arena::current() == &outer);
        CHECK(outer.bytes_used() == before_parse);  // the parse's tree went into an arena of its own, now gone
        REQUIRE(f.schedule->domains() == 3000);
        for (int d : {0, 1, 1234, 2999}) {
            CHECK(f.schedule->names()[d] == "a_domain_with_a_long_name_" + std::to_string(d));
            CHECK(f.data[d] == std::vector<std::string>{"/data/a_directory_with_a_long_name/" + std::to_string(d) + ".bin"});
        }
        double total = 0;
        for (int d = 0; d < 3000; ++d) total += d % 7 + 1;
        CHECK(f.schedule->share(1234, 0) == doctest::Approx((1234 % 7 + 1) / total));
    }
    CHECK(scratch_arena::current() == nullptr);
}

TEST_CASE("Mixture.File.BadInputNamesTheFieldAndTheLine") {
    auto refused = [](const std::string& text, const std::string& field, const std::string& where_and_words, std::uint64_t tps = 4096) {
        try {
            parse_mixture(text, "mix.json", tps);
            FAIL("accepted: ", text);
        } catch (const config_error& e) {
            CHECK_MESSAGE(e.field() == field, e.what());
            CHECK_MESSAGE(std::string(e.what()).find(where_and_words) != std::string::npos, e.what(), " lacks ", where_and_words);
        }
    };
    const std::string head = "{\n  \"domains\": [\"web\", \"code\"],\n  \"stages\": [\n";
    // A negative weight: its own line.
    refused(head + "    {\"at_step\": 0,\n     \"weights\": {\"web\": 1,\n                 \"code\": -2}}\n  ]\n}",
            "stages[0].weights.code", "mix.json:6: a weight must be a finite number");
    // NaN is not JSON: the parse error's line.
    refused(head + "    {\"at_step\": 0, \"weights\": {\"web\": NaN}}\n  ]\n}", "mixture", "mix.json:4: not JSON");
    // All zero at a stage: the stage's line.
    refused(head + "    {\"at_step\": 0, \"weights\": {\"web\": 1}},\n    {\"at_step\": 5, \"weights\": {\"web\": 0, \"code\": 0}}\n  ]\n}",
            "stages[1].weights", "mix.json:5: every weight is 0");
    // Steps that go backwards.
    refused(head +
                "    {\"at_step\": 0, \"weights\": {\"web\": 1}},\n    {\"at_step\": 9, \"weights\": {\"web\": 1}},\n    {\"at_step\": 4, "
                "\"weights\": {\"code\": 1}}\n  ]\n}",
            "stages[2].at_step", "mix.json:6: step 4 does not come after");
    // An unknown domain.
    refused(head + "    {\"at_step\": 0,\n     \"weights\": {\"web\": 1, \"cod\": 1}}\n  ]\n}", "stages[0].weights.cod",
            "mix.json:5: 'cod' is not one of the mixture's domains");
    // A duplicate name.
    refused(
        "{\n  \"domains\": [\"web\",\n              {\"name\": \"web\"}],\n  \"stages\": [{\"at_step\": 0, \"weights\": {\"web\": 1}}]\n}",
        "domains[1].name", "mix.json:3: the domain name 'web' appears twice (first at line 2)");
    // A misspelt field, at_tokens without a batch shape, both at_step and at_tokens, a fractional step.
    refused(head + "    {\"at_step\": 0, \"weight\": {\"web\": 1}}\n  ]\n}", "stages[0].weight", "mix.json:4: not a field of a stage");
    refused(head + "    {\"at_step\": 0, \"weights\": {\"web\": 1}},\n    {\"at_tokens\": 100, \"weights\": {\"web\": 1}}\n  ]\n}",
            "stages[1].at_tokens", "mix.json:5: at_tokens needs", 0);
    refused(head + "    {\"at_step\": 0, \"at_tokens\": 0, \"weights\": {\"web\": 1}}\n  ]\n}", "stages[0].at_tokens", "not both");
    refused(head + "    {\"at_step\": 0.5, \"weights\": {\"web\": 1}}\n  ]\n}", "stages[0].at_step", "mix.json:4: a whole number");
    refused("[1, 2]", "mixture", "mix.json:1: a mixture is a JSON object");
    // A number past a double's range is nlohmann's out_of_range, not a parse error (found by libFuzzer).
    refused(head + "    {\"at_step\": 0, \"weights\": {\"web\": 1e999}}\n  ]\n}", "mixture", "mix.json: not JSON a mixture can hold");
    // A long key over a long array in an unknown field: refused at once, with no index of its values.
    std::string zeros = "0";
    for (int i = 0; i < 200000; ++i) zeros += ",0";
    const std::string key(200000, 'k');
    refused("{\"domains\": [\"a\"], \"stages\": [{\"at_step\": 0, \"weights\": {\"a\": 1}}],\n \"" + key + "\": [" + zeros + "]}", key,
            "mix.json:2: not a field of a mixture");
    // Deep nesting in an unknown field is refused, not walked off the stack.
    refused("{\"domains\": [\"a\"], \"stages\": [{\"at_step\": 0, \"weights\": {\"a\": 1}}], \"x\": " + std::string(100000, '[') +
                std::string(100000, ']') + "}",
            "x", "mix.json:1: not a field of a mixture");
}
#endif

TEST_CASE("Mixture.FromStep.TheScheduleFromAStepOnHasTheSameSharesAndRefusesAStepInARamp") {
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 100; ++trial) {
        const auto s = random_schedule(rng, 3);
        const std::uint64_t last = s->stage_step(s->stages() - 1) + s->stage_ramp(s->stages() - 1) + 5;
        for (std::uint64_t step = 0; step < last; ++step) {
            bool in_ramp = false;
            for (std::size_t k = 0; k < s->stages(); ++k) in_ramp |= step > s->stage_step(k) && step < s->stage_step(k) + s->stage_ramp(k);
            if (in_ramp) {
                CHECK_THROWS_AS(s->from_step(step), config_error);
                continue;
            }
            const mixture_schedule r = s->from_step(step);
            for (std::uint64_t t = 0; t + step < last; ++t)
                for (std::size_t d = 0; d < 3; ++d) REQUIRE(r.share(d, t) == s->share(d, step + t));
            // The fingerprint follows what decides the stream: a shifted multi-stage schedule differs.
            if (s->stages() > 1) CHECK((step == 0) == (r.fingerprint() == s->fingerprint()));
        }
    }
}

// The sampler mixed by a schedule: resume at any step, elastic ranks, weights set during the run,
// another schedule only when asked for.
namespace {

struct mixed_data {
    std::vector<ft::synthetic_lengths> sets{ft::hashed_lengths(40, 60, 1), ft::hashed_lengths(70, 60, 2), ft::hashed_lengths(25, 60, 3)};
    std::vector<sampler_dataset> datasets() const {
        std::vector<sampler_dataset> r;
        for (const auto& s : sets) r.push_back({s.document_count(), [&s](std::uint64_t i) { return s.document_length(i); }, {}, false});
        return r;
    }
};

std::shared_ptr<const mixture_schedule> three_stages() {
    return std::make_shared<const mixture_schedule>(
        std::vector<std::string>{"web", "code", "math"},
        std::vector<mixture_stage>{{0, {6, 3, 1}, 0, ""}, {15, {3, 3, 4}, 6, ""}, {40, {0, 1, 1}, 0, ""}});
}

using sample_id = std::tuple<std::uint32_t, std::uint64_t, std::uint64_t>;  // dataset, epoch, index
std::vector<sample_id> ids_of(const batch_plan& b) {
    std::vector<sample_id> r;
    for (const auto& x : b.samples) r.emplace_back(x.dataset, x.epoch, x.index);
    return r;
}

sampler_config mixed_config(int rank = 0, int world = 1) {
    return {.seq_len = 16, .global_batch = 12, .seed = 5, .rank = rank, .world_size = world};
}

}  // namespace

TEST_CASE("Mixture.Sampler.ResumeAtAnyStepEqualsTheUninterruptedStreamAndKeepsTheBound") {
    const mixed_data data;
    const auto schedule = three_stages();
    sampler whole(data.datasets(), schedule, mixed_config());
    std::vector<std::vector<sample_id>> stream;
    std::vector<sampler_state> states;
    mixture_targets targets(schedule, 12);
    std::vector<std::uint64_t> counts(3, 0);
    std::uint64_t n = 0;
    for (int step = 0; step < 70; ++step) {
        states.push_back(whole.state());
        const batch_plan b = whole.next();
        stream.push_back(ids_of(b));
        for (const auto& x : b.samples) {
            ++counts[x.dataset];
            ++n;
            for (std::uint32_t d = 0; d < 3; ++d) {
                const auto f = targets.target(d, n);
                const auto c = mixture_uint128{counts[d]} * f.den;
                REQUIRE((c < f.num + f.den && f.num < c + f.den));
            }
        }
    }
    CHECK(counts[0] == 0 + whole.state().taken[0]);
    // Each dataset walks its own epochs: no (dataset, epoch, index) twice.
    std::set<sample_id> seen;
    for (const auto& b : stream)
        for (const auto& x : b) CHECK(seen.insert(x).second);
    for (int cut : {0, 1, 14, 15, 18, 21, 22, 39, 40, 41, 69}) {
        sampler resumed(data.datasets(), schedule, mixed_config());
        resumed.restore(sampler_state_from_json(to_json(states[cut])));
        for (int step = cut; step < 70; ++step) REQUIRE(ids_of(resumed.next()) == stream[step]);
    }
    // The shares in force follow the schedule: the ramp's middle, then the last stage.
    sampler probe(data.datasets(), schedule, mixed_config());
    probe.restore(states[18]);
    CHECK(probe.mixture_shares()[2] == doctest::Approx(schedule->share(2, 18)));
}

// What pipelines keep per batch in flight: each step's change, applied in order to the state before,
// gives the sampler's state after, field for field; including a step planned again after a restore
// (the sampler marks the datasets a step drew from per plan, not per step number) and epochs that end.
TEST_CASE("Mixture.Sampler.StepDeltasAppliedInOrderGiveTheStateAfterEachStep") {
    const mixed_data data;
    const auto follow = [](sampler& s, int steps) {
        sampler_state applied = s.state();
        batch_plan b;
        sampler_step_delta delta;
        std::set<std::uint32_t> drawn;
        for (int i = 0; i < steps; ++i) {
            s.next(b, delta);
            REQUIRE(delta.step == s.state().step);
            REQUIRE(delta.datasets.size() <= s.config().global_batch);
            delta.apply_to(applied);
            REQUIRE(applied == s.state());
            for (const auto& p : delta.datasets) drawn.insert(p.dataset);
        }
        return drawn;
    };
    SUBCASE("a mixture, across its stages and a ramp, and after a restore to an earlier step") {
        sampler s(data.datasets(), three_stages(), mixed_config());
        CHECK(follow(s, 30).size() == 3);
        const sampler_state at30 = s.state();
        (void)follow(s, 5);
        s.restore(at30);  // step 30 again: every dataset it draws from is in its delta once more
        CHECK(follow(s, 40).size() >= 2);
    }
    SUBCASE("a blend with fixed weights") {
        sampler s(data.datasets(), {0.5, 0.3, 0.2}, mixed_config());
        CHECK(follow(s, 60).size() == 3);
    }
    SUBCASE("one dataset, planned in order and at any step") {
        sampler s(std::vector<sampler_dataset>{data.datasets()[1]}, {1.0}, mixed_config());
        CHECK(follow(s, 25) == std::set<std::uint32_t>{0});
        sampler at(std::vector<sampler_dataset>{data.datasets()[1]}, {1.0}, mixed_config());
        batch_plan b;
        sampler_state after;
        sampler_step_delta delta;
        for (std::uint64_t step : {7u, 3u, 24u}) {
            at.plan_at(step, b, after, delta);
            sampler_state applied = at.state();
            delta.apply_to(applied);
            CHECK(applied == after);
        }
    }
}

TEST_CASE("Mixture.Sampler.TwoRanksThenThreeAfterAResumeEqualOneRanksGlobalStream") {
    const mixed_data data;
    const auto schedule = three_stages();
    sampler one(data.datasets(), schedule, mixed_config());
    std::vector<std::vector<sample_id>> global;
    for (int step = 0; step < 50; ++step) global.push_back(ids_of(one.next()));
    std::vector<sampler> two, three;
    for (int r = 0; r < 2; ++r) two.emplace_back(data.datasets(), schedule, mixed_config(r, 2));
    for (int step = 0; step < 23; ++step) {
        std::vector<sample_id> joined;
        for (auto& s : two) {
            const auto part = ids_of(s.next());
            joined.insert(joined.end(), part.begin(), part.end());
        }
        REQUIRE(joined == global[step]);
    }
    const std::string saved = to_json(two[1].state());
    CHECK(saved == to_json(two[0].state()));  // every rank holds the same state
    for (int r = 0; r < 3; ++r) {
        three.emplace_back(data.datasets(), schedule, mixed_config(r, 3));
        three.back().restore(sampler_state_from_json(saved));
    }
    for (int step = 23; step < 50; ++step) {
        std::vector<sample_id> joined;
        for (auto& s : three) {
            const auto part = ids_of(s.next());
            joined.insert(joined.end(), part.begin(), part.end());
        }
        REQUIRE(joined == global[step]);
    }
}

TEST_CASE("Mixture.Sampler.WeightsSetDuringTheRunAreRecordedAndResumeExactly") {
    const mixed_data data;
    const auto schedule = three_stages();
    sampler s(data.datasets(), schedule, mixed_config());
    for (int step = 0; step < 20; ++step) s.next();
    const auto at = s.state().taken;
    s.set_mixture_weights({1, 0, 3});
    CHECK(s.mixture_shares() == std::vector<double>{0.25, 0.0, 0.75});
    std::vector<std::vector<sample_id>> rest;
    sampler_state saved;
    for (int step = 20; step < 45; ++step) {
        if (step == 31) saved = s.state();
        rest.push_back(ids_of(s.next()));
    }
    // From step 20 the counts grow by the new shares: none for code, a quarter and three quarters.
    const auto& taken = s.state().taken;
    CHECK(taken[1] == at[1]);
    CHECK(std::abs(static_cast<double>(taken[0] - at[0]) - 0.25 * 25 * 12) < 1.0);
    CHECK(std::abs(static_cast<double>(taken[2] - at[2]) - 0.75 * 25 * 12) < 1.0);
    // The state holds the weights: a sampler made with the file's schedule resumes the same stream.
    sampler resumed(data.datasets(), schedule, mixed_config());
    resumed.restore(sampler_state_from_json(to_json(saved)));
    for (int step = 31; step < 45; ++step) REQUIRE(ids_of(resumed.next()) == rest[step - 20]);
    // Edited weights are refused (the state's check, then the mixture's own check without it).
    sampler_state edited = saved;
    edited.weights[1] = 1;
    CHECK_THROWS_AS(resumed.restore(edited), config_error);
    // A sampler without a schedule has no weights to set.
    std::vector<const ft::synthetic_lengths*> sets{&data.sets[0], &data.sets[1]};
    sampler plain(sets, {1, 1}, mixed_config());
    CHECK_THROWS_AS(plain.set_mixture_weights({1, 2}), config_error);
    CHECK_THROWS_AS(s.set_mixture_weights({1, -1, 1}), config_error);
    CHECK_THROWS_AS(s.set_mixture_weights({0, 0, 0}), config_error);
}

// Weights set for a later step (what a pipeline planning ahead uses): held in the state until the
// sampler plans that step, then the same stream as weights set right there; every state in between
// resumes it, step deltas carry the change, and bad steps and weights are refused.
TEST_CASE("Mixture.Sampler.WeightsSetForALaterStepAreHeldInTheStateUntilThen") {
    const mixed_data data;
    const auto schedule = three_stages();
    sampler direct(data.datasets(), schedule, mixed_config());
    std::vector<std::vector<sample_id>> expected;
    for (int step = 0; step < 45; ++step) {
        if (step == 26) direct.set_mixture_weights({1, 0, 3});
        if (step == 33) direct.set_mixture_weights({0, 2, 1});
        expected.push_back(ids_of(direct.next()));
    }
    sampler ahead(data.datasets(), schedule, mixed_config());
    std::vector<sampler_state> states;  // before each step
    for (int step = 0; step < 45; ++step) {
        if (step == 20) {
            ahead.set_mixture_weights({1, 0, 3}, 26);
            ahead.set_mixture_weights({5, 5, 5}, 33);
            ahead.set_mixture_weights({0, 2, 1}, 33);  // the same step again: replaces
            REQUIRE(ahead.state().pending_weights.size() == 2);
            CHECK(ahead.state().version == sampler_state::pending_version);
        }
        states.push_back(ahead.state());
        REQUIRE(ids_of(ahead.next()) == expected[static_cast<std::size_t>(step)]);
    }
    CHECK(ahead.state() == direct.state());  // both changes taken: a version-3 state again
    CHECK(ahead.state().version == sampler_state::mixture_version);
    CHECK(ahead.state().mixture_step == 33);
    for (std::size_t k : {20u, 24u, 26u, 29u, 33u, 40u}) {
        CAPTURE(k);
        CHECK(detail::sampler_state_from_bytes(detail::to_bytes(states[k])) == states[k]);
        sampler resumed(data.datasets(), schedule, mixed_config());
        resumed.restore(sampler_state_from_json(to_json(states[k])));
        for (std::size_t step = k; step < 45; ++step) REQUIRE(ids_of(resumed.next()) == expected[step]);
    }
    // Step deltas carry a change taken: applied in order, they give the state after each step.
    sampler planner(data.datasets(), schedule, mixed_config());
    planner.restore(states[20]);
    sampler_state applied = states[20];
    batch_plan plan;
    sampler_step_delta delta;
    for (int step = 20; step < 40; ++step) {
        planner.next(plan, delta);
        CHECK(delta.took_weights == (step == 26 || step == 33));
        delta.apply_to(applied);
        REQUIRE(applied == planner.state());
    }
    // A step passed, steps out of order, bad weights: refused, the state unchanged.
    ahead.set_mixture_weights({1, 1, 1}, 60);
    const sampler_state before = ahead.state();
    try {
        ahead.set_mixture_weights({1, 1, 1}, 44);
        FAIL("weights for a step already planned");
    } catch (const config_error& e) {
        CHECK(e.field() == "step");
    }
    CHECK_THROWS_AS(ahead.set_mixture_weights({1, 1, 1}, 50), config_error);
    CHECK_THROWS_AS(ahead.set_mixture_weights({1, -1, 1}, 70), config_error);
    CHECK_THROWS_AS(ahead.set_mixture_weights({0, 0, 0}, 70), config_error);
    CHECK_THROWS_AS(ahead.set_mixture_weights({1, 1}, 70), config_error);
    CHECK(ahead.state() == before);
    REQUIRE(before.pending_weights.size() == 1);
    CHECK(before.pending_weights[0].step == 60);
    // A state's own schedule goes on as it is, with the weights set for later steps.
    REQUIRE(states[22].mixture == 1);
    CHECK(ahead.with_mixture_from_step(states[22]) == states[22]);
    // A delta that says it took weights no state holds is refused, not undefined.
    sampler_state none = ahead.state();
    none.pending_weights.clear();
    none.version = sampler_state::mixture_version;
    sampler_step_delta bogus;
    bogus.took_weights = true;
    CHECK_THROWS_AS(bogus.apply_to(none), config_error);
    // Edited states are refused: a change before the state's step, changes out of order, bad weights,
    // a version-4 state without changes.
    sampler fresh(data.datasets(), schedule, mixed_config());
    auto refused = [&](sampler_state st, const std::string& field) {
        try {
            fresh.restore(st);
            FAIL("restored an edited state");
        } catch (const config_error& e) {
            CHECK(e.field().starts_with(field));
        }
    };
    sampler_state edited = states[22];
    edited.pending_weights[0].step = 21;
    refused(edited, "state.pending_weights[0]");
    edited = states[22];
    edited.pending_weights[1].step = 26;
    refused(edited, "state.pending_weights[1]");
    edited = states[22];
    edited.pending_weights[0].weights[1] = std::numeric_limits<double>::quiet_NaN();
    refused(edited, "state.pending_weights[0]");
    edited = states[22];
    edited.pending_weights.clear();
    refused(edited, "state.pending_weights");
    auto json = nlohmann::json::parse(to_json(states[22]));  // weights edited in a saved state: its check refuses them
    json["pending_weights"][0]["weights"][2] = 4;
    CHECK_THROWS_AS(sampler_state_from_json(json.dump()), format_error);
    // Going on with the schedule from a state whose weights were set during the run drops the changes
    // set for later steps too (they belonged to that run).
    sampler_state set_now = states[27];  // weights {1, 0, 3} in force from step 26, {0, 2, 1} for step 33
    REQUIRE(set_now.mixture == 2);
    const sampler_state from = fresh.with_mixture_from_step(set_now);
    CHECK(from.pending_weights.empty());
    CHECK(from.version == sampler_state::mixture_version);
    CHECK(from.mixture == 1);
}

TEST_CASE("Mixture.Sampler.AnotherScheduleGoesOnOnlyWhenAskedFromTheSavedStep") {
    const mixed_data data;
    sampler s(data.datasets(), three_stages(), mixed_config());
    for (int step = 0; step < 30; ++step) s.next();
    const sampler_state saved = s.state();
    const auto edited = std::make_shared<const mixture_schedule>(
        std::vector<std::string>{"web", "code", "math"},
        std::vector<mixture_stage>{{0, {6, 3, 1}, 0, ""}, {15, {3, 3, 4}, 6, ""}, {30, {1, 1, 1}, 0, ""}, {50, {0, 0, 1}, 5, ""}});
    sampler other(data.datasets(), edited, mixed_config());
    try {
        other.restore(saved);
        FAIL("restored a state saved with another schedule");
    } catch (const config_error& e) {
        CHECK(e.field() == "state.mixture_check");
    }
    // Asked for: targets count from the counts at step 30, with the edited schedule's stages from there.
    const sampler_state from = other.with_mixture_from_step(saved);
    other.restore(from);
    mixture_targets targets(std::make_shared<const mixture_schedule>(edited->from_step(30)), 12);
    std::vector<std::uint64_t> since(3, 0);
    std::uint64_t n = 0;
    for (int step = 30; step < 70; ++step)
        for (const auto& x : other.next().samples) {
            ++since[x.dataset];
            ++n;
            for (std::uint32_t d = 0; d < 3; ++d) REQUIRE(std::abs(static_cast<double>(since[d]) - targets.expected(d, n)) < 1.0);
        }
    // The continued run's own saves resume exactly, with the edited schedule.
    const sampler_state later = other.state();
    const auto next = ids_of(other.next());
    sampler again(data.datasets(), edited, mixed_config());
    again.restore(sampler_state_from_json(to_json(later)));
    CHECK(ids_of(again.next()) == next);
    // A step inside a ramp cannot be where a schedule takes over; a plain blend's state can go on.
    sampler_state in_ramp = saved;
    in_ramp.step = 52;
    CHECK_THROWS_AS(other.with_mixture_from_step(in_ramp), config_error);
    std::vector<const ft::synthetic_lengths*> sets{&data.sets[0], &data.sets[1], &data.sets[2]};
    sampler plain(sets, {1, 1, 1}, mixed_config());
    for (int step = 0; step < 7; ++step) plain.next();
    CHECK_THROWS_AS(other.restore(plain.state()), config_error);
    CHECK_NOTHROW(other.restore(other.with_mixture_from_step(plain.state())));
    CHECK_THROWS_AS(plain.restore(later), config_error);  // a mixed state needs its schedule
    // Asking to go on with the schedule a state already follows changes nothing: the same stream.
    CHECK(other.with_mixture_from_step(later) == later);
}

TEST_CASE("Mixture.Sampler.MixedStatesRoundTripAndEditsAreRefused") {
    const mixed_data data;
    const auto schedule = three_stages();
    sampler s(data.datasets(), schedule, mixed_config());
    for (int step = 0; step < 17; ++step) s.next();
    s.set_mixture_weights({2, 1, 1});
    for (int step = 17; step < 25; ++step) s.next();
    const sampler_state st = s.state();
    CHECK(st.mixed());
    CHECK(detail::sampler_state_from_bytes(detail::to_bytes(st)) == st);
    CHECK(sampler_state_from_json(to_json(st)) == st);
    // Counts moved between datasets (the sum kept) fail the JSON check; without it, the mixture's own.
    sampler_state moved = st;
    ++moved.mixture_taken[0];
    --moved.mixture_taken[1];
    std::string text = to_json(moved);
    CHECK_NOTHROW(sampler_state_from_json(text));  // to_json recomputes the check: it is the restore that refuses
    sampler fresh(data.datasets(), schedule, mixed_config());
    CHECK_THROWS_AS(fresh.restore(moved), config_error);
    // Counts moved by 3 between two datasets, their positions moved to match: only the mixture's bound
    // can tell.
    sampler_state far = st;
    far.taken[0] += 3;
    far.taken[1] -= 3;
    for (std::size_t i = 0; i < 2; ++i) {
        const std::uint64_t per = fresh.stream(i).samples_per_epoch(), t = far.taken[i];  // windows: every epoch alike
        far.epoch[i] = t == 0 ? 0 : (t - 1) / per;
        far.index[i] = t - far.epoch[i] * per;
    }
    try {
        fresh.restore(far);
        FAIL("restored counts 3 samples from their targets");
    } catch (const config_error& e) {
        CHECK(e.field() == "state.mixture_taken");
    }
    sampler_state wrong_step = st;
    wrong_step.mixture_step = 30;
    CHECK_THROWS_AS(fresh.restore(wrong_step), config_error);
    CHECK_THROWS_AS(with_global_batch(st, 24), config_error);
}

// The pipeline's writers take each step's rows in plan_drawn's order when it holds every row once, by
// dataset and then by row: batches of up to 64 rows a rank are ordered by counting, longer ones by a sort.
// Both, over 150 domains whose draws mostly differ within a step and a few heavy ones that repeat
// (runs of one dataset), for the whole batch and for one rank's slice of it.
TEST_CASE("Mixture.Sampler.EachStepsRowsComeInOrderOfDatasetThenRow") {
    const std::size_t D = 150;
    std::vector<ft::synthetic_lengths> sets;
    for (std::size_t d = 0; d < D; ++d) sets.push_back(ft::hashed_lengths(20 + d % 7, 60, d + 1));
    std::vector<sampler_dataset> datasets;
    for (const auto& s : sets) datasets.push_back({s.document_count(), [&s](std::uint64_t i) { return s.document_length(i); }, {}, false});
    std::vector<double> weights(D, 1.0);
    weights[3] = weights[77] = 60;  // about a third of every step between them
    const auto schedule = std::make_shared<const mixture_schedule>(names(D), std::vector<mixture_stage>{{0, weights, 0, ""}});
    for (const std::uint64_t batch : {std::uint64_t{12}, std::uint64_t{64}, std::uint64_t{130}, std::uint64_t{200}}) {  // 64 and 65 a rank at 2
        for (const int world : {1, 2}) {
            INFO("batch ", batch, ", world ", world);
            sampler s(datasets, schedule, {.seq_len = 16, .global_batch = batch, .seed = 9, .rank = world - 1, .world_size = world});
            bool repeats = false;
            for (int step = 0; step < 25; ++step) {
                const batch_plan b = s.next();
                const auto& order = b.by_dataset;
                REQUIRE(order.size() == b.samples.size());
                std::vector<bool> seen(order.size(), false);
                for (std::size_t i = 0; i < order.size(); ++i) {
                    REQUIRE(order[i] < b.samples.size());
                    CHECK_FALSE(seen[order[i]]);
                    seen[order[i]] = true;
                    if (i == 0) continue;
                    const auto before = std::pair{b.samples[order[i - 1]].dataset, order[i - 1]};
                    const auto here = std::pair{b.samples[order[i]].dataset, order[i]};
                    CHECK(before < here);
                    repeats = repeats || before.first == here.first;
                }
            }
            CHECK(repeats);  // runs of one dataset were ordered too
        }
    }
}
