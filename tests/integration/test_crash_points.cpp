// Kill at every crash point: feedline-pack (Megatron pairs, numbered llm.c shards) and feedline-train's
// checkpoints are run under strace, which kills them with SIGKILL on entering the n-th fsync, rename,
// unlink or mkdir, for every n until a run completes. After each kill, what is left under the final
// names must be either the earlier complete output or (part of) the new one, byte for byte: never a
// mix, never a file that validates with other data than was written with it.
#include <doctest/doctest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <map>

#include "checkpoint.hpp"
#include "run_command.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace ft = feedline::test;
namespace fs = std::filesystem;

namespace {

const std::string crash_syscalls = "fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat";

void require_strace(const ft::scratch_dir& dir) {
    if (ft::run("strace -f -qq -o /dev/null -e trace=none true", dir).code != 0)
        ft::skip("strace is missing or cannot trace here (ptrace denied); install strace (scripts/install-deps.sh)");
}

// Runs `cmd` killed on entering the n-th crash-point call of a thread. True when it was killed, false
// when it ran to completion; anything else fails the test. LeakSanitizer is off in the traced
// process: it stops the world with ptrace, which strace already holds.
bool killed_at(int n, const std::string& cmd, const ft::scratch_dir& dir) {
    const auto r = ft::run("ASAN_OPTIONS=detect_leaks=0 strace -f -qq -o /dev/null -e trace=" + crash_syscalls +
                               " -e inject=" + crash_syscalls + ":signal=SIGKILL:when=" + std::to_string(n) + " " + cmd,
                           dir);
    REQUIRE_MESSAGE((r.code == 0 || r.code == 128 + SIGKILL), "exit " << r.code << ": " << r.err);
    return r.code != 0;
}

using file_set = std::map<std::string, std::vector<std::byte>>;

// Files directly in `dir` whose names start with `stem` and end with one of `exts`: name -> bytes.
file_set files_like(const fs::path& dir, const std::string& stem, std::vector<std::string> exts) {
    file_set out;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(stem, 0) == 0 && std::any_of(exts.begin(), exts.end(), [&](const std::string& x) { return name.ends_with(x); }))
            out[name] = ft::read_bytes(e.path().string());
    }
    return out;
}

// Are `left` the first shards (by number) of `pack`, byte for byte?
bool prefix_of(const file_set& left, const file_set& pack) {
    return left.size() <= pack.size() && std::equal(left.begin(), left.end(), pack.begin());
}

}  // namespace

TEST_CASE("CrashPoints.Pack.AKilledPackLeavesTheEarlierPackOrPartOfTheNewNeverAMix") {
    ft::trainer_corpus data;  // train.jsonl (400 documents), val.jsonl (40), train.model
    require_strace(data.dir);
    for (const bool llmc : {false, true}) {
        CAPTURE(llmc);
        const std::string pack =
            data.bin + "/feedline-pack --quiet --append-eos --model " + data.model + (llmc ? " --format llmc --shard-size 4096" : "");
        const fs::path work = data.dir / (llmc ? "llmc" : "megatron"), refs = data.dir / (llmc ? "llmc-refs" : "megatron-refs");
        fs::create_directories(work);
        fs::create_directories(refs);
        // The two packs uninterrupted: the earlier one (more shards) and the new one.
        const auto pack_into = [&](const fs::path& dir, const char* input) {
            return pack + " --input " + (data.dir / input) + " --output " + (dir / "out").string();
        };
        REQUIRE(ft::run(pack_into(refs, "val.jsonl"), data.dir).code == 0);
        const auto latest = files_like(refs, "out", {".bin", ".idx"});
        fs::remove_all(refs);
        fs::create_directories(refs);
        REQUIRE(ft::run(pack_into(refs, "train.jsonl"), data.dir).code == 0);
        const auto earlier = files_like(refs, "out", {".bin", ".idx"});
        REQUIRE(latest.size() >= 2);
        if (llmc) REQUIRE(earlier.size() > latest.size());  // the earlier pack has shards the new one does not overwrite

        int kills = 0;
        for (int n = 1;; ++n) {
            REQUIRE(n < 500);
            fs::remove_all(work);
            REQUIRE(ft::run("cp -a " + refs.string() + " " + work.string(), data.dir).code ==
                    0);  // the earlier pack in place, as it was written
            if (!killed_at(n, pack_into(work, "val.jsonl"), data.dir)) break;
            ++kills;
            CAPTURE(n);
            const auto left = files_like(work, "out", {".bin", ".idx"});
            if (!llmc && left.count("out.idx") && left.count("out.bin")) {
                const bool earlier_pair = left.at("out.idx") == earlier.at("out.idx") && left.at("out.bin") == earlier.at("out.bin");
                const bool latest_pair = left.at("out.idx") == latest.at("out.idx") && left.at("out.bin") == latest.at("out.bin");
                CHECK((earlier_pair || latest_pair));  // a pair that validates was written together
            } else if (llmc) {
                CHECK((prefix_of(left, earlier) || prefix_of(left, latest)));  // shards of one pack, never a mix
            }
            // The next pack into the prefix, after a kill anywhere: it proves what the killed one left
            // was its own (the manifest, the lock file's token), removes it, and publishes in full.
            const auto again = ft::run(pack_into(work, "val.jsonl"), data.dir);
            REQUIRE_MESSAGE(again.code == 0, again.err);
            CHECK(files_like(work, "out", {".bin", ".idx"}) == latest);
            for (const auto& e : fs::directory_iterator(work)) {
                const std::string name = e.path().filename().string();
                CHECK_MESSAGE((name.find(".tmp-") == std::string::npos && name != "out.lock"), name << " left behind");
            }
        }
        MESSAGE(std::string(llmc ? "llm.c" : "Megatron") << " pack: killed at " << kills << " crash points");
        CHECK(kills > 0);
        CHECK(files_like(work, "out", {".bin", ".idx"}) == latest);  // the run that was not killed
    }
}

TEST_CASE("CrashPoints.Checkpoint.EveryCheckpointLeftByAKilledRunVerifiesAndIsTheOneThatWasSaved") {
    ft::trainer_corpus data;
    require_strace(data.dir);
    const std::string ref = data.dir / "ref", ck = data.dir / "ck";
    const std::string train = data.train_command("--max-steps 4 --checkpoint-every 2 --keep-checkpoints 0 --checkpoint ");
    REQUIRE(ft::run(train + ref, data.dir).code == 0);
    const auto reference = trainer::checkpoints_in(ref);
    REQUIRE(reference.size() == 2);
    int kills = 0, loaded = 0;
    for (int n = 1;; ++n) {
        REQUIRE(n < 500);
        fs::remove_all(ck);
        if (!killed_at(n, train + ck, data.dir)) break;
        ++kills;
        CAPTURE(n);
        if (!fs::exists(ck)) continue;
        for (const auto& dir : trainer::checkpoints_in(ck)) {  // every published checkpoint is whole
            CHECK_NOTHROW(trainer::load_checkpoint(dir));
            const fs::path same = fs::path(ref) / dir.filename();
            REQUIRE(fs::exists(same));
            // Byte for byte, but for the checkpoint's lineage: its own random id, its parent's, and its
            // place in the root's write order (a killed run may not have made the last save that
            // replaced an earlier one of the same step).
            CHECK(ft::read_bytes((dir / "tensors.bin").string()) == ft::read_bytes((same / "tensors.bin").string()));
            auto left = nlohmann::json::parse(ft::read_text((dir / "trainer.json").string()));
            auto want = nlohmann::json::parse(ft::read_text((same / "trainer.json").string()));
            CHECK(left["parent"].get<std::string>().empty() == want["parent"].get<std::string>().empty());
            CHECK(left["generation"].get<std::uint64_t>() >= 1);
            for (auto* j : {&left, &want}) j->erase("id"), j->erase("parent"), j->erase("generation");
            CHECK(left == want);
            ++loaded;
        }
    }
    MESSAGE("feedline-train: killed at " << kills << " crash points, " << loaded << " checkpoints left behind verified");
    CHECK(kills > 0);
    CHECK(loaded > 0);  // some kills came after a checkpoint was published
}
