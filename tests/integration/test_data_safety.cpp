// Never delete, replace or mix a user's data: a re-pack removes only the shards an earlier pack proved
// it wrote (its numbering and its manifest), never another dataset's files; two writers of one prefix
// never both publish; a reader never pairs an old .idx with a new .bin; a damaged or stray shard in a
// directory or glob is an error naming it, never less data; a trained model is published by rename.
// Real files, real processes (feedline-pack, feedline-inspect) and real threads.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "run_command.hpp"
#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;
namespace fs = std::filesystem;

namespace {

const std::string bin = FEEDLINE_BIN_DIR;

// A corpus and a model trained on it once, in `dir`.
struct packed_corpus {
    ft::scratch_dir dir;
    std::string jsonl = dir / "corpus.jsonl", model = dir / "m.model";
    packed_corpus() {
        auto r = ft::run(bin + "/feedline-make-corpus --output " + jsonl + " --documents 400 --seed 5", dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        r = ft::run(bin + "/feedline-pack --quiet --input " + jsonl + " --train-model 300 --output " + (dir / "m"), dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
    }
    ft::result pack(const std::string& args) const {
        return ft::run(bin + "/feedline-pack --quiet --input " + jsonl + " --model " + model + " " + args, dir);
    }
};

std::vector<std::string> names_in(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

// Writes a Megatron pair whose documents have the given lengths, every token `value`.
void write_pair(const std::string& prefix, const std::vector<std::uint32_t>& lengths, std::uint32_t value) {
    megatron_writer w(prefix, token_dtype::uint16);
    for (auto n : lengths) w.add_document(std::vector<std::uint32_t>(n, value));
    w.finish();
}

}  // namespace

TEST_CASE("DataSafety.Pack.ARepackRemovesOnlyWhatAnEarlierPackProvablyWroteNeverAnotherDataset") {
    packed_corpus c;
    for (const std::string format : {"megatron", "llmc"}) {
        CAPTURE(format);
        const fs::path out = c.dir / ("out-" + format);
        fs::create_directories(out);
        const std::string prefix = (out / "web").string();
        const std::string fmt = " --format " + format;
        REQUIRE(c.pack("--output " + prefix + fmt + " --shard-size 4096").code == 0);
        const auto first = names_in(out);
        // Files of other datasets beside it, named "web_<digits>" but not with the pack's numbering:
        // another Megatron dataset (the pair web_2024) and a stray web_7.bin.
        REQUIRE(c.pack("--output " + (out / "web_2024").string()).code == 0);
        ft::write_text((out / "web_7.bin").string(), "not a shard of web");
        const auto other_bin = ft::read_bytes((out / "web_2024.bin").string()), other_idx = ft::read_bytes((out / "web_2024.idx").string());

        // A re-pack into fewer shards: the earlier pack's extra shards go, nothing else does.
        auto r = c.pack("--output " + prefix + fmt + " --shard-size 65536");
        REQUIRE_MESSAGE(r.code == 0, r.err);
        CHECK(ft::read_bytes((out / "web_2024.bin").string()) == other_bin);
        CHECK(ft::read_bytes((out / "web_2024.idx").string()) == other_idx);
        CHECK(ft::read_text((out / "web_7.bin").string()) == "not a shard of web");
        const auto second = names_in(out);
        CHECK(second.size() < first.size() + 3);  // fewer shards, plus the other dataset's three files
        CHECK(std::count(second.begin(), second.end(), "web.manifest") == 1);
        CHECK(std::none_of(second.begin(), second.end(),
                           [](const std::string& n) { return n.find(".tmp-") != std::string::npos || n == "web.lock"; }));
        const auto summary = nlohmann::json::parse(ft::run(bin + "/feedline-inspect --json '" + prefix + "_??????.bin'", c.dir).out);
        CHECK(summary["valid"] == true);

        // A file named like the pack's own shards that no manifest vouches for (a user's copy, a
        // pack from before manifests): the re-pack refuses, naming it, and changes nothing.
        ft::write_text(prefix + "_000042.bin", "precious");
        const auto before = names_in(out);
        r = c.pack("--output " + prefix + fmt + " --shard-size 4096");
        CHECK(r.code == 1);
        CHECK_MESSAGE(r.err.find(prefix + "_000042.bin") != std::string::npos, r.err);
        CHECK_MESSAGE(r.err.find("no manifest") != std::string::npos, r.err);
        CHECK(names_in(out) == before);
        CHECK(ft::read_text(prefix + "_000042.bin") == "precious");
        fs::remove(prefix + "_000042.bin");
        // A shard the pack wrote but someone rewrote since: no longer provably the pack's.
        const std::string shard0 = prefix + "_000000" + (format == "llmc" ? ".bin" : ".idx");
        const auto bytes = ft::read_bytes(shard0);
        ft::write_bytes(shard0, bytes.data(), bytes.size());  // same bytes, a new modification time
        r = c.pack("--output " + prefix + fmt + " --shard-size 4096");
        CHECK(r.code == 1);
        CHECK_MESSAGE(r.err.find(shard0) != std::string::npos, r.err);
    }
}

TEST_CASE("DataSafety.Pack.TwoWritersOfOnePrefixNeverBothPublish") {
    packed_corpus c;
    const std::string prefix = c.dir / "shared";
    {
        // Another writer holds the prefix (as a running pack does): the pack is refused at once,
        // naming the holder, and leaves nothing.
        output_lock held(prefix);
        const auto r = c.pack("--output " + prefix);
        CHECK(r.code == 1);
        CHECK_MESSAGE(r.err.find("another writer (pid " + std::to_string(::getpid()) + ")") != std::string::npos, r.err);
        CHECK_FALSE(fs::exists(prefix + ".bin"));
        CHECK_THROWS_AS(megatron_writer(prefix, token_dtype::uint16), io_error);
        CHECK_THROWS_AS(llmc_writer(prefix, token_dtype::uint16, 0), io_error);
    }
    const auto r = c.pack("--output " + prefix);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK_FALSE(fs::exists(prefix + ".lock"));  // removed when the writer is done
    CHECK(token_dataset(prefix).document_count() == 400);
    // Two packs of one prefix at once, the first held (strace) between renaming its .bin and its .idx
    // into place: without the lock the second would publish in that window and the first would then
    // put its .idx beside the second's .bin. With it the second is refused and the first finishes whole.
    if (ft::run("strace -f -qq -o /dev/null -e trace=none true", c.dir).code != 0) ft::skip("strace is missing or cannot trace here");
    REQUIRE(c.pack("--output " + (c.dir / "with-eos") + " --append-eos").code == 0);
    const auto eos_bin = ft::read_bytes(c.dir / "with-eos.bin"), eos_idx = ft::read_bytes(c.dir / "with-eos.idx");
    const std::string renames = "rename,renameat,renameat2";
    ft::result first;
    std::thread held([&] {
        // Its renames: the .bin's, then the .idx's (the second, held).
        first = ft::run("ASAN_OPTIONS=detect_leaks=0 strace -f -qq -o /dev/null -e trace=" + renames + " -e inject=" + renames +
                            ":delay_enter=1500000:when=2 " + bin + "/feedline-pack --quiet --append-eos --input " + c.jsonl + " --model " +
                            c.model + " --output " + prefix,
                        c.dir);
    });
    // Its .bin is in place and its .idx not yet: the window.
    for (int i = 0; i < 3000 && fs::exists(prefix + ".idx"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto second = c.pack("--output " + prefix);
    held.join();
    REQUIRE_MESSAGE(first.code == 0, first.err);
    CHECK(second.code == 1);
    CHECK_MESSAGE(second.err.find("another writer") != std::string::npos, second.err);
    CHECK(ft::read_bytes(prefix + ".bin") == eos_bin);
    CHECK(ft::read_bytes(prefix + ".idx") == eos_idx);
}

TEST_CASE("DataSafety.Read.AReaderNeverPairsAnOldIndexWithANewBin") {
    ft::scratch_dir dir;
    const std::string prefix = dir / "data";
    // Two versions with the same .bin size but other document boundaries and tokens: only the pair
    // check at open tells a mixed pair from a true one.
    const std::vector<std::uint32_t> lengths_a{10, 20, 30, 40}, lengths_b{40, 30, 20, 10};
    write_pair(prefix, lengths_a, 1);
    std::atomic<bool> stop{false};
    std::atomic<int> opened{0}, refused{0}, mixed{0};
    std::thread reader([&] {
        while (!stop.load()) {
            try {
                const token_dataset ds(prefix);
                auto reader = make_reader({.backend = io_backend::pread});
                std::vector<std::uint32_t> tokens;
                std::vector<std::uint32_t> lengths;
                std::uint32_t value = 0;
                bool consistent = true;
                for (std::uint64_t d = 0; d < ds.document_count(); ++d) {
                    const auto span = ds.document(d);
                    lengths.push_back(static_cast<std::uint32_t>(span.length));
                    tokens.resize(span.length);
                    ds.read_tokens(reader, span, 0, span.length, tokens.data());
                    for (auto t : tokens) {
                        if (value == 0) value = t;
                        consistent = consistent && t == value;
                    }
                }
                const bool is_a = lengths == lengths_a && value == 1, is_b = lengths == lengths_b && value == 2;
                if (!consistent || !(is_a || is_b)) ++mixed;
                ++opened;
            } catch (const error&) {
                ++refused;  // a prefix caught between its .idx going and coming back: refused, never mixed
            }
        }
    });
    for (int i = 0; i < 300; ++i) write_pair(prefix, i % 2 ? lengths_a : lengths_b, i % 2 ? 1 : 2);
    stop = true;
    reader.join();
    MESSAGE("opened " << opened.load() << ", refused " << refused.load() << " while re-packed 300 times");
    CHECK(opened.load() > 0);
    CHECK(mixed.load() == 0);
}

TEST_CASE("DataSafety.Read.AnIndexOpenedBeforeARepackIsNeverPairedWithTheNewBin") {
    ft::scratch_dir dir;
    if (ft::run("strace -f -qq -o /dev/null -e trace=none true", dir).code != 0) ft::skip("strace is missing or cannot trace here");
    // A and B: the same .bin size, other document boundaries and tokens. Which pair a reader used shows
    // in the token sum of its first window (documents shuffled by their boundaries).
    auto write = [](const std::string& prefix, const std::vector<std::uint32_t>& lengths, std::uint32_t base) {
        megatron_writer w(prefix, token_dtype::uint16);
        std::uint32_t at = 0;  // every token its offset in the .bin (plus `base`)
        for (auto n : lengths) {
            std::vector<std::uint32_t> doc(n);
            for (auto& t : doc) t = base + at++;
            w.add_document(doc);
        }
        w.finish();
    };
    const std::vector<std::uint32_t> a{10, 20, 30, 40, 50, 60}, b{60, 50, 40, 30, 20, 10};
    std::string iterate;
    auto token_sum = [&](const std::string& prefix) {
        const auto r = ft::run(iterate + prefix, dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        return nlohmann::json::parse(r.out)["token_sum"].get<std::uint64_t>();
    };
    write(dir / "a", a, 1000);
    write(dir / "b", b, 2000);
    fs::copy_file(dir / "a.idx", dir / "mixed.idx");
    fs::copy_file(dir / "b.bin", dir / "mixed.bin");
    // A seed whose first window tells the three apart (else the test could not tell a mixed pair).
    std::uint64_t sum_a = 0, sum_b = 0, sum_mixed = 0;
    for (int seed = 1; seed < 40; ++seed) {
        iterate = bin + "/feedline-iterate --batches 1 --batch-size 1 --seq-len 24 --workers 1 --seed " + std::to_string(seed) + " ";
        sum_a = token_sum(dir / "a"), sum_b = token_sum(dir / "b"), sum_mixed = token_sum(dir / "mixed");
        if (sum_mixed != sum_a && sum_mixed != sum_b) break;
    }
    REQUIRE(sum_mixed != sum_a);
    REQUIRE(sum_mixed != sum_b);

    // The reader's open of the .idx is held for a second and a half (strace) while B is published
    // over A: the reader has A's index open and B's .bin under the name.
    const std::string prefix = dir / "data";
    write(prefix, a, 1000);
    // (LeakSanitizer stops the world with ptrace, which strace holds: off in the traced reader. No
    // REQUIRE on this thread: doctest's checks belong to the test's own.)
    ft::result raced_run;
    std::thread reader([&] {
        raced_run = ft::run("ASAN_OPTIONS=detect_leaks=0 strace -f -qq -o /dev/null -P " + prefix +
                                ".idx -e trace=openat -e inject=openat:delay_exit=1500000:when=1 " + iterate + prefix,
                            dir);
    });
    // Until some process holds the old .idx open (the reader, inside its delayed open).
    const auto held = [&] {
        for (const auto& p : fs::directory_iterator("/proc")) {
            std::error_code ec;
            for (fs::directory_iterator fd(p.path() / "fd", ec), end; !ec && fd != end; fd.increment(ec))
                if (fs::read_symlink(fd->path(), ec) == fs::path(prefix + ".idx")) return true;
        }
        return false;
    };
    for (int i = 0; i < 3000 && !held(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    write(prefix, b, 2000);
    reader.join();
    REQUIRE_MESSAGE(raced_run.code == 0, raced_run.err);
    const auto raced = nlohmann::json::parse(raced_run.out)["token_sum"].get<std::uint64_t>();
    CHECK((raced == sum_a || raced == sum_b));
    CHECK(raced != sum_mixed);
}

TEST_CASE("DataSafety.Read.ABinLongerThanItsIndexCoversIsRefused") {
    ft::scratch_dir dir;
    const std::string a = dir / "a", b = dir / "b";
    write_pair(a, {10, 20}, 1);
    write_pair(b, {10, 20, 30}, 2);
    fs::rename(b + ".bin", a + ".bin");  // a's index beside b's data
    try {
        token_dataset ds(a);
        FAIL("opened a mismatched pair");
    } catch (const format_error& e) {
        CHECK(e.file() == a + ".bin");
        CHECK(std::string(e.what()).find("were not written together") != std::string::npos);
    }
}

TEST_CASE("DataSafety.Specs.ADamagedOrStrayShardIsAnErrorNamingItNeverLessData") {
    ft::scratch_dir dir;
    const fs::path llmc_dir = dir / "llmc";
    fs::create_directories(llmc_dir);
    for (int k = 0; k < 3; ++k) {
        llmc_writer w((llmc_dir / ("part" + std::to_string(k))).string(), token_dtype::uint16, 0);
        for (std::uint32_t d = 0; d < 5; ++d) w.add_document(std::vector<std::uint32_t>(30, d + 1));
        w.finish();
    }
    CHECK(token_dataset(llmc_dir.string()).shard_count() == 3);
    const std::string glob = (llmc_dir / "*.bin").string();
    auto refused_naming = [&](const std::string& spec, const std::string& file) {
        CAPTURE(spec);
        try {
            token_dataset ds(spec);
            FAIL("opened " << ds.shard_count() << " shards");
        } catch (const error& e) {
            CHECK_MESSAGE(std::string(e.what()).find(file) != std::string::npos, e.what());
        }
        const auto r = ft::run(bin + "/feedline-inspect --json '" + spec + "'", dir);
        CHECK(r.code == 1);
        CHECK(r.out.find("\"valid\":true") == std::string::npos);
    };
    // An llm.c shard with bad magic, and one of 0 bytes, among good ones.
    const std::string bad = (llmc_dir / "part1_000000.bin").string();
    const auto good = ft::read_bytes(bad);
    auto broken = good;
    broken[0] = std::byte{0x55};
    ft::write_bytes(bad, broken.data(), broken.size());
    refused_naming(llmc_dir.string(), bad);
    refused_naming(glob, bad);
    ft::write_text(bad, "");
    refused_naming(llmc_dir.string(), bad);
    ft::write_bytes(bad, good.data(), good.size());
    CHECK(token_dataset(glob).shard_count() == 3);

    // A Megatron .bin whose .idx is missing, among Megatron pairs.
    const fs::path meg = dir / "meg";
    fs::create_directories(meg);
    for (int k = 0; k < 3; ++k) write_pair((meg / ("p" + std::to_string(k))).string(), {5, 6, 7}, 3);
    fs::remove(meg / "p1.idx");
    refused_naming(meg.string(), (meg / "p1.bin").string());
    refused_naming((meg / "p*.bin").string(), (meg / "p1.bin").string());
    write_pair((meg / "p1").string(), {5, 6, 7}, 3);
    CHECK(token_dataset(meg.string()).shard_count() == 3);
    // llm.c shards in a folder that also holds a Megatron pair.
    fs::copy_file(llmc_dir / "part0_000000.bin", meg / "stray_000000.bin");
    refused_naming(meg.string(), (meg / "stray_000000.bin").string());
    fs::remove(meg / "stray_000000.bin");
    // What a pack leaves beside its shards (a manifest, a model) is not a shard and not an error.
    ft::write_text((meg / "p.manifest").string(), "x");
    ft::write_text((meg / "README.md").string(), "x");
    CHECK(token_dataset(meg.string()).shard_count() == 3);
}

TEST_CASE("DataSafety.Pack.ATrainedModelIsPublishedByRenameAndNothingIsLeftOnFailure") {
    packed_corpus c;
    const std::string victim = c.dir / "victim.txt", out = c.dir / "trained";
    ft::write_text(victim, "precious");
    fs::create_symlink(victim, out + ".model");  // planted where the trained model goes
    fs::create_symlink(victim, out + ".vocab");
    auto r = ft::run(bin + "/feedline-pack --quiet --input " + c.jsonl + " --train-model 300 --output " + out, c.dir);
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(ft::read_text(victim) == "precious");
    CHECK(fs::is_regular_file(fs::symlink_status(out + ".model")));
    CHECK(token_dataset(out).document_count() == 400);
    // Bad input while the training text is gathered: nothing of the pack stays behind.
    ft::write_text(c.dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": broken}\n");
    r = ft::run(bin + "/feedline-pack --quiet --input " + (c.dir / "bad.jsonl") + " --train-model 300 --output " + (c.dir / "bad"), c.dir);
    CHECK(r.code == 1);
    for (const auto& name : names_in(c.dir.path())) CHECK_MESSAGE((name.rfind("bad", 0) != 0 || name == "bad.jsonl"), name);
}

TEST_CASE("DataSafety.Paths.AModelThatIsAFifoOrADirectoryIsRefusedAtOnce") {
    packed_corpus c;
    REQUIRE(c.pack("--output " + (c.dir / "d")).code == 0);
    const std::string fifo = c.dir / "fifo.model", directory = c.dir / "dir.model";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    fs::create_directory(directory);
    for (const std::string& model : {fifo, directory}) {
        CAPTURE(model);
        // `timeout` ends a hang with 124; an abort would be 134.
        for (const std::string& cmd :
             {bin + "/feedline-pack --quiet --input " + c.jsonl + " --model " + model + " --output " + (c.dir / "x"),
              bin + "/feedline-iterate --tokenizer " + model + " --batches 2 " + c.jsonl,
              bin + "/feedline-train --data " + (c.dir / "d") + " --tokenizer " + model + " --max-steps 2",
              bin + "/feedline-doctor check --data " + c.jsonl + " --tokenizer " + model + " --seconds 1"}) {
            CAPTURE(cmd);
            const auto r = ft::run("timeout 60 " + cmd, c.dir);
            CHECK_MESSAGE(r.code == (cmd.find("doctor") != std::string::npos ? 2 : 1), r.err);
            CHECK_MESSAGE(r.err.find(model) != std::string::npos, r.err);
        }
        CHECK_THROWS_AS(make_tokenizer({.model = model}), config_error);
    }
}
