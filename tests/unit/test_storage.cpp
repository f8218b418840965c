// Storage backends: every backend returns the same bytes for the same requests, out-of-range requests
// fail with format_error naming the file, and backend selection records why it chose what it chose.
#include <doctest/doctest.h>

#include <feedline/detail/descriptor_limit.hpp>
#include <feedline/detail/prefetch.hpp>
#include <feedline/storage/fetch_ahead.hpp>
#include <feedline/storage/reader.hpp>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csetjmp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <thread>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// "f<i>". Appended rather than "f" + to_string(i), which draws a false -Wrestrict from GCC 12 at -O3.
std::string file_name(std::size_t i) {
    std::string name = "f";
    name += std::to_string(i);
    return name;
}

struct fixture {
    ft::scratch_dir dir;
    std::vector<std::vector<std::byte>> contents;
    std::vector<file> files;
    fixture() {
        // Sizes hit the awkward cases: empty, one byte, just under/over a page, not a multiple of 4096,
        // and larger than the io_uring chunk so requests are split.
        for (std::uint64_t size : {0ull, 1ull, 4095ull, 4097ull, 3ull * 1024 * 1024 + 123}) {
            auto bytes = ft::patterned_bytes(size, contents.size() + 1);
            std::string path = dir / file_name(contents.size());
            ft::write_bytes(path, bytes.data(), bytes.size());
            contents.push_back(std::move(bytes));
        }
        for (std::size_t i = 0; i < contents.size(); ++i) files.emplace_back(dir / file_name(i));
    }

    // Random requests over all files, including zero-length ones and ones ending exactly at EOF.
    std::vector<read_request> random_requests(std::mt19937_64& rng, std::vector<std::byte>& buffer, std::size_t n) {
        std::vector<std::pair<std::size_t, std::pair<std::uint64_t, std::uint64_t>>> spec;
        std::uint64_t total = 0;
        for (std::size_t i = 0; i < n; ++i) {
            std::size_t f = rng() % files.size();
            std::uint64_t size = files[f].size();
            std::uint64_t off = size ? rng() % (size + 1) : 0;
            std::uint64_t len = size - off;
            switch (rng() % 4) {
                case 0: len = std::min<std::uint64_t>(len, rng() % 64); break;
                case 1: len = std::min<std::uint64_t>(len, rng() % 8192); break;
                case 2: break;  // to the end of the file
                default: len = std::min<std::uint64_t>(len, rng() % (2 << 20)); break;
            }
            spec.push_back({f, {off, len}});
            total += len + 3;  // odd gaps: destinations are deliberately unaligned
        }
        buffer.assign(total, std::byte{0});
        std::vector<read_request> reqs;
        std::uint64_t at = 0;
        for (auto& [f, r] : spec) {
            reqs.push_back({&files[f], r.first, r.second, buffer.data() + at});
            at += r.second + 3;  // matches the gap above
        }
        return reqs;
    }

    void check(const std::vector<read_request>& reqs) {
        for (const auto& r : reqs) {
            std::size_t f = static_cast<std::size_t>(r.source->local_file() - files.data());
            REQUIRE(std::equal(r.dest, r.dest + r.length, contents[f].begin() + static_cast<std::ptrdiff_t>(r.offset)));
        }
    }
};

template <class Reader>
void random_agreement(Reader& reader, std::uint64_t seed) {
    fixture fx;
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 20; ++round) {
        std::vector<std::byte> buffer;
        auto reqs = fx.random_requests(rng, buffer, 1 + rng() % 40);
        reader.read(reqs);
        fx.check(reqs);
    }
}

}  // namespace

// The prefetch the lookahead chains use is an instruction, not a load: a wasted or stale hint (a
// pointer into a page unmapped meanwhile, one without access, null) costs nothing and never faults.
TEST_CASE("Storage.Prefetch.AHintAtAnyAddressNeverFaults") {
    const long page = ::sysconf(_SC_PAGESIZE);
    void* gone = ::mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* locked = ::mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(gone != MAP_FAILED);
    REQUIRE(locked != MAP_FAILED);
    REQUIRE(::munmap(gone, page) == 0);
    int hits = 0;
    for (const void* p : {static_cast<const void*>(nullptr), static_cast<const void*>(gone), static_cast<const void*>(locked),
                          static_cast<const void*>(&hits)}) {
        detail::prefetch(p);
        ++hits;
    }
    CHECK(hits == 4);
    ::munmap(locked, page);
}

TEST_CASE("Storage.Pread.RandomRequestsReturnFileBytes") {
    pread_reader r;
    random_agreement(r, 1);
}

TEST_CASE("Storage.Mmap.RandomRequestsReturnFileBytes") {
    mmap_reader r(access_pattern::random);
    random_agreement(r, 2);
    mmap_reader s(access_pattern::sequential);
    random_agreement(s, 3);
}

#if FEEDLINE_HAS_URING
TEST_CASE("Storage.Uring.RandomRequestsReturnFileBytes") {
    if (auto why = io_uring_unavailable_reason()) ft::skip(*why);
    for (unsigned depth : {1u, 2u, 32u}) {  // depth 1 and 2: the ring is full all the time
        uring_reader r(uring_options{.queue_depth = depth, .max_chunk = 64 * 1024});
        random_agreement(r, 10 + depth);
    }
}

TEST_CASE("Storage.Uring.DirectIoHandlesUnalignedRanges") {
    if (auto why = io_uring_unavailable_reason()) ft::skip(*why);
    for (bool registered : {false, true}) {
        uring_reader r(uring_options{.queue_depth = 8, .max_chunk = 64 * 1024, .direct = true, .register_buffers = registered});
        random_agreement(r, 20 + registered);
    }
}

TEST_CASE("Storage.Uring.DirectIoAlignedRequestsReadInPlace") {
    if (auto why = io_uring_unavailable_reason()) ft::skip(*why);
    fixture fx;
    const file& big = fx.files.back();
    void* mem = nullptr;
    REQUIRE(::posix_memalign(&mem, 4096, 1 << 20) == 0);
    std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(mem), &std::free);
    uring_reader r(uring_options{.queue_depth = 4, .direct = true});
    read_request req{&big, 8192, 1 << 20, buf.get()};
    r.read(std::span(&req, 1));
    fx.check({req});
}
#endif

TEST_CASE("Storage.AllBackends.AgreeByteForByte") {
    fixture fx;
    std::vector<any_reader> readers;
    readers.push_back(make_reader({.backend = io_backend::pread}));
    readers.push_back(make_reader({.backend = io_backend::mmap}));
    if (!io_uring_unavailable_reason()) {
        readers.push_back(make_reader({.backend = io_backend::io_uring}));
        readers.push_back(make_reader({.backend = io_backend::io_uring, .direct = true}));
    }
    std::mt19937_64 rng(99);
    for (int round = 0; round < 10; ++round) {
        std::vector<std::byte> first;
        auto reqs = fx.random_requests(rng, first, 30);
        readers[0].read(reqs);
        for (std::size_t k = 1; k < readers.size(); ++k) {
            std::vector<std::byte> other(first.size(), std::byte{0});
            auto moved = reqs;
            for (auto& r : moved) r.dest = other.data() + (r.dest - first.data());
            readers[k].read(moved);
            for (std::size_t i = 0; i < reqs.size(); ++i)
                REQUIRE_MESSAGE(std::equal(reqs[i].dest, reqs[i].dest + reqs[i].length, moved[i].dest), readers[k].name());
        }
    }
}

// Past 16 files an mmap reader finds a file's mapping by hashing instead of a scan (a mixture's
// thousands of shards): reads and views in random order across 40 files, before and after the switch,
// return each file's own bytes.
TEST_CASE("Storage.Mmap.ManyFilesInRandomOrderEachReadFromItsOwnMapping") {
    ft::scratch_dir dir;
    std::vector<std::vector<std::byte>> contents;
    std::vector<file> files;
    for (std::size_t i = 0; i < 40; ++i) {
        contents.push_back(ft::patterned_bytes(1000 + 37 * i, i + 1));
        ft::write_bytes(dir / ft::numbered("f", i), contents.back().data(), contents.back().size());
    }
    for (std::size_t i = 0; i < 40; ++i) files.emplace_back(dir / ft::numbered("f", i));
    mmap_reader reader;
    std::mt19937_64 rng(5);
    for (int round = 0; round < 400; ++round) {
        const std::size_t f = round < 40 ? static_cast<std::size_t>(round) * 7 % 40 : rng() % 40;  // every file by round 40
        const std::uint64_t size = contents[f].size(), off = rng() % size, len = rng() % (size - off) + 1;
        std::vector<std::byte> got(len);
        read_request r{&files[f], off, len, got.data()};
        reader.read(std::span(&r, 1));
        REQUIRE(std::equal(got.begin(), got.end(), contents[f].begin() + static_cast<std::ptrdiff_t>(off)));
        const auto v = reader.view(files[f], off, len);
        REQUIRE(std::equal(v.begin(), v.end(), contents[f].begin() + static_cast<std::ptrdiff_t>(off)));
    }
}

// The descriptor pool: with more files than the soft RLIMIT_NOFILE allows open (lowered to 64 here),
// every backend still reads every file's own bytes, many times over in random order, while the files
// never hold more descriptors than the pool's budget; a file whose descriptor was closed and that was
// replaced (renamed over) or truncated since is an io_error naming it when used again, never the new
// file's bytes.
TEST_CASE("Storage.DescriptorPool.MoreFilesThanTheLimitAreReadWithinItAndAReplacedOneIsRefused") {
    rlimit saved{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 64) ft::skip("the hard descriptor limit is below 64 here");
    ft::scratch_dir dir;
    const std::size_t n = 150;
    std::vector<std::vector<std::byte>> contents;
    for (std::size_t i = 0; i < n; ++i) {
        contents.push_back(ft::patterned_bytes(3000 + 101 * i, i + 7));
        ft::write_bytes(dir / file_name(i), contents.back().data(), contents.back().size());
    }
    rlimit low = saved;
    low.rlim_cur = 64;
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    struct restore_limit {
        rlimit lim;
        ~restore_limit() { (void)::setrlimit(RLIMIT_NOFILE, &lim); }
    } restore{saved};
    auto& pool = detail::descriptor_pool::instance();
    const std::size_t budget = detail::descriptor_pool::budget();
    CHECK(budget == 48);  // 64 less a quarter for the process's others
    const std::size_t before = pool.open_count();
    const std::uint64_t fds_before = detail::open_descriptors();
    {
        std::vector<file> files;
        for (std::size_t i = 0; i < n; ++i) files.emplace_back(dir / file_name(i));  // past the limit: opens close idle ones
        CHECK(pool.open_count() <= budget);
        std::vector<any_reader> readers;
        readers.push_back(make_reader({.backend = io_backend::pread}));
        readers.push_back(make_reader({.backend = io_backend::mmap}));
        if (!io_uring_unavailable_reason()) readers.push_back(make_reader({.backend = io_backend::io_uring}));
        std::mt19937_64 rng(11);
        for (int round = 0; round < 60; ++round) {
            std::vector<std::vector<std::byte>> got(40);
            std::vector<read_request> reqs;
            std::vector<std::size_t> which;
            for (auto& g : got) {
                const std::size_t f = rng() % n;
                const std::uint64_t size = contents[f].size(), off = rng() % size, len = rng() % (size - off) + 1;
                g.resize(len);
                reqs.push_back({&files[f], off, len, g.data()});
                which.push_back(f);
            }
            readers[static_cast<std::size_t>(round) % readers.size()].read(reqs);
            for (std::size_t k = 0; k < reqs.size(); ++k)
                REQUIRE(std::equal(got[k].begin(), got[k].end(), contents[which[k]].begin() + static_cast<std::ptrdiff_t>(reqs[k].offset)));
            REQUIRE(pool.open_count() <= budget);
            REQUIRE(detail::open_descriptors() <= fds_before + budget + 8);  // the io_uring ring's own, and the listing's
        }
        // One read naming every file, more than the budget: io_uring leases them a run at a time.
        {
            std::vector<std::vector<std::byte>> got(n);
            std::vector<read_request> reqs;
            for (std::size_t f = 0; f < n; ++f) {
                got[f].resize(contents[f].size());
                reqs.push_back({&files[(f * 7) % n], 0, contents[(f * 7) % n].size(), nullptr});
                got[f].resize(reqs.back().length);
                reqs.back().dest = got[f].data();
            }
            for (auto& reader : readers) {
                reader.read(reqs);
                for (std::size_t f = 0; f < n; ++f) REQUIRE(std::equal(got[f].begin(), got[f].end(), contents[(f * 7) % n].begin()));
                REQUIRE(pool.open_count() <= budget);
            }
        }
        // Files used since, until the clock has closed the descriptors of files 3 and 4.
        for (int sweep = 0; sweep < 10 && (files[3].holds_descriptor() || files[4].holds_descriptor()); ++sweep)
            for (std::size_t i = 60; i < n; ++i) (void)files[i].version();
        REQUIRE_FALSE(files[3].holds_descriptor());
        REQUIRE_FALSE(files[4].holds_descriptor());
        const std::string replaced = dir / file_name(3), truncated = dir / file_name(4);
        ft::write_bytes(dir / "new", contents[9].data(), contents[3].size());
        REQUIRE(::rename((dir / "new").c_str(), replaced.c_str()) == 0);
        REQUIRE(::truncate(truncated.c_str(), 100) == 0);
        std::vector<std::byte> buf(50);
        for (auto& reader : readers) {
            for (const std::size_t f : {std::size_t{3}, std::size_t{4}}) {
                read_request r{&files[f], 0, 50, buf.data()};
                try {
                    reader.read(std::span(&r, 1));
                    // Only a mapping made before (it holds the file as opened) may still be read: its own bytes.
                    CHECK_MESSAGE(reader.name() == "mmap", reader.name(), " read file ", f, " after it was replaced or cut");
                    CHECK(std::equal(buf.begin(), buf.end(), contents[f].begin()));
                } catch (const io_error& e) {
                    CHECK(std::string(e.what()).find(f == 3 ? replaced : truncated) != std::string::npos);
                    CHECK(std::string(e.what()).find(f == 3 ? "replaced" : "shorter") != std::string::npos);
                }
            }
        }
        // A new mapping of the replaced file is refused the same way, and gives back its place in the
        // process's mapping budget (detail/mapping_budget.hpp).
        const std::uint64_t mappings_held = detail::mapping_budget::instance().held();
        CHECK_THROWS_AS(file_mapping{files[3]}, io_error);
        CHECK(detail::mapping_budget::instance().held() == mappings_held);
        // The file that was not replaced reads its own bytes again.
        read_request r{&files[5], 0, 50, buf.data()};
        readers[0].read(std::span(&r, 1));
        CHECK(std::equal(buf.begin(), buf.end(), contents[5].begin()));
    }
    CHECK(pool.open_count() == before);
    CHECK(detail::open_descriptors() <= fds_before);
}

TEST_CASE("Storage.AllBackends.RangePastEndOfFileIsFormatError") {
    fixture fx;
    const file& f = fx.files[3];  // 4097 bytes
    std::vector<std::byte> buf(8192);
    std::vector<io_backend> backends = {io_backend::pread, io_backend::mmap};
    if (!io_uring_unavailable_reason()) backends.push_back(io_backend::io_uring);
    for (auto b : backends) {
        auto r = make_reader({.backend = b});
        read_request bad{&f, 4000, 200, buf.data()};
        try {
            r.read(std::span(&bad, 1));
            FAIL("no exception from " << r.name());
        } catch (const format_error& e) {
            CHECK(e.file() == f.path());
            CHECK(e.offset() == 4000);
            CHECK(std::string(e.what()).find("past the end") != std::string::npos);
        }
    }
}

TEST_CASE("Storage.File.MissingFileIsIoErrorNamingThePath") {
    ft::scratch_dir dir;
    try {
        file f(dir / "does-not-exist.bin");
        FAIL("opened a missing file");
    } catch (const io_error& e) {
        CHECK(e.error_code() == ENOENT);
        CHECK(std::string(e.what()).find("does-not-exist.bin") != std::string::npos);
    }
}

TEST_CASE("Storage.Selection.AutoPrefersUringAndSaysWhy") {
    auto r = make_reader();
    if (auto why = io_uring_unavailable_reason()) {
        CHECK(r.backend() == io_backend::mmap);
        CHECK(r.reason().find(*why) != std::string::npos);
    } else {
        CHECK(r.backend() == io_backend::io_uring);
        CHECK(r.reason() == "io_uring: available");
    }
    // A dataset that fits in the page cache is read through mmap, whatever io_uring can do.
    auto small = make_reader({.dataset_bytes = 1 << 20});
    CHECK(small.backend() == io_backend::mmap);
    CHECK(small.reason().find("fits in the page cache") != std::string::npos);
    auto d = make_reader({.direct = true, .dataset_bytes = 1 << 20});
    CHECK(d.backend() != io_backend::mmap);  // mmap cannot bypass the page cache
    CHECK(parse_enum<io_backend>("uring", "io_backend") == io_backend::io_uring);
    CHECK_THROWS_AS(parse_enum<io_backend>("nfs", "io_backend"), config_error);
}

TEST_CASE("Storage.Mmap.PrefetchAndViewSeeTheSameBytes") {
    fixture fx;
    mmap_reader r(access_pattern::random);
    const file& f = fx.files.back();
    std::vector<read_request> reqs = {{&f, 100, 5000, nullptr}, {&f, f.size() - 10, 10, nullptr}};
    r.prefetch(reqs);
    auto v = r.view(f, 100, 5000);
    CHECK(std::equal(v.begin(), v.end(), fx.contents.back().begin() + 100));
    CHECK_THROWS_AS(r.view(f, f.size() - 1, 2), format_error);
}

namespace {
// The VmFlags line of /proc/self/smaps for the mapping that holds `p` ("rd mr mw me rr ..."): the
// kernel's own record of the last madvise readahead hint (rr random, sr sequential).
std::string vm_flags_at(const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
        std::uintptr_t from = 0, to = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &from, &to) == 2 && line.find('-') < line.find(' ')) inside = from <= at && at < to;
        if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return {};
}
bool has_flag(const std::string& flags, const std::string& flag) { return (flags + " ").find(" " + flag + " ") != std::string::npos; }
}  // namespace

// Every mmap reader uses the file's one mapping, found without a table of its own (a mixture's
// thousands of files cost a worker's reader nothing per file): two readers see the same bytes at the
// same address, a view stays good after its reader is gone while the file lives, and the readahead
// hint is the latest reader's pattern, as the kernel records it.
TEST_CASE("Storage.Mmap.ReadersShareTheFilesOneMappingAndTheLatestPatternSteersReadahead") {
    fixture fx;
    const file& f = fx.files.back();
    std::span<const std::byte> kept;
    {
        mmap_reader random(access_pattern::random), again(access_pattern::random);
        kept = random.view(f, 10, 1000);
        CHECK(again.view(f, 10, 1000).data() == kept.data());
        const std::string flags = vm_flags_at(kept.data());
        if (flags.empty()) {
            std::ifstream smaps("/proc/self/smaps");
            const std::string all((std::istreambuf_iterator<char>(smaps)), std::istreambuf_iterator<char>());
            if (all.find("VmFlags:") == std::string::npos) ft::skip("this kernel's /proc/self/smaps has no VmFlags");
        }
        REQUIRE_MESSAGE(!flags.empty(), "no mapping in /proc/self/smaps holds the view");
        CHECK(has_flag(flags, "rr"));
        CHECK_FALSE(has_flag(flags, "sr"));
        mmap_reader sequential(access_pattern::sequential);
        std::vector<std::byte> out(100);
        sequential.read(std::vector<read_request>{{&f, 50, 100, out.data()}});
        CHECK(std::equal(out.begin(), out.end(), fx.contents.back().begin() + 50));
        CHECK(has_flag(vm_flags_at(kept.data()), "sr"));
        CHECK_FALSE(has_flag(vm_flags_at(kept.data()), "rr"));
        mmap_reader random_again(access_pattern::random);
        (void)random_again.view(f, 0, 1);
        CHECK(has_flag(vm_flags_at(kept.data()), "rr"));
    }
    CHECK(std::equal(kept.begin(), kept.end(), fx.contents.back().begin() + 10));  // the readers are gone, the file is not
    CHECK(f.mapping_if_made() != nullptr);
    CHECK(f.mapping_if_made()->bytes().data() + 10 == kept.data());
}

TEST_CASE("Storage.Mmap.AFileTruncatedWhileMappedIsAFormatErrorNotASigbus") {
    ft::scratch_dir dir;
    const std::string path = dir / "shrinks.bin";
    auto bytes = ft::patterned_bytes(64 * 1024, 7);
    ft::write_bytes(path, bytes.data(), bytes.size());
    file f(path);
    mmap_reader r;
    std::vector<std::byte> out(100);
    r.read(std::vector<read_request>{{&f, 0, 100, out.data()}});  // maps the whole file
    REQUIRE(::truncate(path.c_str(), 4096) == 0);                 // another process shrinks it
    for (int attempt = 0; attempt < 2; ++attempt) {               // a second fault is caught too
        try {
            r.read(std::vector<read_request>{{&f, 32768, 100, out.data()}});
            FAIL("read a page past the new end of the file");
        } catch (const format_error& e) {
            CHECK(e.file() == path);
            CHECK(e.offset() == 32768);
            CHECK(std::string(e.what()).find("now 4096 bytes") != std::string::npos);
        }
    }
    r.read(std::vector<read_request>{{&f, 100, 100, out.data()}});  // what is left still reads
    CHECK(std::equal(out.begin(), out.end(), bytes.begin() + 100));
}

namespace {

// The SIGBUS contract with applications, checked in child processes (a handler is process-wide).
sigjmp_buf app_env;
volatile sig_atomic_t app_owns_fault = 0;
volatile sig_atomic_t app_saw_fault = 0;
struct sigaction app_previous {};

void app_handler(int sig, siginfo_t* info, void* ctx) {
    if (app_owns_fault != 0) {
        app_saw_fault = 1;
        siglongjmp(app_env, 1);
    }
    app_previous.sa_sigaction(sig, info, ctx);  // a well-behaved handler chains to the one before it
}

// A 3-page file mapped, then cut to one page: the last page faults.
const std::byte* map_then_truncate(const std::string& path) {
    auto bytes = ft::patterned_bytes(3 * 4096, 3);
    ft::write_bytes(path, bytes.data(), bytes.size());
    file f(path);
    void* p = ::mmap(nullptr, 3 * 4096, PROT_READ, MAP_SHARED, f.use().fd(), 0);
    if (p == MAP_FAILED || ::truncate(path.c_str(), 4096) != 0) ::_exit(10);
    return static_cast<const std::byte*>(p);
}

template <class F>
int in_child(F&& body) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(body());
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
}

}  // namespace

TEST_CASE("Storage.Sigbus.ApplicationHandlersAreChainedAndKept") {
    ft::scratch_dir dir;
    SUBCASE("a handler installed after feedline's that chains keeps both working") {
        const int status = in_child([&] {
            const std::byte* m = map_then_truncate(dir / "a.bin");
            std::byte b[16];
            if (!detail::guarded_copy(b, m, 16)) return 11;  // installs feedline's handler
            struct sigaction act {};
            act.sa_sigaction = &app_handler;
            act.sa_flags = SA_SIGINFO | SA_NODEFER;
            sigemptyset(&act.sa_mask);
            ::sigaction(SIGBUS, &act, &app_previous);
            if (detail::guarded_copy(b, m + 2 * 4096, 16)) return 12;  // app handler -> feedline's -> recovered
            app_owns_fault = 1;
            if (sigsetjmp(app_env, 1) == 0) (void)*static_cast<const volatile std::byte*>(m + 2 * 4096);
            return app_saw_fault == 1 ? 0 : 13;  // the application's own fault reached its handler
        });
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
    }
    SUBCASE("a fault outside feedline's copies keeps its default meaning") {
        const int status = in_child([&] {
            const std::byte* m = map_then_truncate(dir / "b.bin");
            std::byte b[16];
            if (!detail::guarded_copy(b, m, 16)) return 11;
            if (detail::guarded_copy(b, m + 2 * 4096, 16)) return 12;
            (void)*static_cast<const volatile std::byte*>(m + 2 * 4096);  // not guarded: must not be swallowed
            return 0;
        });
        CHECK_FALSE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
        // Without a sanitizer the default action kills with SIGBUS; ASan's handler, the one installed
        // before feedline's, reports the fault and aborts.
        if (WIFSIGNALED(status)) CHECK((WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT));
    }
}

namespace {

// Bytes in memory that are not a local file (as a remote object is not), whose reads can be held at a
// gate and made to fail, and which counts the bytes it served.
class gated_source final : public byte_source {
public:
    explicit gated_source(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
    const std::string& name() const noexcept override { return name_; }
    std::uint64_t size() const noexcept override { return bytes_.size(); }
    std::string version() const override { return "1"; }
    void read_at(void* dest, std::uint64_t length, std::uint64_t offset) const override {
        std::unique_lock lock(mutex_);
        ++waiting_;
        changed_.notify_all();
        changed_.wait(lock, [&] { return open_; });
        --waiting_;
        if (fail_) throw io_error(name_, EIO, "the gate failed this read");
        std::memcpy(dest, bytes_.data() + offset, length);
        served_ += length;
    }
    void open(bool fail = false) {
        std::lock_guard lock(mutex_);
        open_ = true;
        fail_ = fail;
        changed_.notify_all();
    }
    void close() {
        std::lock_guard lock(mutex_);
        open_ = false;
        fail_ = false;
    }
    void wait_for_readers(int n) const {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return waiting_ >= n; });
    }
    std::uint64_t served() const {
        std::lock_guard lock(mutex_);
        return served_;
    }

private:
    std::string name_ = "gated://object";
    std::vector<std::byte> bytes_;
    mutable std::mutex mutex_;
    mutable std::condition_variable changed_;
    mutable int waiting_ = 0;
    mutable std::uint64_t served_ = 0;
    bool open_ = false, fail_ = false;
};

}  // namespace

TEST_CASE("Storage.FetchAhead.WorkersTakeWhatWasFetchedWaitForWhatIsInFlightAndReadTheRest") {
    const auto bytes = ft::patterned_bytes(1 << 16, 7);
    gated_source src(bytes);
    fetch_ahead store(1 << 12);
    // Step 5's two ranges fetched ahead: in flight until the gate opens.
    const std::vector<fetch_ahead::planned> ranges{{5, {&src, 100, 300, nullptr}}, {5, {&src, 1000, 200, nullptr}}};
    CHECK(store.room() == 4096);
    std::thread fetcher([&] { store.fetch(ranges); });
    src.wait_for_readers(1);
    CHECK(store.room() == 4096 - 500);  // reserved while in flight
    // A worker asks for one of them, one range nobody fetched, and waits for the one in flight.
    std::vector<std::byte> a(300), b(64);
    const std::vector<read_request> asked{{&src, 100, 300, a.data()}, {&src, 5000, 64, b.data()}};
    std::vector<read_request> rest;
    std::atomic<bool> taken{false};
    std::thread worker([&] {
        const detail::scoped_fetch_ahead scope(&store);
        store.take(asked, rest);
        taken = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(taken.load());  // waiting for the fetch, not requesting the range again
    src.open();
    fetcher.join();
    worker.join();
    CHECK(std::equal(a.begin(), a.end(), bytes.begin() + 100));
    REQUIRE(rest.size() == 1);  // the range not fetched ahead is left to the worker's own read
    CHECK(rest[0].offset == 5000);
    CHECK(src.served() == 500);  // each range read once
    // Step 5 is written: the range it did not take is dropped and counted as unused.
    store.step_done(5);
    const fetch_ahead_counts n = store.counts();
    CHECK(n.taken_ranges == 1);
    CHECK(n.taken_bytes == 300);
    CHECK(n.fetched_bytes == 500);
    CHECK(n.unused_bytes == 200);
    CHECK(store.room() == 4096);
}

TEST_CASE("Storage.FetchAhead.AFailedFetchIsLeftToTheWorkersOwnReadWhichReportsIt") {
    const auto bytes = ft::patterned_bytes(1 << 12, 3);
    gated_source src(bytes);
    fetch_ahead store(1 << 12);
    const std::vector<fetch_ahead::planned> ranges{{0, {&src, 0, 128, nullptr}}};
    std::thread fetcher([&] { store.fetch(ranges); });
    src.wait_for_readers(1);
    src.open(/*fail=*/true);
    fetcher.join();  // the fetch ahead swallows its error ...
    CHECK(store.room() == 4096);
    std::vector<std::byte> a(128);
    const std::vector<read_request> asked{{&src, 0, 128, a.data()}};
    const detail::scoped_fetch_ahead scope(&store);
    // ... and the worker reads the range itself, so the error reaches it, naming the object.
    try {
        detail::read_remote(asked);
        FAIL("a failing read was not reported");
    } catch (const io_error& e) {
        CHECK(e.file() == "gated://object");
    }
    src.close();
    src.open();
    detail::read_remote(asked);
    CHECK(std::equal(a.begin(), a.end(), bytes.begin()));
    CHECK(store.counts().taken_ranges == 0);
}

TEST_CASE("Storage.FetchAhead.RangesOfStepsAlreadyTakenAreNotKeptAndDroppedOnesFreeTheirBytes") {
    gated_source src(ft::patterned_bytes(1 << 12, 5));
    std::atomic<std::uint64_t> unclaimed{3};  // workers have taken steps 0, 1 and 2
    fetch_ahead store(1000, [&] { return unclaimed.load(); });
    src.open();
    // Step 2's range arrives after its worker may have written it: not kept (nobody would drop it).
    store.fetch(std::vector<fetch_ahead::planned>{{2, {&src, 0, 100, nullptr}}, {3, {&src, 100, 700, nullptr}}});
    CHECK(src.served() == 700);
    CHECK(store.room() == 300);
    // Step 3 is written without taking its range: dropped, counted as unused, its bytes free again.
    store.step_done(3);
    CHECK(store.room() == 1000);
    CHECK(store.counts().unused_bytes == 700);
    CHECK(store.counts().taken_ranges == 0);
}
