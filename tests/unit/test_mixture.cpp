// Mixture schedules and the mixer: the within-one-sample guarantee over random schedules (stages,
// ramps, zero weights, domains that start mid-run), resume from any sample, and bad schedules.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <feedline/sampling/mixer.hpp>
#include <feedline/sampling/mixture_schedule.hpp>

using namespace feedline;

namespace {

std::vector<std::string> names(std::size_t n) {
    std::vector<std::string> r;
    for (std::size_t i = 0; i < n; ++i) r.push_back("d" + std::to_string(i));
    return r;
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
    // Deep nesting in an unknown field is refused, not walked off the stack.
    refused("{\"domains\": [\"a\"], \"stages\": [{\"at_step\": 0, \"weights\": {\"a\": 1}}], \"x\": " + std::string(100000, '[') +
                std::string(100000, ']') + "}",
            "x", "mix.json:1: not a field of a mixture");
}
#endif
