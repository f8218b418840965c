// feedline/doctor/measure.hpp: feedline-doctor check --data: what this machine delivers on this data, measured
// instead of assumed. Read throughput per storage backend (warm: the files in the page cache; cold:
// after POSIX_FADV_DONTNEED dropped their pages, which works without root for clean pages), the
// pipeline's tokens/s with 1, 2, 4, ... workers (for text, also what one worker tokenizes per second),
// and with a GPU, host-to-device copies from pinned and from pageable memory; and what one core
// updates per second as an offloaded optimizer (CPU Adam). Each figure is a rate
// over a fixed amount of work or time; docs/sizing.md says how plan uses them.
#pragma once

#include <fcntl.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/detail/paths.hpp>
#include <feedline/pipeline.hpp>
#include <feedline/storage/reader.hpp>

namespace feedline::doctor {

struct measure_options {
    std::string data, tokenizer;
    // Per backend and pass, at most; 0: 4 GiB or half the available memory, whichever is less. The warm
    // pass leaves what it read in the page cache, so a dataset within the limit is measured warm by the
    // pipeline runs that follow (one beyond it partly cold, as training would read it).
    std::uint64_t read_bytes = 0;
    double seconds = 1.0;      // per worker count
    unsigned max_workers = 0;  // 0: the usable cores
    std::uint64_t batch_size = 8, seq_len = 512;
};

// The files a DATASET names (shards' .bin, a directory's files, a glob, a file, raw files), for the read test.
inline std::vector<std::string> files_of(const std::string& dataset) {
    std::vector<std::string> out;
    for (const auto& w : feedline::parse_data_spec(dataset)) {
        const auto raw = feedline::parse_raw_spec(w.spec);
        const std::string& s = raw ? raw->location : w.spec;  // raw:<dtype>:<files>: the files themselves
        if (!raw && feedline::scheme_for(s).exists(s + ".bin")) {
            out.push_back(s + ".bin");  // a Megatron prefix: its data
            continue;
        }
        const auto where = feedline::expand_location(s);
        out.insert(out.end(), where.entries.begin(), where.entries.end());
    }
    return out;
}

namespace detail {

// The smallest object's size: a request of a random object fits in every one.
inline std::uint64_t src_size_limit(const std::vector<const feedline::byte_source*>& objects) {
    std::uint64_t least = UINT64_MAX;
    for (const auto* o : objects) least = std::min(least, o->size());
    return least;
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Reads the first `limit` bytes of the files, in 1 MiB requests, 8 per call: bytes/s.
inline double read_rate(feedline::any_reader& reader, const std::vector<std::unique_ptr<feedline::file>>& files, std::uint64_t limit) {
    constexpr std::uint64_t chunk = 1 << 20, per_call = 8;
    std::vector<std::byte> buffer(chunk * per_call);
    std::vector<feedline::read_request> batch;
    std::uint64_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& f : files) {
        for (std::uint64_t off = 0; off < f->size() && done < limit;) {
            batch.clear();
            while (batch.size() < per_call && off < f->size() && done < limit) {
                const std::uint64_t n = std::min({chunk, f->size() - off, limit - done});
                batch.push_back({f.get(), off, n, buffer.data() + batch.size() * chunk});
                off += n, done += n;
            }
            reader.read(batch);
        }
    }
    const double s = seconds_since(t0);
    return s > 0 ? static_cast<double>(done) / s : 0;
}

inline void drop_cached_pages(const std::vector<std::unique_ptr<feedline::file>>& files) {
    for (const auto& f : files) (void)::posix_fadvise(f->use().fd(), 0, 0, POSIX_FADV_DONTNEED);
}

}  // namespace detail

// Remote data (s3://): what a request costs and what concurrency buys, on this data's objects. Request
// latency (16 reads of one window, one at a time: p50 and the slowest), the bytes/s of one stream
// and of 16 at once (8 MiB requests, up to the pass's bytes), and the windows one worker fetches per
// second with its requests in flight (FEEDLINE_S3_MAX_REQUESTS). From the latency: the requests in
// flight that 1 M tokens/s of windows needs (each worker keeps max_requests in flight).
inline nlohmann::json measure_remote_reads(const measure_options& o, const std::vector<std::string>& locations) {
    struct bypass {  // the store is measured, not the local cache
        bypass() { feedline::detail::remote_cache_bypass = true; }
        ~bypass() { feedline::detail::remote_cache_bypass = false; }
    } const measuring_the_store;
    std::vector<std::unique_ptr<feedline::byte_source>> objects;
    std::uint64_t total = 0;
    for (const auto& l : locations) {
        objects.push_back(feedline::open_byte_source(l));
        total += objects.back()->size();
    }
    const std::uint64_t window = (o.seq_len + 1) * 2;  // a uint16 window; int32 data reads twice as much per token
    std::vector<const feedline::byte_source*> usable;
    for (const auto& obj : objects)
        if (obj->size() >= window) usable.push_back(obj.get());
    nlohmann::json out = {{"remote", true}, {"files", objects.size()}, {"dataset_bytes", total}, {"window_bytes", window}};
    if (usable.empty()) return out;
    std::uint64_t seed = 0x9E3779B97F4A7C15ull;
    auto pick = [&](std::uint64_t length) {  // a random range of `length` bytes of a random object
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const feedline::byte_source* src = usable[(seed >> 33) % usable.size()];
        const std::uint64_t room = src->size() >= length ? src->size() - length : 0;
        return std::pair{src, room ? (seed >> 11) % (room + 1) : 0};
    };
    std::vector<std::byte> buffer(std::max<std::uint64_t>(window, 8u << 20) * 16);
    std::vector<double> latencies;
    for (int i = 0; i < 16; ++i) {
        const auto [src, at] = pick(window);
        const auto t0 = std::chrono::steady_clock::now();
        src->read_at(buffer.data(), window, at);
        latencies.push_back(detail::seconds_since(t0));
    }
    std::sort(latencies.begin(), latencies.end());
    const double p50 = latencies[latencies.size() / 2];
    out["latency_p50_s"] = p50;
    out["latency_max_s"] = latencies.back();
    const std::uint64_t cap = o.read_bytes ? o.read_bytes : std::uint64_t(256) << 20;
    auto rate = [&](std::size_t in_flight, std::uint64_t request) {
        std::vector<feedline::read_request> batch;
        std::uint64_t done = 0;
        const auto t0 = std::chrono::steady_clock::now();
        do {
            batch.clear();
            for (std::size_t k = 0; k < in_flight; ++k) {
                const auto [src, at] = pick(std::min(request, detail::src_size_limit(usable)));
                const std::uint64_t n = std::min(request, src->size() - at);
                batch.push_back({src, at, n, buffer.data() + k * request});
                done += n;
            }
            feedline::detail::read_through_sources(batch);
        } while (done < std::min(cap, total) && detail::seconds_since(t0) < o.seconds);
        return static_cast<double>(done) / detail::seconds_since(t0);
    };
    out["one_stream_bytes_per_s"] = rate(1, 8u << 20);
    out["sixteen_streams_bytes_per_s"] = rate(16, 8u << 20);
    const double windows_bytes = rate(16, window);
    out["windows_per_s_16_in_flight"] = windows_bytes / static_cast<double>(window);
    out["in_flight_per_million_tokens_per_s"] = 1e6 / static_cast<double>(o.seq_len) * p50;
    return out;
}

inline nlohmann::json measure_reads(const measure_options& o) {
    if (const auto locations = files_of(o.data);
        std::any_of(locations.begin(), locations.end(), [](const std::string& l) { return feedline::scheme_for(l).name != "file"; }))
        return measure_remote_reads(o, locations);
    // Opened afresh for each backend: a file keeps its mapping once mmap read it, and mapped pages
    // cannot be dropped, so the next backend's cold pass would read the cache.
    auto open_all = [&] {
        std::vector<std::unique_ptr<feedline::file>> files;
        for (const auto& path : files_of(o.data)) files.push_back(std::make_unique<feedline::file>(path));
        return files;
    };
    std::uint64_t total = 0;
    std::size_t count = 0;
    for (const auto& f : open_all()) total += f->size(), ++count;
    const std::uint64_t cap =
        o.read_bytes ? o.read_bytes : std::min<std::uint64_t>(4ull << 30, feedline::read_host_memory().available.value_or(0) / 2);
    const std::uint64_t limit = std::min(total, cap);
    nlohmann::json out = {{"files", count},
                          {"dataset_bytes", total},
                          {"bytes_per_pass", limit},
                          {"whole_dataset", limit == total},
                          {"request_bytes", 1 << 20}};
    for (auto backend : {feedline::io_backend::pread, feedline::io_backend::io_uring, feedline::io_backend::mmap}) {
        const std::string name(feedline::to_string(backend));
        try {
            const auto files = open_all();
            auto reader = feedline::make_reader({.backend = backend, .pattern = feedline::access_pattern::sequential});
            detail::drop_cached_pages(files);
            const double cold = detail::read_rate(reader, files, limit);
            const double warm = detail::read_rate(reader, files, limit);  // the pass before left the pages cached
            out[name] = {{"cold_bytes_per_s", cold}, {"warm_bytes_per_s", warm}};
        } catch (const feedline::error& e) {
            out[name] = {{"unavailable", e.what()}};
        }
    }
    return out;
}

// The pipeline's delivered tokens/s with `workers` workers into `device` ("cpu": host memory; "auto":
// the pinned ring and the GPU when there is one), over `seconds` after two start-up batches.
inline nlohmann::json measure_pipeline_once(const measure_options& o, unsigned workers, const std::string& device) {
    const bool text = feedline::kinds_of(feedline::parse_data_spec(o.data)).text;
    feedline::pipeline_config c{
        .batch_size = o.batch_size, .seq_len = o.seq_len, .workers = workers, .device = feedline::parse_device(device)};
    if (text) c.text.tokenizer = o.tokenizer;
    feedline::pipeline p(o.data, c);
    for (int i = 0; i < 2; ++i)  // start-up (plans, the first fills) is not the steady rate
        if (!p.next()) break;
    const auto before = p.stats();
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t batches = 0;
    while (detail::seconds_since(t0) < o.seconds && p.next()) ++batches;
    const double s = detail::seconds_since(t0);
    const auto after = p.stats();
    const double tokens = double(batches * o.batch_size * o.seq_len);
    nlohmann::json row{{"workers", workers},
                       {"batches", batches},
                       {"tokens_per_s", s > 0 ? tokens / s : 0},
                       {"stall_fraction", s > 0 ? std::min(1.0, (after.stall_s - before.stall_s) / s) : 0},
                       {"device", after.device}};
    if (text && after.tokenize_s > before.tokenize_s)  // tokens one worker tokenizes per second of its time
        row["tokenize_tokens_per_s_per_worker"] = tokens / (after.tokenize_s - before.tokenize_s);
    return row;
}

// The pipeline on host memory with 1, 2, 4, ... workers up to `max_workers` (and that number itself).
inline nlohmann::json measure_pipeline(const measure_options& o) {
    const unsigned most = o.max_workers ? o.max_workers : std::max(1u, static_cast<unsigned>(feedline::read_topology().usable_cores()));
    nlohmann::json rows = nlohmann::json::array();
    for (unsigned w = 1;; w = w * 2 > most ? most : w * 2) {
        rows.push_back(measure_pipeline_once(o, w, "cpu"));
        if (w == most) break;
    }
    return rows;
}

// An offloaded optimizer's step on one core: AdamW over fp32 master weights, momentum and variance
// with fp32 gradients, writing the 16-bit copy the GPU gets back (ZeRO-Offload's CPU Adam does this
// per parameter: 16 bytes read, 14 written). Parameters updated per second, over `params` (32 Mi,
// 576 MB: past the caches, as a real partition is) for about `seconds`. Memory-bound: cores scale until
// they share the node's bandwidth, which `plan` states beside the cores.
inline nlohmann::json measure_cpu_adam(double seconds = 1.0, std::size_t params = std::size_t(32) << 20) {
    std::vector<float> w(params, 0.5f), m(params, 0.0f), v(params, 0.0f), g(params);
    std::vector<std::uint16_t> half(params);
    for (std::size_t i = 0; i < params; ++i) g[i] = 1e-3f * static_cast<float>(i % 97);
    const float lr = 1e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, decay = 0.1f;
    std::uint64_t steps = 0;
    const auto t0 = std::chrono::steady_clock::now();
    do {
        ++steps;
        const float c1 = 1.0f / (1.0f - std::pow(b1, float(steps))), c2 = 1.0f / (1.0f - std::pow(b2, float(steps)));
        for (std::size_t i = 0; i < params; ++i) {
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            w[i] -= lr * (m[i] * c1 / (std::sqrt(v[i] * c2) + eps) + decay * w[i]);
            half[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(w[i]) >> 16);  // bf16, truncated
        }
    } while (detail::seconds_since(t0) < seconds);
    const double elapsed = detail::seconds_since(t0);
    volatile std::uint16_t keep = half[params / 2];  // the result is used: the loop cannot be dropped
    (void)keep;
    return {{"params_per_s_per_core", double(params) * double(steps) / elapsed}, {"params", params}, {"steps", steps}};
}

// Host-to-device copy rates from pinned and pageable memory (64 MiB, 10 copies each), or why not.
inline nlohmann::json measure_h2d() {
#if FEEDLINE_HAS_CUDA
    if (const auto gpu = feedline::gpu_probe(); !gpu) return {{"unavailable", gpu.reason}};
    try {
        constexpr std::size_t bytes = 64ull << 20;
        constexpr int copies = 10;
        void *device_raw = nullptr, *pinned_raw = nullptr;
        FEEDLINE_CUDA_CHECK(cudaMalloc(&device_raw, bytes));
        const std::unique_ptr<void, cudaError_t (*)(void*)> device(device_raw, cudaFree);  // freed on every way out
        FEEDLINE_CUDA_CHECK(cudaMallocHost(&pinned_raw, bytes));
        const std::unique_ptr<void, cudaError_t (*)(void*)> pinned(pinned_raw, cudaFreeHost);
        std::vector<std::byte> pageable(bytes, std::byte{1});
        std::memset(pinned.get(), 1, bytes);
        auto rate = [&](const void* src) {
            FEEDLINE_CUDA_CHECK(cudaMemcpy(device.get(), src, bytes, cudaMemcpyHostToDevice));  // warm-up
            FEEDLINE_CUDA_CHECK(cudaDeviceSynchronize());
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < copies; ++i) FEEDLINE_CUDA_CHECK(cudaMemcpy(device.get(), src, bytes, cudaMemcpyHostToDevice));
            // A pageable cudaMemcpy may return once its last chunk is in the driver's staging buffer,
            // before the DMA lands (CUDA's API synchronization behaviour): wait for it, or pageable gains.
            FEEDLINE_CUDA_CHECK(cudaDeviceSynchronize());
            return double(bytes) * copies / detail::seconds_since(t0);
        };
        const double p = rate(pinned.get()), q = rate(pageable.data());
        return {{"pinned_bytes_per_s", p}, {"pageable_bytes_per_s", q}, {"pageable_vs_pinned", q / p}};
    } catch (const feedline::error& e) {
        return {{"unavailable", e.what()}};
    }
#else
    return {{"unavailable", "feedline was built without the CUDA Toolkit"}};
#endif
}

}  // namespace feedline::doctor
