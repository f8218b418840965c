// feedline/pipeline/detail/telemetry.hpp: what a pipeline reports while it runs: the JSON-lines stats
// log (a line every stats_every batches and one at the end) and, where batches go to a GPU, the GPU's
// utilization and memory sampled on a side thread (NVML) for those lines. It is handed the stats to
// write; it never calls back into the pipeline. A log that cannot be written (a full disk) stops with
// its reason in the stats and never costs the trainer a batch. The log opens with a line of the
// options the run was given (pipeline/options.hpp's JSON form). Used by pipeline/pipeline.hpp.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include <feedline/device/nvml.hpp>
#include <feedline/pipeline/config.hpp>
#include <feedline/pipeline/options.hpp>
#include <feedline/pipeline/stats.hpp>
#include <feedline/version.hpp>

namespace feedline::detail {

// The environment variable that asks every pipeline of a process for a stats log (see open()).
inline constexpr const char* stats_jsonl_variable = "FEEDLINE_STATS_JSONL";

class telemetry {
public:
    // Opens the stats log the config names, if any. Throws config_error (no interval) or io_error.
    // Without one, FEEDLINE_STATS_JSONL names a log to append to (feedline-doctor watch sets it for
    // the command it watches); one that cannot be opened is then passed over, its reason in the stats.
    void open(const pipeline_config& c) {
        every_ = c.stats_every;
        if (c.stats_jsonl.empty()) {
            const char* asked = std::getenv(stats_jsonl_variable);
            if (asked == nullptr || *asked == '\0') return;
            if (every_ == 0) every_ = 100;
            put([&] { log_ = std::make_unique<stats_jsonl_log>(asked); });
            if (!log_) return;
        } else {
            if (c.stats_every == 0) throw config_error("stats_every", "must be at least 1 when stats_jsonl is set");
            log_ = std::make_unique<stats_jsonl_log>(c.stats_jsonl);
        }
#if FEEDLINE_HAS_JSON
        // The log's first line is the options the run was given, in the form --config reads (and the
        // names of those set rather than left at their defaults), so a log says what produced it and
        // `feedline-doctor diagnose` reads the batch size from it.
        nlohmann::json set = nlohmann::json::array();
        for_each_option([&](const auto& o) {
            if (option_is_set(c, o)) set.push_back(std::string(o.name));
        });
        const std::string line = nlohmann::json{{"feedline", version_string}, {"options", options_to_json(c)}, {"options_set", set}}.dump();
        put([&] { log_->write_object(line); });
#endif
    }

    // Once batches have a destination: a GPU's figures are sampled only with a log and a GPU ring.
    void start(bool on_device, int device_index) {
        if (!log_ || !on_device) return;
        gpu_sampler_ = gpu_sampler::for_gpu(gpu_pci_bus_id(device_index), &gpu_telemetry_);
        if (gpu_sampler_) gpu_telemetry_ = "nvml";
    }

    // Whether the line after `delivered` batches is due; then write(stats).
    bool due(std::uint64_t delivered) const noexcept { return log_ && every_ != 0 && delivered % every_ == 0; }
    // Whether the end's line is still to be written (once).
    bool end_due() const noexcept { return log_ && !final_logged_; }
    void write(const pipeline_stats& s, bool final = false) {
        if (!log_) return;
        if (final) final_logged_ = true;
        put([&] { log_->write(s, final); });
    }

    // Before a line's stats are taken: the GPU's mean since the last line.
    void sample_gpu() {
        if (gpu_sampler_)
            if (auto g = gpu_sampler_->take()) gpu_interval_ = g;
    }

    // What telemetry knows: the log's error, the GPU's figures (absent where the machine does not
    // say), and the host's memory.
    void fill(pipeline_stats& s) const {
        fill_memory_telemetry(s);
        if (gpu_interval_) {
            s.gpu_utilization = gpu_interval_->utilization;  // may be empty (MIG): then absent
            s.gpu_memory_used_bytes = gpu_interval_->memory_used;
            s.gpu_memory_total_bytes = gpu_interval_->memory_total;
        }
        s.gpu_telemetry = gpu_telemetry_;
        s.stats_log_error = log_error_;
    }

private:
    // A line that cannot be written (a full disk) stops the log, its reason kept for the stats.
    template <class Write>
    void put(Write&& write) {
        try {
            write();
        } catch (const std::exception& e) {
            log_error_ = e.what();
            log_.reset();
        }
    }

    std::uint64_t every_ = 100;
    std::unique_ptr<stats_jsonl_log> log_;
    std::string log_error_;
    std::unique_ptr<gpu_sampler> gpu_sampler_;
    std::optional<gpu_interval> gpu_interval_;  // the mean over the interval before the last log line
    std::string gpu_telemetry_;                 // "nvml", or why the GPU is not sampled
    bool final_logged_ = false;
};

}  // namespace feedline::detail
