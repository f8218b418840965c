// feedline/pipeline/stats.hpp: where the time goes. Counters the pipeline's workers and its consumer
// keep (relaxed atomics: approximate while running, exact once stopped), a snapshot type, and a
// one-line JSON rendering for logs. The stall fraction is the share of the consumer's wall time spent
// waiting in next(): near 0 when the data side keeps up, near 1 when training is data-bound.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <type_traits>

#include <feedline/detail/mapping_budget.hpp>
#include <feedline/error.hpp>
#include <feedline/exec/host_memory.hpp>
#include <feedline/storage/remote_counters.hpp>

namespace feedline {

// One dataset of a blend or mixture: its name (a mixture's domain; else its position and data), the
// samples delivered from it so far (and their tokens, samples x seq_len), the epoch it is in, and its
// share of the samples now (a mixture's schedule at the next step, or the blend's weight).
struct dataset_stats {
    std::string name;
    std::uint64_t samples = 0, tokens = 0, epoch = 0;
    double share = 0;
};

struct pipeline_stats {
    std::uint64_t batches = 0, tokens = 0, bytes_read = 0, padding_tokens = 0;
    double seconds = 0;  // since the first next()
    double tokens_per_s = 0;
    double read_s = 0, assemble_s = 0, plan_s = 0;  // summed over workers
    double tokenize_s = 0;                          // text input: tokenizer time, summed over workers
    double slot_wait_s = 0;                         // workers waiting for a free slot (the trainer is the bottleneck)
    double stall_s = 0;                             // the trainer waiting in next() (the data side is the bottleneck)
    double stall_fraction = 0;
    std::uint64_t consumer_sleeps = 0;  // times next() stopped spinning to sleep (a producer's futex call wakes it)
    std::size_t ready_batches = 0, slots = 0, prefetch_depth = 0;  // ready now, allocated, allowed ahead
    unsigned workers = 0, workers_active = 0;                      // threads, and how many the autotuner lets run
    std::uint64_t rss_bytes = 0, pinned_bytes = 0, memory_budget = 0, planned_bytes = 0;
    std::string io_backend, device;  // how each source reads (and tokenizes), and where batches go
    std::string worker_placement;    // whether the threads filling the ring are kept off the trainer's CPU, and why
    std::string workers_reason;      // why that many workers: fixed, or from the machine (recommend_workers)
    int trainer_cpu = -1;            // the busy trainer's CPU they are kept off (-1: none noted, or placement off)
    std::string stats_log_error;     // why the stats_jsonl log stopped (empty while it is written)
    // Telemetry for feedline-doctor diagnose; absent (not zero, and not in the JSON) where the machine
    // does not say. The machine's RAM and swap, this process's RSS split into its own (anonymous)
    // memory and mapped file pages, and the GPU through NVML (the mean of ~100 ms samples since the
    // previous stats line; only with a stats_jsonl log on a GPU).
    std::optional<std::uint64_t> host_ram_total_bytes, host_ram_available_bytes, swap_total_bytes, swap_used_bytes;
    std::optional<std::uint64_t> rss_anon_bytes, rss_file_bytes;
    // Files this process reads now without a mapping, since its mappings reached their budget under
    // vm.max_map_count (detail/mapping_budget.hpp): read with pread instead. Absent while there are none.
    std::optional<std::uint64_t> unmapped_files;
    std::optional<double> gpu_utilization;
    std::optional<std::uint64_t> gpu_memory_used_bytes, gpu_memory_total_bytes;
    std::string gpu_telemetry;  // "nvml" when the GPU is sampled, else why not; empty without a GPU log
    // Remote reads (s3://) since the pipeline was built: requests answered, body bytes, attempts
    // retried, requests that failed for good, and the latency of answered requests (p50, p99: the
    // upper edges of power-of-two buckets). Absent without remote data.
    std::optional<std::uint64_t> remote_requests, remote_bytes, remote_retries, remote_failures;
    std::optional<std::uint64_t> remote_cache_hits, remote_cache_misses;  // blocks read from the local cache, and fetched into it
    std::optional<double> remote_latency_p50_s, remote_latency_p99_s;
    // The fetch ahead (remote data): bytes workers took from it, bytes it fetched that no worker took
    // (a worker got to the step first), and how far ahead it fetches now: steps, and requests at once.
    std::optional<std::uint64_t> remote_fetch_ahead_bytes, remote_fetch_ahead_unused_bytes;
    std::optional<std::uint64_t> remote_fetch_ahead_steps, remote_fetch_ahead_requests;
    // Blends and mixtures: each dataset's accounting, in order (empty for one dataset). In the JSON
    // line as "datasets" (an array of objects) where there are at most json_datasets_max of them or
    // the line is the run's last (to_json(true)): 10,000 domains make ~1 MB a line.
    std::vector<dataset_stats> datasets;
    static constexpr std::size_t json_datasets_max = 256;
    // With the datasets: the step the trainer's state is at (its samples over every rank: next_step x
    // global batch), and for a mixture the step its targets count from (0 unless weights were set
    // during the run or it went on with another schedule), which feedline-doctor diagnose --mixture
    // needs to check each domain's total against the schedule.
    // mixture_weights_set: 1 when weights set during the run are in force.
    std::optional<std::uint64_t> next_step, mixture_from_step, mixture_weights_set;

    std::string to_json(bool final = false) const {
        // JSON string escapes: quotes, backslashes and control characters (a path with a newline in an
        // error message must not split the line).
        auto esc = [](const std::string& s) {
            std::string o;
            for (char c : s) {
                if (c == '"' || c == '\\') {
                    o += '\\';
                    o += c;
                } else if (static_cast<unsigned char>(c) < 0x20) {
                    char u[8];
                    std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
                    o += u;
                } else {
                    o += c;
                }
            }
            return o;
        };
        char buf[1024];
        std::snprintf(
            buf, sizeof buf,
            "{\"batches\": %llu, \"tokens\": %llu, \"bytes_read\": %llu, \"padding_tokens\": %llu, \"seconds\": %.4f, "
            "\"tokens_per_s\": %.0f, \"read_s\": %.4f, \"assemble_s\": %.4f, \"plan_s\": %.4f, \"tokenize_s\": %.4f, \"slot_wait_s\": "
            "%.4f, "
            "\"stall_s\": %.4f, \"stall_fraction\": %.4f, \"consumer_sleeps\": %llu, \"ready_batches\": %zu, \"slots\": %zu, "
            "\"prefetch_depth\": %zu, \"workers\": %u, \"workers_active\": %u, "
            "\"rss_bytes\": %llu, \"pinned_bytes\": %llu, \"memory_budget\": %llu, \"planned_bytes\": %llu, \"trainer_cpu\": %d, ",
            static_cast<unsigned long long>(batches), static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(bytes_read),
            static_cast<unsigned long long>(padding_tokens), seconds, tokens_per_s, read_s, assemble_s, plan_s, tokenize_s, slot_wait_s,
            stall_s, stall_fraction, static_cast<unsigned long long>(consumer_sleeps), ready_batches, slots, prefetch_depth, workers,
            workers_active, static_cast<unsigned long long>(rss_bytes), static_cast<unsigned long long>(pinned_bytes),
            static_cast<unsigned long long>(memory_budget), static_cast<unsigned long long>(planned_bytes), trainer_cpu);
        std::string telemetry;
        auto put = [&](const char* key, const auto& v) {
            if (!v) return;
            char num[64];
            if constexpr (std::is_floating_point_v<std::decay_t<decltype(*v)>>)
                std::snprintf(num, sizeof num, "%.4f", *v);
            else
                std::snprintf(num, sizeof num, "%llu", static_cast<unsigned long long>(*v));
            telemetry += std::string(", \"") + key + "\": " + num;
        };
        put("host_ram_total_bytes", host_ram_total_bytes);
        put("host_ram_available_bytes", host_ram_available_bytes);
        put("swap_total_bytes", swap_total_bytes);
        put("swap_used_bytes", swap_used_bytes);
        put("rss_anon_bytes", rss_anon_bytes);
        put("rss_file_bytes", rss_file_bytes);
        put("unmapped_files", unmapped_files);
        put("gpu_utilization", gpu_utilization);
        put("gpu_memory_used_bytes", gpu_memory_used_bytes);
        put("gpu_memory_total_bytes", gpu_memory_total_bytes);
        put("remote_requests", remote_requests);
        put("remote_bytes", remote_bytes);
        put("remote_retries", remote_retries);
        put("remote_failures", remote_failures);
        put("remote_cache_hits", remote_cache_hits);
        put("remote_cache_misses", remote_cache_misses);
        put("remote_latency_p50_s", remote_latency_p50_s);
        put("remote_latency_p99_s", remote_latency_p99_s);
        put("remote_fetch_ahead_bytes", remote_fetch_ahead_bytes);
        put("remote_fetch_ahead_unused_bytes", remote_fetch_ahead_unused_bytes);
        put("remote_fetch_ahead_steps", remote_fetch_ahead_steps);
        put("remote_fetch_ahead_requests", remote_fetch_ahead_requests);
        if (!gpu_telemetry.empty()) telemetry += ", \"gpu_telemetry\": \"" + esc(gpu_telemetry) + "\"";
        if (!datasets.empty() && (final || datasets.size() <= json_datasets_max)) {
            telemetry += ", \"datasets\": [";
            for (std::size_t i = 0; i < datasets.size(); ++i) {
                const dataset_stats& d = datasets[i];
                char num[160];
                std::snprintf(num, sizeof num, "\", \"samples\": %llu, \"tokens\": %llu, \"epoch\": %llu, \"share\": %.6g}",
                              static_cast<unsigned long long>(d.samples), static_cast<unsigned long long>(d.tokens),
                              static_cast<unsigned long long>(d.epoch), d.share);
                telemetry += std::string(i ? ", " : "") + "{\"name\": \"" + esc(d.name) + num;
            }
            telemetry += "]";
            put("next_step", next_step);
            put("mixture_from_step", mixture_from_step);
            put("mixture_weights_set", mixture_weights_set);
        }
        return std::string(buf) + "\"io_backend\": \"" + esc(io_backend) + "\", \"device\": \"" + esc(device) +
               "\", \"worker_placement\": \"" + esc(worker_placement) + "\", \"workers_reason\": \"" + esc(workers_reason) +
               "\", \"stats_log_error\": \"" + esc(stats_log_error) + "\"" + telemetry + "}";
    }
};

namespace detail {

// Appends stats snapshots to a file as JSON lines (one object per line, with the wall-clock time), for
// log shippers and plots. Opened when the pipeline is built, so a bad path fails before any thread.
class stats_jsonl_log {
public:
    // Opened non-blocking: a FIFO nobody reads is refused at once (ENXIO) instead of blocking the
    // pipeline's construction until a reader appears. A file, a device (/dev/stderr) or a FIFO with a
    // reader is written to.
    explicit stats_jsonl_log(const std::string& path) : path_(path) {
        const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
        if (fd < 0)
            throw io_error(path, errno,
                           errno == ENXIO ? "the stats log is a FIFO that nobody reads" : "cannot open the stats log for appending");
        if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        out_ = ::fdopen(fd, "a");
        if (out_ == nullptr) {
            const int err = errno;
            ::close(fd);
            throw io_error(path, err, "cannot open the stats log for appending");
        }
    }
    stats_jsonl_log(const stats_jsonl_log&) = delete;
    stats_jsonl_log& operator=(const stats_jsonl_log&) = delete;
    ~stats_jsonl_log() {
        if (out_) std::fclose(out_);
    }
    void write(const pipeline_stats& s, bool final = false) { write_object(s.to_json(final)); }

    // Writes a JSON object `body` ("{...}") as one line, the wall-clock time put first.
    void write_object(const std::string& body) {
        const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        if (std::fprintf(out_, "{\"unix_time\": %.3f, %s\n", now, body.c_str() + 1) < 0 || std::fflush(out_) != 0)
            throw io_error(path_, errno, "cannot write the stats log");
    }

private:
    std::string path_;
    std::FILE* out_ = nullptr;
};

// Fills the remote-read fields of `s` with what happened since `start` (nothing when nothing did).
inline void fill_remote_reads(pipeline_stats& s, const remote_reads& start) {
    const remote_reads d = remote_counters::instance().snapshot().since(start);
    if (d.requests == 0 && d.failures == 0 && d.cache_hits == 0) return;
    s.remote_requests = d.requests;
    s.remote_bytes = d.bytes;
    s.remote_retries = d.retries;
    s.remote_failures = d.failures;
    s.remote_cache_hits = d.cache_hits;
    s.remote_cache_misses = d.cache_misses;
    s.remote_latency_p50_s = d.latency_quantile(0.5);
    s.remote_latency_p99_s = d.latency_quantile(0.99);
}

// Fills the host and process memory fields of `s` from procfs (one read of each file).
inline void fill_memory_telemetry(pipeline_stats& s) {
    const host_memory h = read_host_memory();
    s.host_ram_total_bytes = h.total;
    s.host_ram_available_bytes = h.available;
    s.swap_total_bytes = h.swap_total;
    s.swap_used_bytes = h.swap_used();
    const process_memory p = read_process_memory();
    s.rss_bytes = p.rss.value_or(0);
    s.rss_anon_bytes = p.rss_anon;
    s.rss_file_bytes = p.rss_file;
    if (const std::uint64_t unmapped = mapping_budget::instance().unmapped()) s.unmapped_files = unmapped;
}

}  // namespace detail

// Resident set size of this process (VmRSS), 0 when unreadable.
inline std::uint64_t resident_bytes() { return read_process_memory().rss.value_or(0); }

}  // namespace feedline
