// The sample trainer's checkpoints: a saved checkpoint loads back equal; a flipped bit, trailing bytes,
// a NaN, a number of the wrong type or range, or a trainer step that disagrees with the pipeline's is
// refused naming the file (and the byte, for tensors); resuming from the root falls back to the newest
// intact checkpoint and says what was wrong with the newer one.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <cmath>
#include <fstream>
#include <limits>

#include "checkpoint.hpp"
#include "test_support.hpp"

namespace ft = feedline::test;
namespace fs = std::filesystem;

namespace {

// A real pipeline's state after `batches` batches.
std::string pipeline_state_after(const ft::scratch_dir& dir, std::uint64_t batches) {
    const std::string prefix = dir / "data";
    if (!fs::exists(prefix + ".idx")) {
        feedline::megatron_writer w(prefix, feedline::token_dtype::uint16);
        for (std::uint32_t d = 0; d < 50; ++d) w.add_document(std::vector<std::uint32_t>(40 + d, d + 1));
        w.finish();
    }
    feedline::pipeline p(prefix,
                         {.batch_size = 2, .seq_len = 16, .workers = 1, .device = feedline::device_kind::cpu, .rank = 0, .world_size = 1});
    for (std::uint64_t i = 0; i < batches; ++i) REQUIRE(p.next());
    return feedline::to_json(p.state());
}

trainer::checkpoint sample(const ft::scratch_dir& dir, std::uint64_t step) {
    trainer::checkpoint c;
    c.step = step;
    c.tokens = step * 64;
    c.model = {.vocab = 20, .context = 2, .embed = 4, .hidden = 8};
    c.global_batch = 2;
    c.seq_len = 16;
    c.grad_accum = 2;
    c.seed = 7;
    c.mode = "windows";
    c.pipeline_state = pipeline_state_after(dir, step * c.grad_accum);
    const auto n = c.model.parameter_count();
    for (auto* v : {&c.params, &c.m, &c.v}) {
        v->resize(n);
        for (std::uint64_t i = 0; i < n; ++i) (*v)[i] = static_cast<float>((i * 7 + step) % 13) * (v == &c.params ? -0.25f : 0.125f);
    }
    return c;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spill(const fs::path& p, const std::string& bytes) { ft::write_text(p.string(), bytes); }

// Rewrites the manifest to vouch for the files as they are now, so the check under test is the
// parser's, not the checksum's.
void reseal(const fs::path& dir) {
    nlohmann::json files = nlohmann::json::array();
    for (const char* name : {"trainer.json", "tensors.bin"}) {
        const auto bytes = slurp(dir / name);
        files.push_back({{"name", name}, {"bytes", bytes.size()}, {"crc32", trainer::detail::crc32_of(bytes)}});
    }
    spill(dir / "manifest.json", nlohmann::json{{"format", "feedline-train checkpoint manifest"}, {"version", 1}, {"files", files}}.dump());
}

template <class F>
std::string refusal(F&& load) {
    try {
        load();
    } catch (const trainer::checkpoint_error& e) {
        return e.what();
    }
    FAIL("accepted");
    return {};
}

}  // namespace

// One run's saves: each goes on from the one before.
std::string save_run(const fs::path& root, const ft::scratch_dir& dir, std::vector<std::uint64_t> steps, std::size_t keep,
                     std::string parent = {}) {
    for (std::uint64_t step : steps) {
        auto c = sample(dir, step);
        c.parent = parent;
        parent = trainer::save_checkpoint(root, c, keep).id;
    }
    return parent;
}

TEST_CASE("Checkpoint.RoundTripAndKeepTheNewest") {
    ft::scratch_dir dir;
    const fs::path root = dir / "ck";
    const std::string last = save_run(root, dir, {2, 4, 6}, 2);
    const auto kept = trainer::checkpoints_in(root);
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].filename() == "step-000000000006");
    CHECK(kept[1].filename() == "step-000000000004");
    const auto c = trainer::load_checkpoint(kept[0]);
    const auto want = sample(dir, 6);
    CHECK(c.step == 6);
    CHECK(c.params == want.params);
    CHECK(c.v == want.v);
    CHECK(c.pipeline_state == nlohmann::json::parse(want.pipeline_state).dump());
    // Saving the same step again swaps the checkpoint whole, in its place in the lineage.
    auto again = sample(dir, 6);
    again.parent = last;
    trainer::save_checkpoint(root, again, 2);
    CHECK(trainer::checkpoints_in(root).size() == 2);
    CHECK(trainer::load_checkpoint(kept[0]).params == want.params);
    CHECK(trainer::load_checkpoint(kept[0]).parent == trainer::load_checkpoint(kept[1]).id);
}

TEST_CASE("Checkpoint.RetentionAndNewestFollowTheRunsLineageNotStepNumbers") {
    ft::scratch_dir dir;
    const fs::path root = dir / "ck";
    save_run(root, dir, {2, 4, 6}, 0);
    // The run goes back to step 4 (a loss spike after it, say) and goes on from there.
    const auto rewound = trainer::load_checkpoint(root / "step-000000000004");
    const std::string id5 = save_run(root, dir, {5}, 1, rewound.id);
    // Ranked by step, step 5 came after step 6 and --keep-checkpoints 1 deleted it right away: it is
    // the newest of its lineage and stays; its ancestors beyond one go; the abandoned step 6 is kept.
    CHECK(fs::exists(root / "step-000000000005"));
    CHECK_FALSE(fs::exists(root / "step-000000000004"));
    CHECK_FALSE(fs::exists(root / "step-000000000002"));
    CHECK(fs::exists(root / "step-000000000006"));
    // --resume ROOT continues the run that was written last, not the abandoned one with the higher step.
    const auto c = trainer::resume_from(root, [](const std::string& w) { FAIL(w); });
    CHECK(c.step == 5);
    CHECK(c.id == id5);
    CHECK(trainer::checkpoints_in(root).front().filename() == "step-000000000005");
    // The default keep (2) along the new lineage: 5 and 7 stay, then 7 and 9; step 6 is never touched.
    const std::string id9 = save_run(root, dir, {7, 9}, 2, id5);
    CHECK_FALSE(fs::exists(root / "step-000000000005"));
    CHECK(fs::exists(root / "step-000000000007"));
    CHECK(fs::exists(root / "step-000000000009"));
    CHECK(fs::exists(root / "step-000000000006"));
    // A second run started afresh in the same root is a lineage of its own: it removes nothing of the first.
    save_run(root, dir, {1, 3, 8}, 1);
    CHECK(fs::exists(root / "step-000000000009"));
    CHECK(fs::exists(root / "step-000000000008"));
    CHECK_FALSE(fs::exists(root / "step-000000000003"));
    CHECK(trainer::resume_from(root, [](const std::string&) {}).step == 8);
    (void)id9;
}

TEST_CASE("Checkpoint.ACheckpointRootThatCannotBeWrittenIsRefusedBeforeTraining") {
    ft::scratch_dir dir;
    ft::write_text(dir / "file", "x");
    CHECK_THROWS_AS(trainer::check_checkpoint_root(fs::path(dir / "file") / "ck"), trainer::checkpoint_error);
    CHECK_NOTHROW(trainer::check_checkpoint_root(dir / "fresh"));
    CHECK(fs::is_empty(dir / "fresh"));
}

TEST_CASE("Checkpoint.DamageIsRefusedNamingTheFileAndResumeFallsBack") {
    ft::scratch_dir dir;
    const fs::path root = dir / "ck";
    trainer::save_checkpoint(root, sample(dir, 2), 0);
    const fs::path newest = trainer::save_checkpoint(root, sample(dir, 4), 0).dir;
    const std::string tensors = slurp(newest / "tensors.bin"), json = slurp(newest / "trainer.json");
    const auto restore = [&] {
        spill(newest / "tensors.bin", tensors);
        spill(newest / "trainer.json", json);
        reseal(newest);
    };
    const auto expect_refused = [&](const std::string& needle) {
        const std::string why = refusal([&] { (void)trainer::load_checkpoint(newest); });
        CHECK_MESSAGE(why.find(needle) != std::string::npos, why);
        std::vector<std::string> warnings;
        const auto c = trainer::resume_from(root, [&](const std::string& w) { warnings.push_back(w); });
        CHECK(c.step == 2);  // the newest intact one
        REQUIRE(warnings.size() == 1);
        CHECK(warnings[0].find(newest.string()) != std::string::npos);
        restore();
    };
    SUBCASE("a flipped bit") {
        std::string t = tensors;
        t[t.size() / 2] ^= 0x10;
        spill(newest / "tensors.bin", t);
        expect_refused("tensors.bin: CRC-32");
    }
    SUBCASE("trailing bytes") {
        spill(newest / "tensors.bin", tensors + "xx");
        expect_refused("bytes, the manifest says");
        spill(newest / "tensors.bin", tensors + "xxxx");
        reseal(newest);  // even when the manifest vouches for them
        expect_refused("(trailing bytes)");
    }
    SUBCASE("a NaN in the tensors") {
        std::string t = tensors;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(t.data() + 16 + 4 * 3, &nan, 4);
        spill(newest / "tensors.bin", t);
        reseal(newest);
        expect_refused("tensors.bin @ byte 28: a value that is not finite");
    }
    SUBCASE("numbers of the wrong type or range") {
        for (const char* bad : {"-5", "1.5", "1e30", "\"4\"", "null"}) {
            CAPTURE(bad);
            auto j = nlohmann::json::parse(json);
            j["step"] = nlohmann::json::parse(bad);
            spill(newest / "trainer.json", j.dump());
            reseal(newest);
            expect_refused("step is not an integer");
        }
    }
    SUBCASE("a trainer step the pipeline's state does not match") {
        auto j = nlohmann::json::parse(json);
        j["step"] = 3;
        spill(newest / "trainer.json", j.dump());
        reseal(newest);
        expect_refused("the trainer is at step 3 (2 micro-batches each) but the pipeline's state is at batch 8");
    }
    SUBCASE("a manifest that is missing, not JSON, or names a path") {
        fs::remove(newest / "manifest.json");
        expect_refused("manifest.json: missing");
        spill(newest / "manifest.json", "{\"format\": \"feedline-train checkpoint manifest\", \"version\": 1, \"files\": [");
        expect_refused("not JSON");
        spill(newest / "manifest.json", nlohmann::json{{"format", "feedline-train checkpoint manifest"},
                                                       {"version", 1},
                                                       {"files", {{{"name", "../../etc/passwd"}, {"bytes", 1}, {"crc32", 0}}}}}
                                            .dump());
        expect_refused("is not a plain file name");
    }
    SUBCASE("a directory where a file belongs") {
        fs::remove(newest / "tensors.bin");
        fs::create_directory(newest / "tensors.bin");
        const std::string why = refusal([&] { (void)trainer::load_checkpoint(newest); });
        CHECK_MESSAGE(why.find("not a regular file") != std::string::npos, why);
        fs::remove(newest / "tensors.bin");
        restore();
    }
    CHECK(trainer::load_checkpoint(newest).step == 4);  // restored: loads again
    // Nothing intact at all: an error that lists each reason.
    spill(newest / "tensors.bin", tensors + "x");
    fs::remove_all(root / "step-000000000002");
    const std::string why = refusal([&] { (void)trainer::resume_from(root, [](const std::string&) {}); });
    CHECK(why.find("no intact checkpoint") != std::string::npos);
    CHECK(why.find("tensors.bin") != std::string::npos);
}
