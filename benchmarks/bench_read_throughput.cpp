// bench_read_throughput: how fast does each storage backend deliver training windows, warm and cold?
//
// Question: reading random 1025-token windows (what a GPT sampler asks for) and sequential 1 MiB scans
// from a multi-GB llm.c shard set, how close does each backend come to the best the machine can do?
// Baselines, measured in the same run:
//   warm random windows / warm scans -> a plain memcpy of the same bytes out of the resident mapping
//   cold scans                       -> a bare io_uring O_DIRECT loop, 32 x 1 MiB reads in flight
//   cold random windows              -> O_DIRECT pread, one window at a time (queue depth 1)
// Cases are interleaved (A B A B ...) and repeated; medians are reported with min-max spread.
// Last line: one JSON object with the ratios.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <feedline/pipeline.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

// GB/s for `bytes` moved since t0.
double gb_per_s(double bytes, clock_type::time_point t0) {
    return bytes / std::chrono::duration<double>(clock_type::now() - t0).count() / 1e9;
}
constexpr std::uint64_t window_tokens = 1025;
constexpr std::uint64_t window_bytes = window_tokens * 2;
constexpr std::uint64_t batch_windows = 32;

struct args {
    std::string dir = "bench-data";
    double gib = 2.0;
    int repeats = 5;
};

args parse(int argc, char** argv) {
    args a;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        auto value = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (s == "--dir")
            a.dir = value();
        else if (s == "--gib")
            a.gib = std::stod(value());
        else if (s == "--repeats")
            a.repeats = std::stoi(value());
        else {
            std::printf("usage: bench_read_throughput [--dir DIR] [--gib SIZE] [--repeats N]   (the data is generated once and reused)\n");
            std::exit(s == "--help" ? 0 : 2);
        }
    }
    return a;
}

// Writes ~gib GiB of uint16 tokens as 4 llm.c shards (documents of 100k tokens), unless present.
std::vector<std::string> make_shards(const args& a) {
    std::filesystem::create_directories(a.dir);
    std::string prefix = a.dir + "/bench_train";
    const auto total_tokens = static_cast<std::uint64_t>(a.gib * (1ull << 30) / 2);
    const std::uint64_t shard_tokens = total_tokens / 4;
    if (std::filesystem::exists(feedline::llmc_writer::shard_path(prefix, 3))) {
        feedline::token_dataset existing(prefix + "_*.bin");
        if (existing.total_tokens() >= total_tokens - 4) return {prefix + "_*.bin"};
    }
    std::printf("generating %.1f GiB of shards in %s ...\n", a.gib, a.dir.c_str());
    feedline::llmc_writer w(prefix, feedline::token_dtype::uint16, 50256, shard_tokens);
    std::vector<std::uint16_t> doc(100'000 - 1);
    std::uint64_t written = 0, x = 12345;
    while (written + doc.size() + 1 <= shard_tokens * 4) {
        for (auto& t : doc) t = static_cast<std::uint16_t>((x = x * 6364136223846793005ull + 1) >> 49);
        w.add_document(doc);
        written += doc.size() + 1;
    }
    w.finish();
    return {prefix + "_*.bin"};
}

// Fraction of the file's pages resident in the page cache (mincore).
double residency(const feedline::file& f) {
    if (f.size() == 0) return 1.0;
    void* p = ::mmap(nullptr, f.size(), PROT_READ, MAP_SHARED, f.use().fd(), 0);
    std::vector<unsigned char> vec((f.size() + 4095) / 4096);
    ::mincore(p, f.size(), vec.data());
    ::munmap(p, f.size());
    return static_cast<double>(std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return c & 1; })) /
           static_cast<double>(vec.size());
}

void warm(const feedline::token_dataset& ds) {
    std::vector<char> buf(8 << 20);
    for (std::size_t s = 0; s < ds.shard_count(); ++s) {
        const auto held = ds.shard(s).bin->local_file()->use();
        const int fd = held.fd();
        for (off_t off = 0; ::pread(fd, buf.data(), buf.size(), off) > 0; off += static_cast<off_t>(buf.size())) {
        }
    }
}

struct stats {
    double median, lo, hi;
};
stats summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

// Random window positions in the concatenated token stream (fixed per run so every case reads the
// same bytes).
std::vector<std::uint64_t> window_starts(const feedline::token_dataset& ds, std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::uint64_t> v(n);
    for (auto& s : v) s = rng() % (ds.total_tokens() - window_tokens);
    return v;
}

void window_requests(const feedline::token_dataset& ds, const std::vector<std::uint64_t>& starts, std::size_t first, std::size_t n,
                     std::byte* dest, std::vector<feedline::read_request>& out) {
    out.clear();
    for (std::size_t i = 0; i < n; ++i) ds.append_stream_requests(0, starts[first + i], window_tokens, dest + i * window_bytes, out);
}

// An aligned buffer, allocated and touched once (first touch is slow here; never time it).
struct aligned_buffer {
    std::byte* p;
    std::size_t n;
    explicit aligned_buffer(std::size_t bytes) : n(bytes) {
        void* m = nullptr;
        if (::posix_memalign(&m, 4096, bytes) != 0) std::abort();
        p = static_cast<std::byte*>(m);
        std::memset(p, 1, bytes);
    }
    ~aligned_buffer() { std::free(p); }
};

// Bare io_uring O_DIRECT sequential read: qd reads of `chunk` bytes in flight, no bookkeeping beyond
// the minimum. The ceiling for cold scans.
double raw_uring_direct_scan(const std::vector<std::string>& paths, unsigned qd, std::size_t chunk, aligned_buffer& buf) {
    io_uring ring;
    io_uring_queue_init(qd, &ring, 0);
    std::uint64_t bytes = 0;
    auto t0 = clock_type::now();
    for (const auto& path : paths) {
        int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
        off_t size = ::lseek(fd, 0, SEEK_END);
        off_t next = 0;
        unsigned inflight = 0;
        while (next < size || inflight > 0) {
            while (inflight < qd && next < size) {
                io_uring_sqe* sqe = io_uring_get_sqe(&ring);
                io_uring_prep_read(sqe, fd, buf.p + (static_cast<std::size_t>(next / static_cast<off_t>(chunk)) % qd) * chunk,
                                   static_cast<unsigned>(chunk), static_cast<std::uint64_t>(next));
                next += static_cast<off_t>(chunk);
                ++inflight;
            }
            io_uring_submit_and_wait(&ring, 1);
            io_uring_cqe* cqe;
            unsigned head, seen = 0;
            io_uring_for_each_cqe(&ring, head, cqe) {
                if (cqe->res > 0) bytes += static_cast<std::uint64_t>(cqe->res);
                ++seen;
            }
            io_uring_cq_advance(&ring, seen);
            inflight -= seen;
        }
        ::close(fd);
    }
    double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    io_uring_queue_exit(&ring);
    return static_cast<double>(bytes) / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
    args a = parse(argc, argv);
    auto spec = make_shards(a);
    feedline::token_dataset ds(spec);
    std::vector<std::string> paths;
    for (std::size_t s = 0; s < ds.shard_count(); ++s) paths.push_back(ds.shard_path(s));
    const std::uint64_t total_bytes = ds.total_tokens() * 2;
    std::printf("data: %zu llm.c shards, %.2f GiB, windows of %llu tokens, batches of %llu windows\n", ds.shard_count(),
                static_cast<double>(total_bytes) / (1ull << 30), static_cast<unsigned long long>(window_tokens),
                static_cast<unsigned long long>(batch_windows));
    const bool uring_ok = !feedline::io_uring_unavailable_reason();

    aligned_buffer batch(batch_windows * window_bytes + 4096);
    aligned_buffer big(64ull << 20);
    std::map<std::string, std::vector<double>> gbps;

    // ---- warm random windows ----
    const std::size_t warm_windows = 200'000;
    auto starts = window_starts(ds, warm_windows, 1);
    std::vector<feedline::file_mapping> maps;
    for (std::size_t s = 0; s < ds.shard_count(); ++s) maps.emplace_back(*ds.shard(s).bin->local_file(), feedline::access_pattern::random);
    auto memcpy_windows = [&] {
        // The baseline: memcpy straight out of the resident mapping, same windows, same destinations.
        auto t0 = clock_type::now();
        std::vector<feedline::read_request> reqs;
        for (std::size_t b = 0; b + batch_windows <= warm_windows; b += batch_windows) {
            window_requests(ds, starts, b, batch_windows, batch.p, reqs);
            for (auto& r : reqs) {
                std::size_t shard = 0;
                while (ds.shard(shard).bin != r.source) ++shard;
                std::memcpy(r.dest, maps[shard].bytes().data() + r.offset, r.length);
            }
        }
        return gb_per_s(static_cast<double>(warm_windows * window_bytes), t0);
    };
    auto reader_windows = [&](feedline::any_reader& reader) {
        auto t0 = clock_type::now();
        std::vector<feedline::read_request> reqs;
        for (std::size_t b = 0; b + batch_windows <= warm_windows; b += batch_windows) {
            window_requests(ds, starts, b, batch_windows, batch.p, reqs);
            reader.read(reqs);
        }
        return gb_per_s(static_cast<double>(warm_windows * window_bytes), t0);
    };
    std::vector<std::pair<std::string, feedline::any_reader>> readers;
    readers.emplace_back("mmap", feedline::make_reader({.backend = feedline::io_backend::mmap}));
    readers.emplace_back("pread", feedline::make_reader({.backend = feedline::io_backend::pread}));
    if (uring_ok) readers.emplace_back("io_uring", feedline::make_reader({.backend = feedline::io_backend::io_uring}));

    warm(ds);
    double resident = 0;
    for (std::size_t s = 0; s < ds.shard_count(); ++s)
        resident += residency(*ds.shard(s).bin->local_file()) / static_cast<double>(ds.shard_count());
    std::printf("page cache residency before warm cases: %.0f%%\n", resident * 100);
    for (int rep = 0; rep < a.repeats; ++rep) {
        warm(ds);  // the page cache here drops idle files within a minute: re-warm every round
        gbps["warm_random/memcpy"].push_back(memcpy_windows());
        for (auto& [name, r] : readers) gbps["warm_random/" + name].push_back(reader_windows(r));
    }

    // ---- warm sequential scans (1 MiB reads) ----
    auto scan = [&](auto&& read_chunk) {
        auto t0 = clock_type::now();
        std::uint64_t bytes = 0;
        for (std::size_t s = 0; s < ds.shard_count(); ++s)
            for (std::uint64_t off = 0; off < ds.shard(s).bin->size(); off += 1 << 20) {
                std::uint64_t n = std::min<std::uint64_t>(1 << 20, ds.shard(s).bin->size() - off);
                read_chunk(s, off, n);
                bytes += n;
            }
        return gb_per_s(static_cast<double>(bytes), t0);
    };
    for (int rep = 0; rep < a.repeats; ++rep) {
        warm(ds);
        gbps["warm_scan/memcpy"].push_back(scan([&](std::size_t s, std::uint64_t off, std::uint64_t n) {
            std::memcpy(big.p + (off & (31u << 20)), maps[s].bytes().data() + off, n);
        }));
        for (auto& [name, r] : readers) {
            std::vector<feedline::read_request> reqs(1);
            gbps["warm_scan/" + name].push_back(scan([&](std::size_t s, std::uint64_t off, std::uint64_t n) {
                reqs[0] = {ds.shard(s).bin, off, n, big.p + (off & (31u << 20))};
                r.read(reqs);
            }));
        }
    }

    // ---- cold (O_DIRECT) ----
    if (uring_ok) {
        auto direct =
            feedline::make_reader({.backend = feedline::io_backend::io_uring, .queue_depth = 32, .direct = true, .register_buffers = true});
        auto direct64 =
            feedline::make_reader({.backend = feedline::io_backend::io_uring, .queue_depth = 64, .direct = true, .register_buffers = true});
        // Cold scan through the library: 32 MiB per read() call, split into 1 MiB reads, 32 in flight.
        for (int rep = 0; rep < std::max(1, a.repeats / 2); ++rep) {
            gbps["cold_scan/raw_uring_qd32"].push_back(raw_uring_direct_scan(paths, 32, 1 << 20, big));
            std::vector<feedline::read_request> reqs(1);
            auto t0 = clock_type::now();
            std::uint64_t bytes = 0;
            for (std::size_t s = 0; s < ds.shard_count(); ++s)
                for (std::uint64_t off = 0; off < ds.shard(s).bin->size(); off += 32 << 20) {
                    std::uint64_t n = std::min<std::uint64_t>(32 << 20, ds.shard(s).bin->size() - off);
                    reqs[0] = {ds.shard(s).bin, off, n, big.p};
                    direct.read(reqs);
                    bytes += n;
                }
            gbps["cold_scan/io_uring_direct"].push_back(gb_per_s(static_cast<double>(bytes), t0));
        }
        // Cold random windows: O_DIRECT pread one at a time vs io_uring with 32 in flight.
        const std::size_t cold_windows = 4096;
        auto cold_starts = window_starts(ds, cold_windows, 2);
        std::vector<int> direct_fds;
        for (auto& p : paths) direct_fds.push_back(::open(p.c_str(), O_RDONLY | O_DIRECT));
        aligned_buffer bounce(3 * 4096 + window_bytes);
        aligned_buffer cold_batch(256 * window_bytes);
        for (int rep = 0; rep < a.repeats; ++rep) {
            auto t0 = clock_type::now();
            std::vector<feedline::read_request> reqs;
            for (std::size_t i = 0; i < cold_windows; ++i) {
                window_requests(ds, cold_starts, i, 1, cold_batch.p, reqs);
                for (auto& r : reqs) {
                    std::size_t shard = 0;
                    while (ds.shard(shard).bin != r.source) ++shard;
                    std::uint64_t begin = r.offset & ~4095ull, end = (r.offset + r.length + 4095) & ~4095ull;
                    if (::pread(direct_fds[shard], bounce.p, end - begin, static_cast<off_t>(begin)) < 0) std::abort();
                    std::memcpy(r.dest, bounce.p + (r.offset - begin), r.length);
                }
            }
            gbps["cold_random/pread_qd1"].push_back(gb_per_s(static_cast<double>(cold_windows * window_bytes), t0));
            // Batches of 256 windows through the library's io_uring reader.
            const auto batched = [&](auto& reader, const char* name) {
                t0 = clock_type::now();
                for (std::size_t b = 0; b < cold_windows; b += 256) {
                    window_requests(ds, cold_starts, b, 256, cold_batch.p, reqs);
                    reader.read(reqs);
                }
                gbps[name].push_back(gb_per_s(static_cast<double>(cold_windows * window_bytes), t0));
            };
            batched(direct, "cold_random/io_uring_qd32");
            batched(direct64, "cold_random/io_uring_qd64");
        }
        for (int fd : direct_fds) ::close(fd);
    }

    std::printf("\n%-30s %10s %22s\n", "case", "GB/s", "spread (min-max)");
    std::map<std::string, double> med;
    for (auto& [name, v] : gbps) {
        auto s = summarise(v);
        med[name] = s.median;
        std::printf("%-30s %10.3f %10.3f - %-10.3f\n", name.c_str(), s.median, s.lo, s.hi);
    }
    auto ratio = [&](const std::string& a_, const std::string& b_) {
        return med.count(a_) && med.count(b_) && med[b_] > 0 ? med[a_] / med[b_] : 0.0;
    };
    const std::string best_warm = uring_ok && med["warm_random/io_uring"] > med["warm_random/mmap"] ? "io_uring" : "mmap";
    std::printf("(data kept in %s for the next run; delete it when done)\n", a.dir.c_str());
    std::printf(
        "{\"warm_random_vs_memcpy\": %.3f, \"warm_random_mmap_vs_memcpy\": %.3f, \"warm_random_uring_vs_memcpy\": %.3f, "
        "\"warm_random_pread_vs_memcpy\": %.3f, \"cold_uring_vs_raw\": %.3f, \"cold_random_uring_vs_pread_qd1\": %.3f, "
        "\"cold_random_uring_qd64_vs_pread_qd1\": %.3f, \"best_warm_backend\": \"%s\"}\n",
        ratio("warm_random/" + best_warm, "warm_random/memcpy"), ratio("warm_random/mmap", "warm_random/memcpy"),
        ratio("warm_random/io_uring", "warm_random/memcpy"), ratio("warm_random/pread", "warm_random/memcpy"),
        ratio("cold_scan/io_uring_direct", "cold_scan/raw_uring_qd32"), ratio("cold_random/io_uring_qd32", "cold_random/pread_qd1"),
        ratio("cold_random/io_uring_qd64", "cold_random/pread_qd1"), best_warm.c_str());
    return 0;
}
