// Hostile paths and sizes: a FIFO, a directory or a symlink loop where data belongs is an io_error
// naming it (never a hang or an uncaught std::filesystem_error); configs and saved states whose sizes
// would overflow are config_errors naming the field; a symlink planted at a writer's temporary name
// is never written through.
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "run_command.hpp"
#include "test_support.hpp"

// AddressSanitizer's leak check, which a child leaving by _exit must ask for itself.
#if defined(__SANITIZE_ADDRESS__)
#define FEEDLINE_TEST_LEAK_CHECKED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FEEDLINE_TEST_LEAK_CHECKED 1
#endif
#endif
#ifndef FEEDLINE_TEST_LEAK_CHECKED
#define FEEDLINE_TEST_LEAK_CHECKED 0
#endif
#if FEEDLINE_TEST_LEAK_CHECKED
#include <sanitizer/lsan_interface.h>
#endif

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Two Megatron shards of 20 short documents each.
std::vector<std::string> write_shards(const ft::scratch_dir& dir) {
    std::vector<std::string> prefixes;
    for (int k = 0; k < 2; ++k) {
        prefixes.push_back(dir / ("part_" + std::to_string(k)));
        megatron_writer w(prefixes.back(), token_dtype::uint16);
        for (std::uint32_t d = 0; d < 20; ++d) w.add_document(std::vector<std::uint32_t>(50 + d, d + 1));
        w.finish();
    }
    return prefixes;
}

pipeline_config small() {
    return {.batch_size = 2,
            .seq_len = 16,
            .workers = 1,
            .memory_budget = 16 << 20,
            .device = device_kind::cpu,
            .rank = 0,
            .world_size = 1,
            .max_steps = 4};
}

template <class F>
void refused_naming(F&& open, const std::string& path) {
    try {
        open();
        FAIL("accepted " << path);
    } catch (const io_error& e) {
        CHECK(e.file() == path);
    }
}

}  // namespace

TEST_CASE("Faults.Paths.AFifoWhereDataBelongsIsRefusedWithoutBlocking") {
    ft::scratch_dir dir;
    const auto prefixes = write_shards(dir);
    // A FIFO with no writer: opening it for reading without O_NONBLOCK would block forever.
    for (const std::string ext : {".bin", ".idx"}) {
        CAPTURE(ext);
        const std::string path = prefixes[1] + ext, kept = path + ".kept";
        std::filesystem::rename(path, kept);
        REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
        refused_naming([&] { token_dataset d(prefixes); }, path);
        std::filesystem::remove(path);
        std::filesystem::rename(kept, path);
    }
    const std::string fifo = dir / "corpus.jsonl";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    refused_naming([&] { text_corpus c({fifo}); }, fifo);
    refused_naming([&] { text_reader r(fifo); }, fifo);
    // Through the pipeline's spec too.
    try {
        pipeline p(fifo, small());
        FAIL("a FIFO was opened as text");
    } catch (const error& e) {
        CHECK(std::string(e.what()).find(fifo) != std::string::npos);
    }
}

TEST_CASE("Faults.Paths.ADirectoryWhereABinBelongsIsRefused") {
    ft::scratch_dir dir;
    const auto prefixes = write_shards(dir);
    std::filesystem::remove(prefixes[0] + ".bin");
    std::filesystem::create_directory(prefixes[0] + ".bin");
    refused_naming([&] { token_dataset d(prefixes); }, prefixes[0] + ".bin");
}

TEST_CASE("Faults.Paths.ASymlinkLoopInADatasetDirectoryIsAnIoErrorNamingIt") {
    ft::scratch_dir dir;
    (void)write_shards(dir);
    std::filesystem::create_symlink(dir / "loop", dir / "loop");  // loop -> loop
    refused_naming([&] { pipeline p(dir.path().string(), small()); }, dir / "loop");
    refused_naming([&] { (void)detect_source(dir.path().string()); }, dir / "loop");
    refused_naming([&] { (void)resolve_text_inputs({dir.path().string()}); }, dir / "loop");
}

TEST_CASE("Faults.Sizes.OverflowingConfigsAreConfigErrorsNamingTheField") {
    ft::scratch_dir dir;
    const auto prefixes = write_shards(dir);
    auto data = std::make_shared<const token_dataset>(prefixes);
    auto refused = [&](pipeline_config c, const std::string& field) {
        CAPTURE(field);
        try {
            pipeline p(data, c);
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(e.field() == field);
        }
    };
    for (sample_mode mode : {sample_mode::windows, sample_mode::packed}) {
        auto c = small();
        c.mode = mode;
        c.batch_size = 4611686018427387905ull;  // x seq_len x 4 bytes wraps to a tiny slot
        c.seq_len = 1;
        refused(c, "batch_size");
    }
    auto c = small();
    c.world_size = 4;
    c.batch_size = (std::uint64_t(1) << 62) + 1;  // x 4 ranks wraps the global batch
    refused(c, "batch_size");
    c = small();
    c.workers = 1u << 30;
    refused(c, "workers");
    c = small();
    c.max_steps = UINT64_MAX;
    refused(c, "max_steps");
    c = small();
    c.batch_size = std::uint64_t(1) << 31;  // rows are numbered in int32
    refused(c, "batch_size");
    c = small();
    c.max_workers = 4;  // with workers = 1: nothing to tune, so a mistake
    refused(c, "max_workers");
    c = small();
    c.world_size = 0;
    refused(c, "world_size");
}

TEST_CASE("Faults.State.AStepThatWouldWrapTheRingIsRefused") {
    ft::scratch_dir dir;
    auto data = std::make_shared<const token_dataset>(write_shards(dir));
    auto longer = small();
    longer.max_steps = 8;
    pipeline p(data, longer);
    pipeline_state s = p.state();
    s.step = UINT64_MAX;
    s.taken[0] = s.step * s.global_batch;  // wrapped to match, as an edited state would be
    try {
        p.restore(s);
        FAIL("restored a step of 2^64 - 1");
    } catch (const config_error& e) {
        CHECK(e.field() == "state.step");
    }
    s = p.state();
    s.step = 3;  // taken says 0
    CHECK_THROWS_AS(p.restore(s), config_error);
    // Counts that add up but a position that is not the step's: workers planning from the step and a
    // sampler walking from the position would disagree, so it is refused.
    pipeline walked(data, small());
    while (walked.next()) {
    }
    s = walked.state();
    REQUIRE(s.step == 4);
    s.index[0] += 2;
    try {
        p.restore(s);
        FAIL("restored an edited position");
    } catch (const config_error& e) {
        CHECK(e.field() == "state.index");
    }
    p.restore(walked.state());
    CHECK(p.next());  // the refused restores left the pipeline as it was
    CHECK(p.state().step == 5);
}

TEST_CASE("Faults.Outputs.AStatsLogThatCannotBeWrittenStopsLoggingButLosesNoBatch") {
    ft::scratch_dir dir;
    auto data = std::make_shared<const token_dataset>(write_shards(dir));
    auto c = small();
    c.stats_jsonl = "/dev/full";  // every write fails with ENOSPC, as on a full disk
    c.stats_every = 1;
    pipeline p(data, c);
    std::uint64_t expected = 0;
    for (auto& b : p) CHECK(b.step() == expected++);
    CHECK(expected == 4);
    CHECK(p.state().step == 4);
    CHECK(p.stats().stats_log_error.find("/dev/full") != std::string::npos);
}

TEST_CASE("Faults.Outputs.ASymlinkPlantedAtATemporaryNameIsNeverWrittenThrough") {
    ft::scratch_dir dir;
    const std::string victim = dir / "victim.txt", prefix = dir / "out";
    ft::write_text(victim, "precious");
    // The names an earlier writer used (final name + ".tmp-" + pid): predictable, so plantable.
    for (const std::string ext : {".bin", ".idx"})
        std::filesystem::create_symlink(victim, prefix + ext + ".tmp-" + std::to_string(::getpid()));
    {
        megatron_writer w(prefix, token_dtype::uint16);
        w.add_document(std::vector<std::uint32_t>{1, 2, 3});
        w.finish();
    }
    std::ifstream in(victim);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text == "precious");
    CHECK(token_dataset(prefix).total_tokens() == 3);
    // Two writers of one name get different temporary names.
    atomic_file a(dir / "same"), b(dir / "same");
    CHECK(a.temp_path() != b.temp_path());
}

TEST_CASE("Faults.Memory.AnLlmcShardOfOnlyDelimitersCostsEightBytesPerDocument") {
    // Every token a delimiter: as many documents as tokens. The index keeps where each starts (8 bytes),
    // so it is 4x the uint16 tokens it describes (24 bytes per document, 12x, before).
    ft::scratch_dir dir;
    llmc_writer w(dir / "delims", token_dtype::uint16, 7, 60'000);
    for (int d = 0; d < 100'000; ++d) w.add_document(std::vector<std::uint32_t>{});
    w.finish();
    const token_dataset data(dir / "delims_*.bin");
    REQUIRE(data.shard_count() == 2);
    CHECK(data.index_bytes() == 0);  // windows never need it: built on first use
    REQUIRE(data.document_count() == 100'000);
    CHECK(data.index_bytes() <= 100'000 * 8 + 4096);
    CHECK(data.index_bytes() <= 4 * data.total_tokens() * dtype_size(data.dtype()) + 4096);
    CHECK(data.document(59'999).shard == 0);
    CHECK(data.document(60'000).shard == 1);
    CHECK(data.document(60'000).first_token == 0);
    CHECK(data.document(99'999).length == 1);
    CHECK(data.shard_document_starts() == std::vector<std::uint64_t>{0, 60'000});
}

TEST_CASE("Faults.Memory.A20MbLineOfBracketsIsRefusedForAFewTimesItsSize") {
#if FEEDLINE_TEST_SANITIZED
    ft::skip("peak memory is not meaningful under a sanitizer (shadow memory, quarantine)");
#endif
    // Parsing it into a DOM took ~1.5 GB before refusing it; the depth scan refuses it unparsed.
    ft::scratch_dir dir;
    const std::size_t bytes = 20u << 20;
    ft::write_text(dir / "hostile.jsonl", "{\"text\": \"fine\"}\n" + std::string(bytes, '[') + "\n");
    auto peak = [] {
        std::ifstream in("/proc/self/status");
        for (std::string line; std::getline(in, line);)
            if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
        return 0ull;
    };
    if (!(std::ofstream("/proc/self/clear_refs") << "5")) ft::skip("cannot reset the peak RSS (/proc/self/clear_refs)");
    const std::uint64_t before = peak();
    try {
        text_corpus corpus({dir / "hostile.jsonl"});
        FAIL("a line nested 20 million deep was accepted");
    } catch (const format_error& e) {
        CHECK(e.file() == dir / "hostile.jsonl");
        CHECK(std::string(e.what()).find("nested deeper than 1024") != std::string::npos);
    }
    const std::uint64_t grew = peak() - before;
    MESSAGE("refusing a " << bytes << "-byte line raised the peak RSS by " << grew << " bytes");
    CHECK(grew < 4 * bytes);
}

namespace {

// One Megatron shard of 2000 documents: a 40 KB .idx, so cutting it to one page leaves most of its
// pointers on pages that are gone.
std::string write_big_shard(const std::string& prefix, std::uint32_t salt) {
    megatron_writer w(prefix, token_dtype::uint16);
    for (std::uint32_t d = 0; d < 2000; ++d) w.add_document(std::vector<std::uint32_t>(100 + d % 50, (d + salt) % 60000 + 1));
    w.finish();
    return prefix;
}

pipeline_config with_backend(io_backend backend) {
    auto c = small();
    c.max_steps = 0;  // epochs without end: only the fault can stop it
    c.shards.backend = backend;
    return c;
}

std::vector<io_backend> usable_backends() {
    std::vector<io_backend> out{io_backend::mmap, io_backend::pread};
    if (!io_uring_unavailable_reason()) out.push_back(io_backend::io_uring);
    return out;
}

}  // namespace

TEST_CASE("Faults.Running.AShardOrIndexTruncatedUnderARunningPipelineIsAFormatErrorFromNext") {
    for (const io_backend backend : usable_backends()) {
        for (const std::string ext : {".bin", ".idx"}) {
            CAPTURE(to_string(backend));
            CAPTURE(ext);
            ft::scratch_dir dir;
            const std::string prefix = write_big_shard(dir / "data", 0);
            pipeline p(prefix, with_backend(backend));
            for (int i = 0; i < 3; ++i) REQUIRE(p.next());
            REQUIRE(::truncate((prefix + ext).c_str(), 4096) == 0);
            std::uint64_t batches = 0;
            try {
                while (p.next() && ++batches < 200000) {
                }
                FAIL("no error after " << batches << " batches from a truncated " << ext);
            } catch (const format_error& e) {
                CHECK(e.file() == prefix + ext);
                CHECK(e.offset() >= 4096);
            }
            CHECK_THROWS_AS(p.next(), format_error);  // the error stays; the destructor joins the workers
        }
    }
}

// An .idx rewritten in place under a running job (same size, its byte pointers now past the .bin's
// end) cannot make a worker read outside what was opened: the windows it names are a typed error
// naming the .bin or the .idx, whatever the backend, never a view outside the mapping. (The mmap
// backend locates a window's bytes in the .bin's mapping from the entries alone.)
TEST_CASE("Faults.Running.AnIndexRewrittenInPlaceToPointPastTheBinIsATypedError") {
    for (const io_backend backend : usable_backends()) {
        CAPTURE(to_string(backend));
        ft::scratch_dir dir;
        const std::string prefix = write_big_shard(dir / "data", 0);
        const auto bin_size = static_cast<std::int64_t>(std::filesystem::file_size(prefix + ".bin"));
        pipeline p(prefix, with_backend(backend));
        for (int i = 0; i < 3; ++i) REQUIRE(p.next());
        {
            megatron_shard pair(prefix);
            const megatron_index_view& idx = pair.index();
            std::vector<std::int64_t> past(idx.sequence_count(), bin_size + 4096);
            const int fd = ::open((prefix + ".idx").c_str(), O_WRONLY);
            REQUIRE(fd >= 0);
            const auto n = static_cast<ssize_t>(past.size() * sizeof past[0]);
            REQUIRE(::pwrite(fd, past.data(), past.size() * sizeof past[0], static_cast<off_t>(idx.pointers_offset())) == n);
            ::close(fd);
        }
        std::uint64_t batches = 0;
        try {
            while (p.next() && ++batches < 200000) {
            }
            FAIL("no error after " << batches << " batches from an .idx pointing past its .bin");
        } catch (const format_error& e) {
            CHECK((e.file() == prefix + ".bin" || e.file() == prefix + ".idx"));
            if (backend == io_backend::mmap) CHECK(std::string(e.what()).find("rewritten in place") != std::string::npos);
        } catch (const io_error& e) {
            CHECK((e.file() == prefix + ".bin" || e.file() == prefix + ".idx"));
        }
    }
}

// A blend's workers gather the windows of every source in a batch and convert them in one pass at the
// batch's end, whichever source's writer finishes it: the error still names the file that was cut.
TEST_CASE("Faults.Running.AShardTruncatedUnderABlendIsAFormatErrorNamingThatShard") {
    for (const io_backend backend : usable_backends()) {
        CAPTURE(to_string(backend));
        ft::scratch_dir dir;
        const std::string a = write_big_shard(dir / "a", 0), b = write_big_shard(dir / "b", 3), c = write_big_shard(dir / "c", 5);
        auto cfg = with_backend(backend);
        cfg.batch_size = 16;  // rows of all three in most batches
        pipeline p("0.2 " + a + " 0.5 " + b + " 0.3 " + c, cfg);
        for (int i = 0; i < 3; ++i) REQUIRE(p.next());
        REQUIRE(::truncate((b + ".bin").c_str(), 4096) == 0);
        std::uint64_t batches = 0;
        try {
            while (p.next() && ++batches < 200000) {
            }
            FAIL("no error after " << batches << " batches from a truncated shard in a blend");
        } catch (const format_error& e) {
            CHECK(e.file() == b + ".bin");
            CHECK(e.offset() + 2 * (cfg.seq_len + 1) > 4096);  // a window's start: it may begin just before the cut
        }
        CHECK_THROWS_AS(p.next(), format_error);
    }
}

TEST_CASE("Faults.Running.AShardReplacedByRenameKeepsServingTheFilesItOpened") {
    for (const io_backend backend : usable_backends()) {
        CAPTURE(to_string(backend));
        ft::scratch_dir dir;
        const std::string a = write_big_shard(dir / "a", 0), b = write_big_shard(dir / "b", 0);
        const std::string other = write_big_shard(dir / "other", 7);
        pipeline pa(a, with_backend(backend)), pb(b, with_backend(backend));
        for (int i = 0; i < 3; ++i) REQUIRE((pa.next() && pb.next()));
        // The usual way to update a dataset: write new files, rename them over the old names.
        for (const std::string ext : {".bin", ".idx"}) std::filesystem::rename(other + ext, a + ext);
        for (int i = 0; i < 500; ++i) {
            auto x = pa.next();
            auto y = pb.next();
            REQUIRE((x && y));
            REQUIRE(std::ranges::equal(x->host_inputs(), y->host_inputs()));
        }
    }
}

TEST_CASE("Faults.Text.ALineLongerThanMaxLineBytesIsRefusedOrSkippedWithoutReadingItWhole") {
    ft::scratch_dir dir;
    const std::string path = dir / "long.jsonl";
    const std::string first = "{\"text\": \"short one\"}\n";
    ft::write_text(path, first + "{\"text\": \"" + std::string(3 << 20, 'a') + "\"}\n{\"text\": \"after\"}\n");
    text_document doc;
    {
        text_reader r(path, {.max_line_bytes = 1 << 20});
        REQUIRE(r.next(doc));
        CHECK(doc.text == "short one");
        try {
            (void)r.next(doc);
            FAIL("read a line past max_line_bytes");
        } catch (const format_error& e) {
            CHECK(e.file() == path);
            CHECK(e.offset() == first.size());
            CHECK(std::string(e.what()).find("line 2 is longer than max_line_bytes") != std::string::npos);
        }
    }
    {
        text_reader r(path, {.skip_invalid = true, .max_line_bytes = 1 << 20});
        REQUIRE(r.next(doc));
        REQUIRE(r.next(doc));
        CHECK(doc.text == "after");
        CHECK(doc.line == 3);
        CHECK(doc.offset == first.size() + (3 << 20) + 13);  // offsets stay exact past the skipped line
        CHECK(r.skipped() == 1);
    }
    text_reader whole(path, {.max_line_bytes = 0});  // 0: no limit
    REQUIRE(whole.next(doc));
    REQUIRE(whole.next(doc));
    CHECK(doc.text.size() == (3u << 20));
}

TEST_CASE("Faults.Text.ABlankLineBlockLongerThanMaxLineBytesIsRefusedOrSkippedInBoundedMemory") {
    // A file without a blank line was one document: a 300 MB one grew a process to 22 GB. The block is
    // bounded like a line, and refusing it keeps memory near the bound, not near the file.
    ft::scratch_dir dir;
    const std::string path = dir / "no-blank-lines.txt";
    {
        std::ofstream out(path);
        out << "a first paragraph\n\n";
        const std::string line(100, 'x');
        for (int i = 0; i < 200'000; ++i) out << line << '\n';  // 20 MB, one block
        out << "\nthe last paragraph\n";
    }
    const text_options blank{.split = text_split::blank_lines, .max_line_bytes = 1 << 20};
    text_document doc;
    auto peak = [] {
        std::ifstream in("/proc/self/status");
        for (std::string line; std::getline(in, line);)
            if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
        return 0ull;
    };
    const bool can_measure = !FEEDLINE_TEST_SANITIZED && static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
    const std::uint64_t before = peak();
    {
        text_reader r(path, blank);
        REQUIRE(r.next(doc));
        CHECK(doc.text == "a first paragraph");
        try {
            (void)r.next(doc);
            FAIL("read a block past max_line_bytes");
        } catch (const format_error& e) {
            CHECK(e.file() == path);
            CHECK(e.offset() == 19);
            CHECK(std::string(e.what()).find("starting at line 3") != std::string::npos);
        }
    }
    if (can_measure) {
        const std::uint64_t grew = peak() - before;
        MESSAGE("refusing a 20 MB block with a 1 MiB bound raised the peak RSS by " << grew << " bytes");
        CHECK(grew < (8u << 20));
    }
    auto skipping = blank;
    skipping.skip_invalid = true;
    text_reader r(path, skipping);
    REQUIRE(r.next(doc));
    REQUIRE(r.next(doc));
    CHECK(doc.text == "the last paragraph");
    CHECK(r.skipped() == 1);
    CHECK(doc.number == 2);  // the skipped block keeps its number
    CHECK_FALSE(r.next(doc));
    // Lines too, when documents are lines: skipped and counted with skip_invalid.
    text_reader lines(path, {.skip_invalid = true, .split = text_split::lines, .max_line_bytes = 50});
    std::uint64_t n = 0;
    while (lines.next(doc)) ++n;
    CHECK(n == 4);  // the two short lines, and the two blank lines (empty documents of their own)
    CHECK(lines.skipped() == 200'000);
}

TEST_CASE("Faults.Paths.AStatsLogThatIsAFifoWithoutAReaderIsRefusedAtOnce") {
    ft::scratch_dir dir;
    auto data = std::make_shared<const token_dataset>(write_shards(dir));
    const std::string fifo = dir / "stats.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto c = small();
    c.stats_jsonl = fifo;
    refused_naming([&] { pipeline p(data, c); }, fifo);
}

TEST_CASE("Faults.Resources.ShardsPastTheSoftDescriptorLimitOpenAndPastTheHardOneAreReadWithinIt") {
    ft::scratch_dir dir;
    const int shards = 300;
    for (int k = 0; k < shards; ++k) {
        megatron_writer w(dir / ft::numbered("s", 1000 + k), token_dtype::uint16);
        w.add_document(std::vector<std::uint32_t>(20, static_cast<std::uint32_t>(k + 1)));
        w.finish();
    }
    rlimit lim{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < 2048) ft::skip("the hard descriptor limit is below 2048 here");
    // A soft limit below the shard count (as the usual 1024 is below 10,000 shards): raised, and every
    // shard keeps its descriptor.
    rlimit low = lim;
    low.rlim_cur = 128;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    const auto before = detail::open_descriptors();
    {
        const token_dataset ds(dir.path().string());
        CHECK(ds.shard_count() == shards);
        const auto held = detail::open_descriptors() - before;
        MESSAGE(shards << " Megatron shards hold " << held << " descriptors");
        CHECK(held >= shards);
        CHECK(held < shards + 16);  // one per shard: each .idx is mapped and closed
        REQUIRE(::getrlimit(RLIMIT_NOFILE, &low) == 0);
        CHECK(low.rlim_cur > 128);
    }
    // A hard limit below what the shards would hold: they open, keep within it (the descriptor pool
    // closes idle ones), and every shard's tokens are read, by every backend. In a child process: a
    // hard limit cannot be raised again without privilege, and the cases after this one (the binary
    // run whole, not case by case as ctest runs it) set `ulimit -n 256` in their own children.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int failed = 0;
        const auto expect = [&](bool ok, const std::string& what) {
            if (!ok) {
                std::fprintf(stderr, "under a hard limit of 200: %s\n", what.c_str());
                failed = 1;
            }
        };
        try {
            rlimit hard = lim;
            hard.rlim_cur = hard.rlim_max = 200;
            if (::setrlimit(RLIMIT_NOFILE, &hard) != 0) ::_exit(3);
            const token_dataset ds(dir.path().string());
            auto& pool = detail::descriptor_pool::instance();
            expect(pool.open_count() <= detail::descriptor_pool::budget(), "more descriptors open than the budget after the open");
            expect(detail::descriptor_pool::budget() == 150, "a budget other than 200 less a quarter");
            for (const io_backend backend : {io_backend::pread, io_backend::mmap, io_backend::io_uring}) {
                if (backend == io_backend::io_uring && io_uring_unavailable_reason()) continue;
                // One epoch: 6000 tokens in 315 windows of 19 (+1), 9 steps of 35, so every shard's tokens are in one.
                pipeline_config c{.batch_size = 35, .seq_len = 19, .seed = 3, .workers = 2, .device = device_kind::cpu, .epochs = 1};
                c.shards.backend = backend;
                pipeline p(std::make_shared<const token_dataset>(dir.path().string()), c);
                std::set<std::int32_t> values;
                for (auto& b : p)
                    for (const std::int32_t t : b.host_inputs()) values.insert(t);
                const std::string name = "backend " + std::to_string(static_cast<int>(backend));
                expect(values.size() == shards, name + ": not every shard's own value");  // every shard's own value
                expect(!values.empty() && *values.begin() == 1 && *values.rbegin() == shards, name + ": values outside 1..300");
                expect(pool.open_count() <= detail::descriptor_pool::budget(), name + ": more descriptors open than the budget");
            }
        } catch (const std::exception& e) {
            std::fprintf(stderr, "under a hard limit of 200: %s\n", e.what());
            ::_exit(2);
        }
#if FEEDLINE_TEST_LEAK_CHECKED
        __lsan_do_leak_check();  // _exit skips the exit-time check (a leak ends the child: abort_on_error)
#endif
        ::_exit(failed);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the child under a hard limit of 200 failed (its stderr says what)");
}

TEST_CASE("Faults.Resources.NoMemoryOrNoThreadsEndAToolWithAResourceErrorNotAnAbort") {
#if FEEDLINE_TEST_SANITIZED
    ft::skip("address-space limits and sanitizers' shadow memory do not mix");
#endif
    ft::scratch_dir dir;
    {
        megatron_writer w(dir / "data", token_dtype::uint16);
        for (std::uint32_t d = 0; d < 20; ++d) w.add_document(std::vector<std::uint32_t>(500, d + 1));
        w.finish();
    }
    const std::string iterate = std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate --batches 2 " + (dir / "data");
    // A staging ring of 4 GB (two slots of 65536 x 4096 tokens) under a 1.5 GB address space: std::bad_alloc, reported as what it is.
    auto r = ft::run("bash -c 'ulimit -v 1500000; exec " + iterate +
                         " --seq-len 4096 --batch-size 65536 --tail pad --workers 1 --prefetch 2 --memory-budget 8000000000'",
                     dir);
    CHECK_MESSAGE(r.code == 1, r.err);
    CHECK_MESSAGE(r.err.find("memory") != std::string::npos, r.err);
    // Thread stacks of 2 GB each (glibc takes the stack limit as a thread's stack size) in a 5 GB
    // address space: the second worker cannot start.
    r = ft::run("bash -c 'ulimit -s 2000000; ulimit -v 5000000; exec " + iterate + " --seq-len 64 --batch-size 2 --workers 4'", dir);
    CHECK_MESSAGE(r.code == 1, r.err);
    CHECK_MESSAGE(r.err.find("could not be started") != std::string::npos, r.err);
}

// `ulimit -n 256` sets the soft and the hard limit: a dataset of a few shards (and a mixture of a few
// domains) still opens and runs there. The reserve kept for the process's other descriptors used to
// be 256 whatever the limit, which refused even one shard.
TEST_CASE("Faults.Resources.AFewShardsRunUnderUlimitN256") {
    ft::scratch_dir dir;
    for (const char* name : {"a", "b"}) {
        megatron_writer w(dir / name, token_dtype::uint16);
        for (std::uint32_t d = 0; d < 20; ++d) w.add_document(std::vector<std::uint32_t>(300, d + 1));
        w.finish();
    }
    ft::write_text(dir / "mix.json", R"({"domains": [{"name": "a", "data": "a"}, {"name": "b", "data": "b"}],
 "stages": [{"at_step": 0, "weights": {"a": 1, "b": 3}}]})");
    if (!std::filesystem::exists(std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate")) ft::skip("feedline-iterate is not built");
    const std::string iterate = std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate --batches 5 --seq-len 64 --batch-size 4 ";
    for (const std::string& data : {dir / "a", dir / "mix.json"}) {
        const auto r = ft::run("bash -c 'ulimit -n 256 && exec " + iterate + data + "'", dir);
        CHECK_MESSAGE(r.code == 0, data, ": ", r.err);
    }
}

// A mixture of 600 domains (an llm.c shard each) under `ulimit -n 256`: the descriptor pool keeps the
// shards' descriptors within the limit, with every backend (mmap keeps none once mapped; pread and
// io_uring open a closed one again when they read it).
TEST_CASE("Faults.Resources.AMixtureOfMoreDomainsThanTheDescriptorLimitRunsUnderUlimitN256") {
    ft::scratch_dir dir;
    const int domains = 600;
    std::string doms, weights;
    for (int k = 0; k < domains; ++k) {
        const std::string name = "d" + std::to_string(k);
        std::vector<std::int32_t> header(256, 0);
        header[0] = 20240520;
        header[1] = 1;
        header[2] = 64;
        std::vector<std::uint16_t> tokens(64, static_cast<std::uint16_t>(k + 1));
        std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
        bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
        ft::write_text(dir / (name + ".bin"), bytes);
        doms += std::string(k ? ", " : "") + R"({"name": ")" + name + R"(", "data": ")" + name + R"(.bin"})";
        weights += std::string(k ? ", " : "") + "\"" + name + "\": " + std::to_string(1 + k % 7);
    }
    ft::write_text(dir / "mix.json", R"({"domains": [)" + doms + R"(], "stages": [{"at_step": 0, "weights": {)" + weights + "}}]}");
    if (!std::filesystem::exists(std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate")) ft::skip("feedline-iterate is not built");
    const std::string iterate = std::string(FEEDLINE_BIN_DIR) + "/feedline-iterate --batches 200 --seq-len 16 --batch-size 8 --workers 2 ";
    for (const char* backend : {"mmap", "pread", "io_uring"}) {
        if (std::string(backend) == "io_uring" && io_uring_unavailable_reason()) continue;
        const auto r =
            ft::run("bash -c 'ulimit -n 256 && exec " + iterate + "--io-backend " + backend + " " + (dir / "mix.json") + "'", dir);
        CHECK_MESSAGE(r.code == 0, backend, ": ", r.err);
    }
}

// Past the budget of mappings under vm.max_map_count (here set small): a mixture whose files need more
// mappings than the process may make reads the files it cannot map with pread (a Megatron .idx into
// memory), and delivers the same batches as with every file mapped, in windows and packed rows. The
// run died on the first file past the kernel's limit ("mmap failed: Cannot allocate memory"): 10,000
// domains of a few Megatron pairs or llm.c shards each pass the default 65,530.
TEST_CASE("Faults.Resources.FilesPastTheMappingBudgetAreReadWithoutMappingsGivingTheSameBatches") {
    ft::scratch_dir dir;
    std::string llmc_domains, llmc_weights, megatron_domains, megatron_weights;
    for (int k = 0; k < 30; ++k) {  // llm.c domains of one shard each, every shard its own tokens
        const std::string name = "l" + std::to_string(k);
        std::vector<std::int32_t> header(256, 0);
        header[0] = 20240520;
        header[1] = 1;
        header[2] = 200;
        std::vector<std::uint16_t> tokens(200);
        for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(k * 1000 + i);
        std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
        bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
        ft::write_text(dir / (name + ".bin"), bytes);
        llmc_domains += std::string(k ? ", " : "") + R"({"name": ")" + name + R"(", "data": ")" + name + R"(.bin"})";
        llmc_weights += std::string(k ? ", " : "") + "\"" + name + "\": " + std::to_string(1 + k % 5);
    }
    for (int k = 0; k < 12; ++k) {  // Megatron domains of two pairs each (a directory)
        const std::string name = "m" + std::to_string(k);
        std::filesystem::create_directories(dir / name);
        for (int part = 0; part < 2; ++part) {
            megatron_writer w(dir / (name + "/part_" + std::to_string(part)), token_dtype::uint16);
            for (std::uint32_t d = 0; d < 6; ++d)
                w.add_document(std::vector<std::uint32_t>(10 + 7 * d, static_cast<std::uint32_t>(k * 100 + part * 10 + d)));
            w.finish();
        }
        megatron_domains += std::string(k ? ", " : "") + R"({"name": ")" + name + R"(", "data": ")" + name + R"("})";
        megatron_weights += std::string(k ? ", " : "") + "\"" + name + "\": " + std::to_string(2 + k % 3);
    }
    ft::write_text(dir / "llmc.json",
                   R"({"domains": [)" + llmc_domains + R"(], "stages": [{"at_step": 0, "weights": {)" + llmc_weights + "}}]}");
    ft::write_text(dir / "megatron.json",
                   R"({"domains": [)" + megatron_domains + R"(], "stages": [{"at_step": 0, "weights": {)" + megatron_weights + "}}]}");

    detail::mapping_budget& budget = detail::mapping_budget::instance();
    struct restore_limit {
        std::uint64_t limit;
        ~restore_limit() { detail::mapping_budget::instance().set_limit(limit); }
    } restore{budget.limit()};
    // Every batch's inputs and targets, and the stats and the mappings held at the end.
    struct run_result {
        std::vector<std::int32_t> tokens;
        pipeline_stats stats;
        std::uint64_t held = 0;
    };
    const auto run = [&](const std::string& spec, sample_mode mode) {
        pipeline_config c{.batch_size = 8, .seq_len = 16, .seed = 5, .workers = 2, .device = device_kind::cpu, .max_steps = 40};
        c.mode = mode;
        c.shards.backend = io_backend::mmap;
        pipeline p(spec, c);
        run_result r;
        for (auto& b : p) {
            r.tokens.insert(r.tokens.end(), b.host_inputs().begin(), b.host_inputs().end());
            r.tokens.insert(r.tokens.end(), b.host_targets().begin(), b.host_targets().end());
        }
        r.stats = p.stats();
        r.held = budget.held();
        return r;
    };
    for (const auto& [spec_, mode_] : {std::pair{dir / "llmc.json", sample_mode::windows}, std::pair{dir / "megatron.json", sample_mode::windows},
                                       std::pair{dir / "megatron.json", sample_mode::packed}}) {
        const std::string spec = spec_;  // not the bindings themselves: CAPTURE's lambda cannot name them (clang)
        const sample_mode mode = mode_;
        CAPTURE(spec);
        CAPTURE(static_cast<int>(mode));
        budget.set_limit(restore.limit);
        const run_result mapped = run(spec, mode);
        REQUIRE(mapped.tokens.size() == 40u * 8 * 16 * 2);
        CHECK_FALSE(mapped.stats.unmapped_files.has_value());
        const std::uint64_t limit = budget.held() + 5;  // room for 5 of the run's files
        budget.set_limit(limit);
        const run_result limited = run(spec, mode);
        CHECK(limited.tokens == mapped.tokens);
        CHECK(limited.held <= limit);
        REQUIRE(limited.stats.unmapped_files.has_value());  // files refused a mapping, open while the run was
        CHECK(*limited.stats.unmapped_files > 0);
        CHECK(limited.stats.to_json().find("\"unmapped_files\"") != std::string::npos);
        CHECK(budget.unmapped() == 0);  // the pipeline's files closed with it
    }
}
