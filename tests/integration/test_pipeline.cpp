// The pipeline end to end on real shards: batches equal what the sampler's plan says, read through a
// plain reader; the same batches with 1 or 3 workers; exact resume (in a new pipeline with another
// worker count, with batches prefetched at save time); packed rows carry consistent boundaries; a shard
// truncated mid-run surfaces at next() as a format_error; configs that cannot work fail at
// construction with the numbers; resident anonymous memory stays within the budget.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <unistd.h>

#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Megatron shards whose tokens are globally unique (document d holds d*1000 + i), so any misplaced
// token shows. Lengths 0..199.
std::shared_ptr<const token_dataset> make_dataset(const ft::scratch_dir& dir, int shards = 3, int docs = 120,
                                                  token_dtype dt = token_dtype::int32) {
    std::vector<std::string> prefixes;
    std::mt19937 rng(11);
    std::uint32_t doc = 0;
    for (int k = 0; k < shards; ++k) {
        prefixes.push_back(dir / ("part_" + std::to_string(k)));
        megatron_writer w(prefixes.back(), dt);
        for (int i = 0; i < docs; ++i, ++doc) {
            std::vector<std::uint32_t> t(rng() % 200);
            for (std::size_t j = 0; j < t.size(); ++j)
                t[j] = dt == token_dtype::uint16 ? (doc * 7 + j) % 65000 : doc * 1000 + static_cast<std::uint32_t>(j);
            w.add_document(t);
        }
        w.finish();
    }
    return std::make_shared<const token_dataset>(prefixes);
}

struct copied {
    std::uint64_t step;
    std::vector<std::int32_t> inputs, targets, positions, cu;
    friend bool operator==(const copied&, const copied&) = default;
};

std::vector<copied> take(pipeline& p, std::uint64_t n) {
    std::vector<copied> out;
    for (std::uint64_t i = 0; i < n; ++i) {
        auto b = p.next();
        REQUIRE(b);
        auto in = b->host_inputs(), tg = b->host_targets(), pos = b->host_position_ids(), cu = b->host_cu_seqlens();
        out.push_back({b->step(), {in.begin(), in.end()}, {tg.begin(), tg.end()}, {pos.begin(), pos.end()}, {cu.begin(), cu.end()}});
    }
    return out;
}

// A planned sample's tokens, read one segment at a time with pread: the reference for a batch's row.
std::vector<std::int32_t> read_window(const token_dataset& data, pread_reader& r, const sample_plan& sample) {
    std::vector<std::int32_t> window;
    for (const auto& seg : sample.segments) {
        std::vector<std::int32_t> t(seg.length);
        data.read_tokens(r, data.document(seg.document), seg.offset, seg.length, t.data());
        window.insert(window.end(), t.begin(), t.end());
    }
    return window;
}

// Three domains' shards (web: 2 shards of 80 documents, code: 100, math: 60) and a mixture file
// naming them, whose stages write() sets.
struct three_domains {
    ft::scratch_dir dir, web, code, math;
    std::string mix = dir / "mix.json";
    three_domains() {
        (void)make_dataset(web, 2, 80);
        (void)make_dataset(code, 1, 100);
        (void)make_dataset(math, 1, 60);
    }
    void write(const std::string& stages) const {
        ft::write_text(mix, "{\"domains\": [{\"name\": \"web\", \"data\": \"" + (web / "part_*") +
                                "\"},\n {\"name\": \"code\", \"data\": \"" + (code / "part_0") +
                                "\"},\n {\"name\": \"math\", \"data\": \"" + (math / "part_0") + "\"}],\n \"stages\": [" + stages + "]}");
    }
};

pipeline_config base(unsigned workers, sample_mode mode = sample_mode::windows) {
    return {.batch_size = 4,
            .seq_len = 64,
            .seed = 3,
            .mode = mode,
            .workers = workers,
            .memory_budget = 64 << 20,
            .device = device_kind::cpu,
            .rank = 0,
            .world_size = 1};
}

}  // namespace

TEST_CASE("Pipeline.Windows.BatchesAreThePlannedTokens") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    pipeline p(data, base(2));
    auto got = take(p, 30);
    // The reference: the same sampler, tokens read one segment at a time with pread.
    sampler s(*data, {.seq_len = 64, .global_batch = 4, .seed = 3, .rank = 0, .world_size = 1}, data->shard_document_starts());
    pread_reader r;
    for (std::uint64_t step = 0; step < 30; ++step) {
        auto plan = s.next();
        CHECK(got[step].step == step);
        for (std::size_t i = 0; i < plan.samples.size(); ++i) {
            const auto window = read_window(*data, r, plan.samples[i]);
            REQUIRE(window.size() == 65);
            REQUIRE(std::equal(window.begin(), window.end() - 1, got[step].inputs.begin() + static_cast<std::ptrdiff_t>(i * 64)));
            REQUIRE(std::equal(window.begin() + 1, window.end(), got[step].targets.begin() + static_cast<std::ptrdiff_t>(i * 64)));
        }
    }
    auto st = p.stats();
    CHECK(st.batches == 30);
    CHECK(st.tokens == 30 * 4 * 64);
    CHECK(st.bytes_read >= 30 * 4 * 65 * 4);
    CHECK(st.to_json().find("\"stall_fraction\"") != std::string::npos);
}

TEST_CASE("Pipeline.Llmc.WindowsRunThroughShardsInStreamOrder") {
    // llm.c shards: the documents' tokens continue one counter, so inside a window every token is its
    // predecessor + 1, except around document delimiters and where the window steps from one
    // (shuffled) shard into the next.
    ft::scratch_dir dir;
    llmc_writer w(dir / "stream", token_dtype::uint16, 50256, 5000);
    std::uint32_t next = 0;
    for (int d = 0; d < 60; ++d) {
        std::vector<std::uint16_t> doc(1 + d * 7 % 400);
        for (auto& t : doc) t = static_cast<std::uint16_t>(next++ % 50000);
        w.add_document(doc);
    }
    auto shards = w.finish();
    REQUIRE(shards.size() > 2);
    auto data = std::make_shared<const token_dataset>(dir / "stream_*.bin");
    pipeline p(data, base(2));
    std::set<std::int32_t> firsts;
    for (auto& b : take(p, 40))
        for (std::size_t row = 0; row < 4; ++row) {
            int jumps = 0;
            for (std::size_t j = 0; j + 1 < 64; ++j) {
                const std::int32_t a = b.inputs[row * 64 + j], c = b.inputs[row * 64 + j + 1];
                REQUIRE(b.targets[row * 64 + j] == c);
                if (a == 50256 || c == 50256) continue;  // each llm.c document starts with the delimiter
                jumps += c != (a + 1) % 50000;
            }
            CHECK(jumps <= 1);  // a window is shorter than a shard: it crosses at most one boundary
            firsts.insert(b.inputs[row * 64]);
        }
    CHECK(firsts.size() > 100);  // windows come from all over the stream
}

TEST_CASE("Pipeline.Workers.SameBatchesWithOneOrThreeWorkers") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 100, token_dtype::uint16);
    for (auto mode : {sample_mode::windows, sample_mode::packed}) {
        pipeline one(data, base(1, mode)), three(data, base(3, mode));
        CHECK(take(one, 60) == take(three, 60));
    }
}

TEST_CASE("Pipeline.Autotune.ParksWorkersForASlowTrainerWithoutChangingTheData") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 100, token_dtype::uint16);
    auto cfg = base(0);  // workers = 0: the autotuner decides, up to max_workers
    cfg.max_workers = 3;
    cfg.max_steps = 320;
    pipeline tuned(data, cfg), fixed(data, base(1));
    unsigned fewest = 3, most_after = 0;
    std::vector<copied> a;
    for (std::uint64_t i = 0; i < 320; ++i) {
        auto b = tuned.next();
        REQUIRE(b);
        a.push_back(
            {b->step(), {b->host_inputs().begin(), b->host_inputs().end()}, {b->host_targets().begin(), b->host_targets().end()}, {}, {}});
        b.reset();
        if (i < 160) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3));  // a trainer much slower than the data side
            fewest = std::min(fewest, tuned.active_workers());
        } else {
            most_after = std::max(most_after, tuned.active_workers());  // then one that only waits for data
        }
    }
    CHECK_FALSE(tuned.next());  // ends after max_steps even with workers parked
    CHECK(fewest == 1);         // producers waited on free slots: parked down to one
    CHECK(most_after > 1);      // the trainer stalled: parked workers woke up
    CHECK(tuned.stats().workers == 3);
    auto b = take(fixed, 320);
    for (auto& c : b) c.positions.clear(), c.cu.clear();
    CHECK(a == b);
    // A fixed worker count is never tuned.
    pipeline pinned(data, base(3));
    (void)take(pinned, 40);
    CHECK(pinned.active_workers() == 3);
}

TEST_CASE("Pipeline.Autotune.DeepensThePrefetchForABurstyTrainerWithoutChangingTheData") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(1);  // one fixed worker; prefetch = 0: the depth is tuned
    cfg.batch_size = 32;
    cfg.seq_len = 1024;
    cfg.max_steps = 160;
    pipeline tuned(data, cfg);
    const std::size_t start = tuned.prefetch_depth();
    CHECK(start == 2);
    CHECK(tuned.memory().slots == 8);  // room to grow (8 per worker for a small batch), planned and allocated up front
    // The trainer's burst must outrun the worker, whatever the machine: it keeps only a strided sample
    // of each batch (a full copy costs about as much as making the batch, and then no trainer stalls).
    auto sample = [](const auto& b) {
        std::vector<std::int64_t> s{static_cast<std::int64_t>(b.step())};
        auto in = b.host_inputs(), tg = b.host_targets();
        for (std::size_t k = 0; k < in.size(); k += 97) s.push_back(in[k]), s.push_back(tg[k]);
        return s;
    };
    std::vector<std::vector<std::int64_t>> a;
    // Gradient accumulation's rhythm: 8 batches back to back, then an optimizer step. The pause is
    // measured, not fixed, so the test holds at any speed (sanitizers, a loaded machine): it lasts
    // until the worker has filled the ring and sits waiting for room, then as long again as the burst
    // took. The trainer then empties the shallow ring and waits for the rest of its burst.
    auto burst_start = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0; i < 160; ++i) {
        {
            auto b = tuned.next();
            REQUIRE(b);
            a.push_back(sample(*b));
        }  // released before the pause: a held batch would count against the depth
        if (i % 8 != 7 || i + 1 == 160) continue;
        const auto burst = std::chrono::steady_clock::now() - burst_start;
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (tuned.stats().ready_batches < tuned.prefetch_depth() && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::this_thread::sleep_for(burst);
        burst_start = std::chrono::steady_clock::now();
    }
    CHECK(tuned.prefetch_depth() > start);
    CHECK(tuned.prefetch_depth() <= tuned.memory().slots);
    CHECK(tuned.stats().prefetch_depth == tuned.prefetch_depth());
    CHECK(tuned.active_workers() == 1);
    auto fixed_cfg = cfg;
    fixed_cfg.prefetch = 2;  // a fixed depth is never tuned, and the batches are the same
    pipeline fixed(data, fixed_cfg);
    std::vector<std::vector<std::int64_t>> b;
    while (auto batch = fixed.next()) b.push_back(sample(*batch));
    CHECK(a == b);
    CHECK(fixed.prefetch_depth() == 2);
}

TEST_CASE("Pipeline.Resume.ExactWithAnotherWorkerCountAndPrefetchedBatches") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    for (auto mode : {sample_mode::windows, sample_mode::packed}) {
        pipeline whole(data, base(2, mode));
        auto expected = take(whole, 50);
        for (std::uint64_t k : {0ull, 1ull, 17ull, 49ull}) {
            CAPTURE(k);
            std::vector<std::uint8_t> saved;
            std::vector<copied> got;
            {
                pipeline first(data, base(3, mode));
                got = take(first, k);
                // Workers have run ahead (up to the ring's slots); the state counts only what was taken.
                auto bytes = detail::to_bytes(first.state());
                saved.assign(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                             reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size());
            }
            pipeline second(data, base(1, mode));
            second.restore(detail::sampler_state_from_bytes(std::as_bytes(std::span(saved))));
            auto rest = take(second, 50 - k);
            got.insert(got.end(), rest.begin(), rest.end());
            REQUIRE(got == expected);
        }
    }
}

TEST_CASE("Pipeline.Resume.AnotherGlobalBatchGoesOnFromTheSameSampleAndEpochsStillEndTheRun") {
    // Saved with batch 4 after 17 steps, restored with batch 6 (two workers): refused by default; with
    // from_same_sample the batches are the windows a sampler with that batch plans from the same
    // sample on, and `epochs = 2` ends the run where epoch 2 begins from there.
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(2);
    cfg.epochs = 2;
    pipeline first(data, cfg);
    take(first, 17);
    const pipeline_state saved = pipeline_state_from_json(to_json(first.state()));
    auto wider = cfg;
    wider.batch_size = 6;
    pipeline second(data, wider);
    CHECK_THROWS_WITH_AS(second.restore(saved), doctest::Contains("state.global_batch"), config_error);
    second.restore(saved, global_batch_change::from_same_sample);
    CHECK(second.state().step == 17);
    CHECK(second.state().origin_drawn == 17 * 4);
    sampler s(*data, {.seq_len = 64, .global_batch = 6, .seed = 3, .rank = 0, .world_size = 1}, data->shard_document_starts());
    s.restore(with_global_batch(saved, 6));
    const std::uint64_t end = s.first_step_of_epoch(2);
    CHECK(second.end_step() == end);
    CHECK(end > 17);
    const auto got = take(second, end - 17);
    CHECK_FALSE(second.next());
    pread_reader r;
    for (std::uint64_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        const auto plan = s.next();
        REQUIRE(got[i].step == 17 + i);
        REQUIRE(plan.epoch < 2);
        for (std::size_t j = 0; j < plan.samples.size(); ++j) {
            const auto window = read_window(*data, r, plan.samples[j]);
            REQUIRE(std::equal(window.begin(), window.end() - 1, got[i].inputs.begin() + static_cast<std::ptrdiff_t>(j * 64)));
        }
    }
    CHECK(to_json(second.state()) == to_json(s.state()));
    CHECK(s.next().epoch == 2);  // the run ended where the third epoch begins
    // A later restore of a state with the pipeline's own batch ends where `epochs` ends a whole run,
    // and so does set_epoch (a walk from step 0 with this batch).
    pipeline third(data, wider);
    third.restore(second.state(), global_batch_change::from_same_sample);
    CHECK(third.end_step() == end);
    third.restore(pipeline(data, wider).state());
    CHECK(third.end_step() == pipeline(data, wider).end_step());
    third.restore(saved, global_batch_change::from_same_sample);
    CHECK(third.end_step() == end);
    third.set_epoch(1);
    CHECK(third.end_step() == pipeline(data, wider).end_step());
    // The saved position is checked against its own batch before it is carried over: an epoch it
    // cannot be at after 17 steps of 4 is refused.
    pipeline_state edited = saved;
    edited.epoch[0] += 5;
    pipeline fourth(data, wider);
    CHECK_THROWS_WITH_AS(fourth.restore(edited, global_batch_change::from_same_sample), doctest::Contains("state.index"), config_error);
}

TEST_CASE("Pipeline.Packed.BoundariesAndTargetsAgree") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    pipeline p(data, base(2, sample_mode::packed));
    for (auto& b : take(p, 40)) {
        for (std::size_t row = 0; row < 4; ++row) {
            const std::int32_t* cu = b.cu.data() + row * 65;
            const std::int32_t* in = b.inputs.data() + row * 64;
            const std::int32_t* tg = b.targets.data() + row * 64;
            const std::int32_t* pos = b.positions.data() + row * 64;
            REQUIRE(cu[0] == 0);
            std::size_t piece = 0;
            for (std::int32_t j = 0; j < 64; ++j) {
                while (piece + 1 < 65 && cu[piece + 1] <= j && cu[piece + 1] > cu[piece]) ++piece;
                const bool used = j < cu[64];
                if (!used) {
                    REQUIRE(tg[j] == -1);
                    REQUIRE(in[j] == 0);
                    continue;
                }
                REQUIRE(pos[j] == j - cu[piece]);
                // Inside a piece tokens are consecutive within their document (d*1000 + i), and the
                // target is the next one; a piece's last token has no target.
                if (j + 1 < cu[piece + 1]) {
                    REQUIRE(in[j + 1] == in[j] + 1);
                    REQUIRE(tg[j] == in[j + 1]);
                } else {
                    REQUIRE(tg[j] == -1);
                }
            }
        }
    }
    CHECK(p.stats().padding_tokens > 0);
}

TEST_CASE("Pipeline.Threads.WorkersAreNamedForTopAndPerf") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 100);
    {
        pipeline p(data, base(2));
        CHECK_FALSE(ft::has_thread_named("feedline-w0"));  // threads start at the first next()
        REQUIRE(p.next());
        for (int i = 0; i < 5000 && !(ft::has_thread_named("feedline-w0") && ft::has_thread_named("feedline-w1")); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK(ft::has_thread_named("feedline-w0"));
        CHECK(ft::has_thread_named("feedline-w1"));
    }
    CHECK_FALSE(ft::has_thread_named("feedline-w0"));
}

TEST_CASE("Pipeline.Placement.TheWorkerLeavesABusyTrainersCpu") {
    // A trainer that computes between batches (a 200 us busy step) and one worker: when the process
    // may use two or more CPUs, the worker's affinity becomes every allowed CPU but the one the
    // trainer was last seen busy on, so a release that wakes the worker cannot queue it behind the
    // trainer (exec/trainer_cpu.hpp). With avoid_trainer_cpu = false nothing is pinned.
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 400);
    const std::vector<int> process = ft::allowed_cpus_of_this_thread();  // empty if unreadable: treated as one CPU
    {
        auto c = base(1);
        c.avoid_trainer_cpu = false;
        pipeline p(data, c);
        for (int i = 0; i < 50; ++i) {
            REQUIRE(p.next());
            ft::busy_step();
        }
        CHECK(ft::allowed_cpus_of_thread("feedline-w0") == process);
        CHECK(p.stats().trainer_cpu == -1);
        CHECK(p.stats().worker_placement.rfind("left to the kernel", 0) == 0);
    }
    pipeline p(data, base(1));
    if (process.size() < 2) {
        REQUIRE(p.next());
        CHECK(p.stats().worker_placement.rfind("may share the trainer's CPU", 0) == 0);
        return;
    }
    CHECK(ft::busy_trainer_until_kept_off(p, "feedline-w0", process));
    CHECK(p.stats().worker_placement.rfind("off the trainer's CPU", 0) == 0);
}

TEST_CASE("Pipeline.Placement.TheTrainerStopsSpinningOnlyWhenWorkersTakeEveryCpuOfALargeHost") {
    // The rule (pipeline/detail/delivery.hpp): spin unless the workers take every CPU and there are
    // at least defaults::min_cpus_for_sleeping_trainer of them.
    const unsigned large = defaults::min_cpus_for_sleeping_trainer;
    CHECK_FALSE(detail::trainer_spins_while_waiting(static_cast<int>(large), large));
    CHECK_FALSE(detail::trainer_spins_while_waiting(16, 16));
    CHECK_FALSE(detail::trainer_spins_while_waiting(16, 20));
    CHECK(detail::trainer_spins_while_waiting(16, 15));
    CHECK(detail::trainer_spins_while_waiting(static_cast<int>(large) - 1, large - 1));  // a small host keeps spinning
    CHECK(detail::trainer_spins_while_waiting(2, 2));
    CHECK(detail::trainer_spins_while_waiting(0, 64));  // affinity unreadable: nothing known against spinning
    // And it polls for its batch past the short spin only while the workers leave it a CPU.
    const auto poll = defaults::trainer_poll_with_a_spare_cpu;
    CHECK(poll > std::chrono::microseconds(0));
    CHECK(detail::trainer_poll_while_waiting(2, 1) == poll);
    CHECK(detail::trainer_poll_while_waiting(16, 15) == poll);
    CHECK(detail::trainer_poll_while_waiting(2, 2) == std::chrono::microseconds(0));
    CHECK(detail::trainer_poll_while_waiting(16, 20) == std::chrono::microseconds(0));
    CHECK(detail::trainer_poll_while_waiting(0, 1) == std::chrono::microseconds(0));  // CPUs unknown: no poll

    // A real pipeline with a worker on every CPU of its affinity (confined to `large` CPUs where the
    // machine has more): next() sleeps at once, and workers_reason says one fewer worker is usually
    // faster, only when the host is large enough. Only timing changes: one worker fewer delivers the
    // same batches.
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 400);
    std::vector<int> cpus = ft::allowed_cpus_of_this_thread();
    REQUIRE_FALSE(cpus.empty());
    std::optional<ft::scoped_affinity> confined;
    if (cpus.size() > large) {
        cpus.resize(large);
        confined.emplace(cpus);
        if (!confined->ok()) {
            MESSAGE("sched_setaffinity refused: the pipeline half of this test needs it on a machine of more than " << large << " CPUs");
            return;
        }
    }
    struct run {
        std::vector<std::int32_t> inputs;
        std::string placement, reason;
    };
    auto take = [&](unsigned workers) {
        run r;
        pipeline p(data, base(workers));
        for (int i = 0; i < 40; ++i) {
            auto b = p.next();
            REQUIRE(b);
            r.inputs.insert(r.inputs.end(), b->host_inputs().begin(), b->host_inputs().end());
        }
        r.placement = p.stats().worker_placement;
        r.reason = p.stats().workers_reason;
        return r;
    };
    const unsigned n = static_cast<unsigned>(cpus.size());
    const run crowded = take(n);
    const bool sleeps = crowded.placement.find("next() sleeps at once while it waits") != std::string::npos;
    CHECK(sleeps == (n >= large));
    CHECK(crowded.placement.find("next() polls up to") == std::string::npos);  // no CPU left to poll on
    CHECK((crowded.reason.find("as many workers as CPUs (" + std::to_string(n) + ")") != std::string::npos) == (n >= large));
    if (n < 2) return;
    const run spare = take(n - 1);
    CHECK(spare.placement.find("sleeps at once") == std::string::npos);
    CHECK(spare.placement.find("next() polls up to " + std::to_string(defaults::trainer_poll_with_a_spare_cpu.count()) + " us") !=
          std::string::npos);
    CHECK(spare.reason.find("as many workers as CPUs") == std::string::npos);
    CHECK(spare.inputs == crowded.inputs);
}

TEST_CASE("Pipeline.Range.ForLoopEndsAfterMaxSteps") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(2);
    cfg.max_steps = 25;
    pipeline p(data, cfg);
    std::uint64_t n = 0;
    for (auto& b : p) CHECK(b.step() == n++);
    CHECK(n == 25);
    CHECK(p.state().step == 25);
}

TEST_CASE("Pipeline.Epochs.SetEpochStartsWhereAWholeRunReachesThatEpochAndCanEndWithIt") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 60);
    for (const sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
        CAPTURE(static_cast<int>(mode));
        auto cfg = base(2, mode);
        cfg.epochs = 3;
        pipeline whole(data, cfg);
        const std::uint64_t end = whole.end_step();
        const std::vector<copied> all = take(whole, end);
        CHECK_FALSE(whole.next());
        std::vector<std::uint64_t> starts;  // the first step of epochs 0..3: what `epochs = n` ends before
        for (std::uint64_t n = 0; n <= 3; ++n) {
            auto c = cfg;
            c.epochs = n;
            starts.push_back(n == 0 ? 0 : pipeline(data, c).end_step());
        }
        REQUIRE(starts.back() == end);
        if (mode == sample_mode::windows) CHECK(starts[2] == 2 * starts[1]);
        for (std::uint64_t n = 1; n <= 2; ++n) {
            CAPTURE(n);
            pipeline from(data, cfg);
            from.set_epoch(n);
            CHECK(from.state().step == starts[n]);
            CHECK(from.end_step() == end);  // the run still ends where epochs = 3 ends it
            const std::vector<copied> rest = take(from, end - starts[n]);
            CHECK(std::equal(rest.begin(), rest.end(), all.begin() + static_cast<std::ptrdiff_t>(starts[n])));
            CHECK_FALSE(from.next());
            CHECK(to_json(from.state()) == to_json(whole.state()));
            // Only that epoch: it ends where the next one starts.
            pipeline one(data, cfg);
            one.set_epoch(0, /*only_that_epoch=*/true);  // changed before the first batch: the last call counts
            one.set_epoch(n, /*only_that_epoch=*/true);
            CHECK(one.end_step() == starts[n + 1]);
            const std::vector<copied> epoch = take(one, starts[n + 1] - starts[n]);
            CHECK(std::equal(epoch.begin(), epoch.end(), all.begin() + static_cast<std::ptrdiff_t>(starts[n])));
            CHECK_FALSE(one.next());
        }
    }
    // Before the first batch only; one dataset only.
    pipeline started(data, base(1));
    REQUIRE(started.next());
    CHECK_THROWS_AS(started.set_epoch(1), config_error);
    ft::scratch_dir other_dir;
    auto other = make_dataset(other_dir, 1, 30);
    pipeline blend(std::vector<weighted_source>{{0.5, std::make_shared<shard_source>(data)}, {0.5, std::make_shared<shard_source>(other)}},
                   base(1));
    try {
        blend.set_epoch(1);
        FAIL("a blend took set_epoch");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find("blend") != std::string::npos);
    }
}

TEST_CASE("Pipeline.Epochs.AnEvaluationPassHasEveryWindowOnceInOrderWithTheLastBatchMasked") {
    // One shard whose window count is not a multiple of the batch, so the pass ends in a partial batch.
    std::vector<std::unique_ptr<ft::scratch_dir>> dirs;
    std::shared_ptr<const token_dataset> data;
    std::uint64_t windows = 0;
    for (int docs = 30; windows % 4 == 0; ++docs) {
        data = make_dataset(*dirs.emplace_back(std::make_unique<ft::scratch_dir>()), 1, docs);
        sampler s(*data,
                  {.seq_len = 64, .global_batch = 4, .shuffle = shuffle_mode::none, .tail = tail_policy::mask, .rank = 0, .world_size = 1});
        windows = s.steps_in_epoch(0) * 4 - s.padded_in_epoch(0);
    }
    std::vector<std::int32_t> stream;  // every token in order (document d holds d*1000 + i)
    pread_reader r;
    for (std::uint64_t d = 0; d < data->document_count(); ++d) {
        std::vector<std::int32_t> t(data->document(d).length);
        data->read_tokens(r, data->document(d), 0, t.size(), t.data());
        stream.insert(stream.end(), t.begin(), t.end());
    }
    for (int world : {1, 2}) {
        CAPTURE(world);
        std::vector<std::vector<std::int32_t>> kept;  // the rows whose targets count, from every rank
        std::uint64_t masked = 0, steps = 0, padding = 0;
        for (int rank = 0; rank < world; ++rank) {
            auto cfg = base(2);
            cfg.batch_size = 4 / static_cast<std::uint64_t>(world);
            cfg.rank = rank;
            cfg.world_size = world;
            cfg.shuffle = shuffle_mode::none;
            cfg.tail = tail_policy::mask;
            cfg.epochs = 1;
            pipeline p(data, cfg);
            CHECK(p.end_step() == (windows + 3) / 4);
            std::uint64_t n = 0;
            for (auto& b : p) {
                const auto in = b.host_inputs(), tg = b.host_targets();
                for (std::size_t row = 0; row < cfg.batch_size; ++row) {
                    const auto t = tg.subspan(row * 64, 64);
                    if (std::all_of(t.begin(), t.end(), [](std::int32_t v) { return v == -1; })) {
                        ++masked;
                        CHECK(b.step() + 1 == p.end_step());  // only the last batch has padding rows
                    } else {
                        kept.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(row * 64),
                                          in.begin() + static_cast<std::ptrdiff_t>(row * 64 + 64));
                    }
                }
                ++n;
            }
            steps = n;
            padding += p.stats().padding_tokens;
        }
        CHECK(steps == (windows + 3) / 4);
        CHECK(masked == steps * 4 - windows);
        CHECK(padding == masked * 64);
        // Global sample k is window k of the data: rank r holds samples [r*B, (r+1)*B) of each step.
        std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
        REQUIRE(kept.size() == windows);
        for (std::uint64_t k = 0; k < windows; ++k)
            CHECK(std::equal(kept[k].begin(), kept[k].end(), stream.begin() + static_cast<std::ptrdiff_t>(k * 64)));
    }
    // Two passes are twice the steps (drop: only whole batches); max_steps ends it earlier.
    auto cfg = base(2);
    cfg.tail = tail_policy::mask;
    cfg.epochs = 2;
    CHECK(pipeline(data, cfg).end_step() == 2 * ((windows + 3) / 4));
    cfg.tail = tail_policy::drop;
    CHECK(pipeline(data, cfg).end_step() == 2 * (windows / 4));
    cfg.max_steps = 3;
    CHECK(pipeline(data, cfg).end_step() == 3);
}

TEST_CASE("Pipeline.Source.ShardsAreTokensAndTheirStateRoundTripsAsJson") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2);
    CHECK(detect_source(dir / "part_0") == source_kind::tokens);
    CHECK(detect_source(dir.path().string()) == source_kind::tokens);
    CHECK(detect_source(dir / "part_*.idx") == source_kind::tokens);
    auto cfg = base(2);
    cfg.max_steps = 12;
    pipeline whole(dir.path().string(), cfg);  // opened by spec: the directory of shards
    REQUIRE(whole.sources().size() == 1);
    CHECK(whole.sources()[0].source->kind() == source_kind::tokens);
    const auto* shards = dynamic_cast<const shard_source*>(whole.sources()[0].source.get());
    REQUIRE(shards != nullptr);
    CHECK(shards->dataset().total_tokens() == data->total_tokens());
    CHECK(whole.describe().find(std::to_string(data->total_tokens()) + " tokens in 2 megatron shard(s)") != std::string::npos);
    auto all = take(whole, 12);
    cfg.max_steps = 0;
    std::string saved;
    {
        pipeline first(data, cfg);
        (void)take(first, 5);
        saved = to_json(first.state());
    }
    pipeline second(data, cfg);
    second.restore(pipeline_state_from_json(saved));
    auto rest = take(second, 7);
    CHECK(std::equal(rest.begin(), rest.end(), all.begin() + 5));
}

TEST_CASE("Pipeline.Stats.JsonLinesEveryNBatchesAndAtTheEnd") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(2);
    cfg.max_steps = 25;
    cfg.stats_every = 10;
    cfg.stats_jsonl = dir / "stats.jsonl";
    {
        pipeline p(data, cfg);
        for (auto& b : p) (void)b;
    }
    std::ifstream in(cfg.stats_jsonl);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    // The options the run was given, then after batches 10 and 20, and when the stream ended at 25.
    REQUIRE(lines.size() == 4);
    const auto head = nlohmann::json::parse(lines[0]);
    CHECK(head["options"] == options_to_json(cfg));
    pipeline_config again;
    options_from_json(again, head["options"], "the log's first line");
    CHECK(options_to_json(again) == options_to_json(cfg));  // the line is a --config file for the same run
    const auto set = head["options_set"].get<std::vector<std::string>>();
    CHECK(std::set<std::string>(set.begin(), set.end()).count("max_steps") == 1);
    CHECK(std::set<std::string>(set.begin(), set.end()).count("tail") == 0);
    const char* expected[] = {"\"batches\": 10,", "\"batches\": 20,", "\"batches\": 25,"};
    for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(lines[i + 1]);
        CHECK(lines[i + 1].rfind("{\"unix_time\": ", 0) == 0);
        CHECK(lines[i + 1].find(expected[i]) != std::string::npos);
        CHECK(lines[i + 1].back() == '}');
    }
    cfg.stats_jsonl = dir / "no-such-dir/stats.jsonl";
    CHECK_THROWS_AS(pipeline(data, cfg), io_error);
}

TEST_CASE("Pipeline.Errors.TruncatedShardMidRunIsAFormatErrorAtNext") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir, 2, 200);
    auto cfg = base(2);
    cfg.shards.backend = io_backend::pread;  // a mapping of a file truncated underneath would raise SIGBUS instead
    pipeline p(data, cfg);
    take(p, 2);
    REQUIRE(::truncate((dir / "part_1.bin").c_str(), 64) == 0);
    try {
        for (int i = 0; i < 10000; ++i) p.next();
        FAIL("the truncated shard was never noticed");
    } catch (const format_error& e) {
        CHECK(e.file().find("part_1.bin") != std::string::npos);
        CHECK(e.offset() >= 64);
    }
    CHECK_THROWS_AS(p.next(), format_error);  // stays failed; the destructor joins the workers
}

TEST_CASE("Pipeline.Errors.AnAbsentCudaDeviceFailsAtEveryNextUntilDestroyed") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(2);
    cfg.device = {device_kind::cuda, 1000};  // no machine has this device: the ring cannot be made
    pipeline p(data, cfg);                   // the device is checked when the ring is made, at the first next()
    CHECK_THROWS_AS(p.next(), config_error);
    CHECK_THROWS_AS(p.next(), config_error);  // tried again, not a dangling ring
    CHECK(p.stats().batches == 0);
    CHECK(p.state().step == 0);
    CHECK(p.device().index == 1000);  // a numbered device stays as named
}

TEST_CASE("Pipeline.Config.AutoIsTheCurrentDeviceOfTheThreadTakingTheFirstBatch") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto cfg = base(2);
    cfg.device = parse_device("auto");
    pipeline p(data, cfg);
    CHECK(p.device().index < 0);  // not resolved yet: building a pipeline touches no driver
    REQUIRE(p.next());
    int current = 0;
#if FEEDLINE_HAS_CUDA
    if (gpu_probe()) REQUIRE(cudaGetDevice(&current) == cudaSuccess);
#endif
    CHECK(p.device().index == current);  // 0 without a GPU
    CHECK(p.config().device.index < 0);  // the config stays as given
}

TEST_CASE("Pipeline.Config.FailsAtConstructionWithTheNumbers") {
    ft::scratch_dir dir;
    auto data = make_dataset(dir);
    auto tiny = base(2);
    tiny.memory_budget = 4096;
    try {
        pipeline p(data, tiny);
        FAIL("a 4 KiB budget was accepted");
    } catch (const config_error& e) {
        CHECK(e.field() == "memory_budget");
        CHECK(std::string(e.what()).find("4096 bytes cannot hold 2 batches") != std::string::npos);
    }
    CHECK_THROWS_AS(parse_device("tpu"), config_error);  // strings are parsed at the command line's or JSON's boundary
    CHECK_THROWS_AS(parse_enum<io_backend>("floppy", "io_backend"), config_error);
    auto c = base(2);
    c.prefetch = 1;
    CHECK_THROWS_AS(pipeline(data, c), config_error);
    c = base(2);
    c.seq_len = 100000;  // no window fits in this small dataset
    CHECK_THROWS_AS(pipeline(data, c), config_error);
    c = base(2);
    c.rank = 3;
    c.world_size = 2;
    CHECK_THROWS_AS(pipeline(data, c), config_error);
    CHECK_THROWS_AS(pipeline(dir / "missing", base(1)), io_error);
}

TEST_CASE("Pipeline.Memory.ResidentAnonymousMemoryStaysWithinTheBudget") {
#if FEEDLINE_TEST_SANITIZED
    ft::skip("resident memory is not meaningful under a sanitizer (shadow memory, quarantine)");
#endif
    ft::scratch_dir dir;
    // ~48 MB of tokens; the budget is 8 MiB. Reads use pread, so file pages live in the page cache,
    // not in this process (mmap'd pages would be file-backed RSS the kernel may drop: reported apart).
    std::vector<std::string> prefixes;
    for (int k = 0; k < 4; ++k) {
        prefixes.push_back(dir / ("big_" + std::to_string(k)));
        megatron_writer w(prefixes.back(), token_dtype::int32);
        std::vector<std::uint32_t> doc(3000);
        for (int d = 0; d < 1000; ++d) {
            for (auto& t : doc) t = static_cast<std::uint32_t>(d);
            w.add_document(doc);
        }
        w.finish();
    }
    auto anon = [] {
        std::ifstream in("/proc/self/status");
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
        return 0ull;
    };
    auto data = std::make_shared<const token_dataset>(prefixes);
    const std::uint64_t before = anon();
    pipeline p(data, {.batch_size = 16,
                      .seq_len = 2048,
                      .workers = 2,
                      .memory_budget = 8 << 20,
                      .device = device_kind::cpu,
                      .rank = 0,
                      .world_size = 1,
                      .shards = {.backend = io_backend::pread}});
    std::uint64_t peak = 0, tokens = 0;
    for (int i = 0; i < 400; ++i) {
        auto b = p.next();
        tokens += b->size() * b->seq_len();
        peak = std::max<std::uint64_t>(peak, anon());
    }
    MESSAGE("planned " << p.memory().total() << " bytes in " << p.memory().slots << " slots; anonymous RSS grew " << (peak - before)
                       << " bytes over " << tokens * 4 << " bytes of tokens");
    CHECK(tokens * 4 > 3 * (8u << 20));  // several times the budget went through
    CHECK(p.memory().total() <= (8u << 20));
    CHECK(peak - before <= (8u << 20));
}

// 120 domains of two llm.c shards each, all in one directory, each named by a glob ("d1_*.bin" must
// not take d10's or d100's shards), and the same files in a directory per domain: the same stream, and
// every row's tokens are its own domain's (a token is 500 * domain + 100 * shard + its place). The
// globs come from one listing of the directory (detail::glob_listings), which must match as glob(3).
TEST_CASE("Pipeline.Mixture.DomainsWhoseShardsShareADirectoryEachGetTheirOwnByGlob") {
    ft::scratch_dir dir;
    constexpr int domains = 120;
    std::filesystem::create_directories(dir / "flat");
    std::string flat, per, weights;
    for (int d = 0; d < domains; ++d) {
        const std::string name = "d" + std::to_string(d);
        std::filesystem::create_directories(dir / ("per/" + name));
        for (int k = 0; k < 2; ++k) {
            const int n = 40 + (d * 13 + k * 7) % 50;  // a 65-token window runs on into the next shard
            std::vector<std::int32_t> header(256, 0);
            header[0] = 20240520, header[1] = 1, header[2] = n;
            std::vector<std::uint16_t> tokens(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(500 * d + 100 * k + i);
            std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
            bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
            ft::write_text(dir / ("flat/" + name + "_" + std::to_string(k) + ".bin"), bytes);
            ft::write_text(dir / ("per/" + name + "/" + std::to_string(k) + ".bin"), bytes);
        }
        const std::string sep = d == 0 ? "" : ", ";
        flat += sep + "{\"name\": \"" + name + "\", \"data\": \"flat/" + name + "_*.bin\"}";
        per += sep + "{\"name\": \"" + name + "\", \"data\": \"per/" + name + "\"}";
        weights += sep + "\"" + name + "\": " + std::to_string(1 + d % 5);
    }
    const std::string stages = "], \"stages\": [{\"at_step\": 0, \"weights\": {" + weights + "}}]}";
    ft::write_text(dir / "flat.json", "{\"domains\": [" + flat + stages);
    ft::write_text(dir / "per.json", "{\"domains\": [" + per + stages);
    pipeline by_glob(dir / "flat.json", base(2)), by_directory(dir / "per.json", base(2));
    for (int step = 0; step < 60; ++step) {
        auto a = by_glob.next(), b = by_directory.next();
        REQUIRE(a);
        REQUIRE(b);
        const auto in = a->host_inputs(), other = b->host_inputs(), rows = a->host_datasets();
        REQUIRE(std::equal(in.begin(), in.end(), other.begin(), other.end()));
        REQUIRE(std::equal(rows.begin(), rows.end(), b->host_datasets().begin()));
        for (std::size_t r = 0; r < 4; ++r)
            for (std::size_t t = 0; t < 64; ++t) REQUIRE(in[r * 64 + t] / 500 == rows[r]);
    }
}

// Every row of a mixture of many domains is a whole window of its own domain's token stream, with
// every backend, and the same batches from each: T + 1 tokens that run on consecutively within a
// shard and, where a window crosses shards, from one shard's last token to another's first (the epoch
// lays a domain's shards out in a shuffled order); a one-shard domain's windows start at multiples of
// T. A domain's tokens say where they are (400 x domain + position in its files), so a window read
// from another domain's file, at another offset, or cut short at a shard's end shows. The workers
// write a batch's rows of all domains in one call (source_worker::write_sources).
TEST_CASE("Pipeline.Mixture.EveryRowIsAWholeWindowOfItsDomainsStream") {
    ft::scratch_dir dir;
    constexpr int domains = 150;
    constexpr std::size_t T = 16;
    std::string doms, weights;
    std::vector<std::set<std::int32_t>> starts(domains), ends(domains);  // each shard's first token, last token + 1
    for (int d = 0; d < domains; ++d) {
        const std::string name = "d" + std::to_string(d);
        const int shards = 1 + d % 3;
        std::int32_t at = 400 * d;
        for (int k = 0; k < shards; ++k) {
            const int n = 20 + (d * 7 + k * 11) % 40;
            std::vector<std::int32_t> header(256, 0);
            header[0] = 20240520, header[1] = 1, header[2] = n;
            std::vector<std::uint16_t> tokens(static_cast<std::size_t>(n));
            starts[d].insert(at);
            for (auto& t : tokens) t = static_cast<std::uint16_t>(at++);
            ends[d].insert(at);
            std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
            bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
            ft::write_text(dir / (name + "_" + std::to_string(k) + ".bin"), bytes);
        }
        const std::string sep = d == 0 ? "" : ", ";
        doms += sep + "{\"name\": \"" + name + "\", \"data\": \"" + name + "_*.bin\"}";
        weights += sep + "\"" + name + "\": " + std::to_string(1 + d % 4);
    }
    ft::write_text(dir / "mix.json", "{\"domains\": [" + doms + "], \"stages\": [{\"at_step\": 0, \"weights\": {" + weights + "}}]}");
    std::vector<std::vector<std::int32_t>> first;  // the mmap run's inputs, batch by batch
    std::vector<io_backend> backends{io_backend::mmap, io_backend::pread};
    if (!io_uring_unavailable_reason()) backends.push_back(io_backend::io_uring);
    std::uint64_t crossings = 0;
    for (const io_backend backend : backends) {
        CAPTURE(to_string(backend));
        pipeline_config c = base(2);
        c.batch_size = 32;
        c.seq_len = T;
        c.shards.backend = backend;
        pipeline p(dir / "mix.json", c);
        for (int step = 0; step < 50; ++step) {
            auto b = p.next();
            REQUIRE(b);
            const auto in = b->host_inputs(), tg = b->host_targets(), rows = b->host_datasets();
            for (std::size_t r = 0; r < 32; ++r) {
                const auto d = static_cast<std::size_t>(rows[r]);
                REQUIRE(d < static_cast<std::size_t>(domains));
                std::vector<std::int32_t> window(in.begin() + static_cast<std::ptrdiff_t>(r * T), in.begin() + static_cast<std::ptrdiff_t>(r * T + T));
                window.push_back(tg[r * T + T - 1]);
                for (std::size_t t = 0; t < T; ++t) REQUIRE(tg[r * T + t] == window[t + 1]);
                for (std::int32_t tok : window) {
                    REQUIRE(tok >= *starts[d].begin());
                    REQUIRE(tok < *ends[d].rbegin());
                }
                for (std::size_t t = 0; t + 1 < window.size(); ++t) {
                    if (window[t + 1] == window[t] + 1 && !ends[d].count(window[t] + 1)) continue;
                    REQUIRE(ends[d].count(window[t] + 1) == 1);  // on into a shard only from another's end
                    REQUIRE(starts[d].count(window[t + 1]) == 1);
                    ++crossings;
                }
                if (d % 3 == 0) REQUIRE((window[0] - 400 * static_cast<std::int32_t>(d)) % static_cast<std::int32_t>(T) == 0);
            }
            if (backend == io_backend::mmap)
                first.emplace_back(in.begin(), in.end());
            else
                REQUIRE(std::equal(in.begin(), in.end(), first[static_cast<std::size_t>(step)].begin(),
                                   first[static_cast<std::size_t>(step)].end()));
        }
    }
    CHECK(crossings > 0);  // the data has windows that cross shards
}

// A domain's data may be a list of paths, globs or prefixes, opened together as one dataset of their
// files in the order given: the same batches as the glob or directory that names those files. A list
// of two kinds of data is a config_error naming the domain and its line.
TEST_CASE("Pipeline.Mixture.ADomainsListOfDataIsOneDatasetOfItsFiles") {
    ft::scratch_dir dir;
    for (int k = 0; k < 3; ++k) {  // llm.c shards a_0..a_2 of one domain
        const int n = 30 + 17 * k;
        std::vector<std::int32_t> header(256, 0);
        header[0] = 20240520, header[1] = 1, header[2] = n;
        std::vector<std::uint16_t> tokens(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(1000 * k + i);
        std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
        bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
        ft::write_text(dir / ("a_" + std::to_string(k) + ".bin"), bytes);
    }
    std::filesystem::create_directories(dir / "m");
    for (int part = 0; part < 2; ++part) {  // a domain of two Megatron pairs
        megatron_writer w(dir / ("m/part_" + std::to_string(part)), token_dtype::uint16);
        for (std::uint32_t d = 0; d < 5; ++d) w.add_document(std::vector<std::uint32_t>(20 + 9 * d, 5000 + 100 * part + d));
        w.finish();
    }
    ft::write_text(dir / "notes.jsonl", "{\"text\": \"a document\"}\n");
    const auto write_mix = [&](const std::string& name, const std::string& a, const std::string& m) {
        ft::write_text(dir / name, "{\"domains\": [\n  {\"name\": \"a\", \"data\": " + a + "},\n  {\"name\": \"m\", \"data\": " + m +
                                       "}],\n \"stages\": [{\"at_step\": 0, \"weights\": {\"a\": 2, \"m\": 1}}]}");
    };
    write_mix("globs.json", "\"a_*.bin\"", "\"m\"");
    write_mix("lists.json", "[\"a_0.bin\", \"a_1.bin\", \"a_2.bin\"]", "[\"m/part_0\", \"m/part_1\"]");
    write_mix("partly.json", "[\"a_0.bin\", \"a_[12].bin\"]", "[\"m/part_0\", \"m/part_1.idx\"]");
    pipeline by_glob(dir / "globs.json", base(2)), by_list(dir / "lists.json", base(2)), partly(dir / "partly.json", base(1));
    std::set<int> domains_seen;
    for (int step = 0; step < 30; ++step) {
        auto a = by_glob.next(), b = by_list.next(), c = partly.next();
        REQUIRE(a);
        REQUIRE(b);
        REQUIRE(c);
        const auto in = a->host_inputs();
        REQUIRE(std::equal(in.begin(), in.end(), b->host_inputs().begin(), b->host_inputs().end()));
        REQUIRE(std::equal(in.begin(), in.end(), c->host_inputs().begin(), c->host_inputs().end()));
        for (std::int32_t d : a->host_datasets()) domains_seen.insert(d);
    }
    CHECK(domains_seen == std::set<int>{0, 1});
    for (std::size_t d = 0; d < 2; ++d) CHECK(by_list.sources()[d].source->describe() == by_glob.sources()[d].source->describe());
    CHECK(by_list.sources()[0].source->describe().find("3 llmc shard(s)") != std::string::npos);
    // Two kinds in one domain's list: refused before anything is read, naming the domain and its line.
    write_mix("kinds.json", "[\"a_0.bin\", \"notes.jsonl\"]", "\"m\"");
    try {
        pipeline bad(dir / "kinds.json", base(1));
        FAIL("a list of token shards and text was taken");
    } catch (const config_error& e) {
        const std::string what = e.what();
        CHECK(what.find("domains[0].data") != std::string::npos);
        CHECK(what.find("kinds.json:2") != std::string::npos);
        CHECK(what.find("domain 'a'") != std::string::npos);
        CHECK(what.find("two kinds") != std::string::npos);
    }
}

// A data spec naming a mixture file: its domains' data mixed by its schedule. Every row says which
// domain it came from; the counts stay within one sample of the schedule's targets; a resume at any
// step, with other workers, gives the same batches; stats() has each domain's accounting; another
// schedule goes on only when asked for.
TEST_CASE("Pipeline.Mixture.AMixtureFileDeliversItsScheduleAndResumesExactly") {
    const three_domains data;
    const std::string& mix = data.mix;
    auto write_mixture = [&](const std::string& last_stage) {
        data.write(
            "{\"at_step\": 0, \"weights\": {\"web\": 6, \"code\": 3, \"math\": 1}},\n"
            "  {\"at_step\": 12, \"ramp_steps\": 8, \"weights\": {\"web\": 1, \"code\": 1, \"math\": 2}}" +
            last_stage);
    };
    write_mixture("");
    pipeline_config c = base(2);
    pipeline whole(mix, c);
    CHECK(whole.describe().find("a mixture of 3 domains") != std::string::npos);
    const auto schedule = parse_mixture(ft::read_text(mix), mix, 4 * 64).schedule;
    mixture_targets targets(schedule, 4);
    std::vector<copied> expected;
    std::vector<std::uint64_t> counts(3, 0);
    std::uint64_t n = 0;
    for (int step = 0; step < 40; ++step) {
        auto b = whole.next();
        REQUIRE(b);
        const auto in = b->host_inputs(), tg = b->host_targets(), pos = b->host_position_ids(), cu = b->host_cu_seqlens();
        expected.push_back({b->step(), {in.begin(), in.end()}, {tg.begin(), tg.end()}, {pos.begin(), pos.end()}, {cu.begin(), cu.end()}});
        for (std::size_t r = 0; r < 4; ++r) {
            const auto d = static_cast<std::size_t>(b->host_datasets()[r]);
            REQUIRE(d < 3);
            ++counts[d];
            ++n;
            for (std::uint32_t x = 0; x < 3; ++x) REQUIRE(std::abs(static_cast<double>(counts[x]) - targets.expected(x, n)) < 1.0);
        }
        // The state after each batch (each step's change applied in order as the trainer takes it)
        // counts exactly the samples delivered.
        REQUIRE(whole.state().step == static_cast<std::uint64_t>(step) + 1);
        REQUIRE(whole.state().taken == counts);
    }
    const pipeline_stats st = whole.stats();
    REQUIRE(st.datasets.size() == 3);
    CHECK(st.datasets[2].name == "math");
    CHECK(st.datasets[2].samples == counts[2]);
    CHECK(st.datasets[2].tokens == counts[2] * 64);
    CHECK(st.datasets[2].share == doctest::Approx(0.5));  // the last stage's weights at step 40
    CHECK(st.to_json().find("\"datasets\": [{\"name\": \"web\"") != std::string::npos);
    for (std::uint64_t k : {0ull, 13ull, 16ull, 25ull}) {
        CAPTURE(k);
        pipeline_state saved;
        std::vector<copied> got;
        {
            pipeline first(mix, base(3));
            got = take(first, k);
            saved = sampler_state_from_json(to_json(first.state()));
        }
        pipeline second(mix, base(1));
        second.restore(saved);
        auto rest = take(second, 40 - k);
        got.insert(got.end(), rest.begin(), rest.end());
        REQUIRE(got == expected);
    }
    // An edited schedule: refused, unless the run goes on with it from the saved step.
    pipeline first(mix, base(2));
    (void)take(first, 25);
    const pipeline_state saved = first.state();
    write_mixture(",\n  {\"at_step\": 30, \"weights\": {\"math\": 1}}");
    pipeline edited(mix, base(2));
    CHECK_THROWS_AS(edited.restore(saved), config_error);
    edited.restore(saved, mixture_change::from_step);
    std::uint64_t math_rows = 0;
    for (int step = 25; step < 40; ++step) {
        auto b = edited.next();
        REQUIRE(b);
        CHECK(b->step() == static_cast<std::uint64_t>(step));
        for (std::size_t r = 0; r < 4; ++r) math_rows += step >= 30 && b->host_datasets()[r] == 2;
    }
    CHECK(math_rows == 40);  // from step 30 every row is math
    CHECK(edited.state().mixture_step == 25);
}

// Weights set by the trainer during the run (online mixing): they take effect at the step named,
// whatever the workers planned before; the state holds them from the call on, so a resume from any
// state after it, with other workers, gives the same batches; a trainer that sets them again after
// resuming from an earlier state does too. A step already planned is refused, naming the first free.
TEST_CASE("Pipeline.Mixture.WeightsSetDuringTheRunTakeEffectAtTheirStepAndResumeExactly") {
    const three_domains data;
    const std::string& mix = data.mix;
    data.write("{\"at_step\": 0, \"weights\": {\"web\": 6, \"code\": 3, \"math\": 1}}");
    constexpr std::uint64_t first_call = 6, steps = 60;
    pipeline whole(mix, base(2));
    auto got = take(whole, first_call);
    const std::uint64_t at = whole.state().step + whole.planning_horizon();  // always free
    REQUIRE(at + 10 < steps);
    try {
        whole.set_mixture_weights({1, 1, 1}, 2);
        FAIL("weights for a step already delivered");
    } catch (const config_error& e) {
        CHECK(e.field() == "step");
    }
    const pipeline_state before_call = whole.state();
    whole.set_mixture_weights({0, 0, 1}, at);  // from `at`: math only
    REQUIRE(whole.state().pending_weights.size() == 1);
    std::vector<pipeline_state> states;  // states[i]: after step first_call + i
    std::vector<std::int32_t> datasets;  // each row's domain, from first_call on
    for (std::uint64_t step = first_call; step < steps; ++step) {
        auto b = whole.next();
        REQUIRE(b);
        auto in = b->host_inputs(), tg = b->host_targets(), pos = b->host_position_ids(), cu = b->host_cu_seqlens();
        got.push_back({b->step(), {in.begin(), in.end()}, {tg.begin(), tg.end()}, {pos.begin(), pos.end()}, {cu.begin(), cu.end()}});
        const auto rows = b->host_datasets();
        datasets.insert(datasets.end(), rows.begin(), rows.end());
        states.push_back(sampler_state_from_json(to_json(whole.state())));
        // The change leaves the trainer's state when the batch of its step arrives.
        REQUIRE(whole.state().pending_weights.size() == (step + 1 <= at ? 1u : 0u));
    }
    std::uint64_t math_before = 0, math_after = 0, rows_before = 0;
    for (std::size_t r = 0; r < datasets.size(); ++r) {
        const bool after = first_call + r / 4 >= at;
        (after ? math_after : math_before) += datasets[r] == 2;
        rows_before += !after;
    }
    CHECK(math_after == (steps - at) * 4);  // every row from `at` is math
    CHECK(math_before < rows_before / 4);   // before it, about a tenth
    CHECK(whole.state().mixture == 2);
    CHECK(whole.state().mixture_step == at);
    CHECK(whole.stats().datasets[2].share == doctest::Approx(1.0));
    // Resumed from states after the call (before `at`, at it, past it), with one worker: the same batches.
    for (std::uint64_t k : {first_call + 1, at - 1, at, at + 3}) {
        CAPTURE(k);
        pipeline resumed(mix, base(1));
        resumed.restore(states[k - first_call - 1]);
        const auto rest = take(resumed, steps - k);
        REQUIRE(std::equal(rest.begin(), rest.end(), got.begin() + static_cast<std::ptrdiff_t>(k)));
    }
    // Resumed from before the call, a trainer that sets the same weights for the same step again.
    pipeline again(mix, base(3));
    again.restore(before_call);
    again.set_mixture_weights({0, 0, 1}, at);
    const auto rest = take(again, steps - first_call);
    REQUIRE(std::equal(rest.begin(), rest.end(), got.begin() + first_call));
    // Without a step: the first one not planned, which the workers have not reached.
    pipeline now(mix, base(2));
    (void)take(now, 3);
    const std::uint64_t chosen = now.set_mixture_weights({1, 0, 0});
    CHECK(chosen >= 3);
    CHECK(chosen < 3 + now.planning_horizon());
    for (std::uint64_t step = 3; step < chosen + 4; ++step) {
        auto b = now.next();
        REQUIRE(b);
        if (step >= chosen)
            for (std::int32_t d : b->host_datasets()) REQUIRE(d == 0);
    }
    // A blend without a schedule has no weights to set.
    const ft::scratch_dir one, two;
    pipeline blend(std::vector<weighted_source>{{1.0, std::make_shared<shard_source>(make_dataset(one, 1, 30))},
                                                {1.0, std::make_shared<shard_source>(make_dataset(two, 1, 30))}},
                   base(1));
    CHECK_THROWS_AS(blend.set_mixture_weights({1, 1}, 10), config_error);
}
