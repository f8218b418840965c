// feedline/doctor/diagnose.hpp: why a GPU waits, from what was measured. The observations come from a scenario
// file (a documented schema a user fills from nvidia-smi and free by hand) or from a run's JSON-lines
// log (feedline-train --json); the rules turn them into findings with stable codes, the numbers they
// read, and what to do. Thresholds and their reasons are in docs/sizing.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <istream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <feedline/detail/edit_distance.hpp>
#include <feedline/error.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/format/jsonl_field.hpp>

namespace feedline::doctor {

struct gpu_observation {
    std::optional<double> memory_total_mib, memory_used_mib, utilization;
    std::optional<double> peak_tflops;  // the GPU's dense peak at the training precision (bf16 H100 SXM: 989)
};

// What is known about a run; every field may be missing, and a rule that needs a missing one stays quiet.
struct observations {
    std::vector<gpu_observation> gpus;
    std::optional<double> cores, ram_total_mib, ram_used_mib, swap_total_mib, swap_used_mib;
    std::optional<double> cpu_utilization;  // the host's CPUs, busy share of all of them
    std::optional<double> micro_batch, grad_accum, data_workers, stall_fraction, tokens_per_s;
    std::optional<double> params;  // the model's parameters (for MFU: 6 x params FLOPs per token)
    std::optional<bool> pinned_memory;
    std::optional<double> rss_anon_mib, rss_file_mib;  // the training process
    std::optional<double> unmapped_files;              // files read with pread past the mapping budget (vm.max_map_count)
    std::optional<double> gpu_numa_node;               // the GPU's NUMA node
    std::vector<double> worker_numa_nodes;             // where the data workers run
    // Remote reads (s3://) of the pipeline: requests, retried attempts, and the median request latency.
    std::optional<double> remote_requests, remote_retries, remote_latency_p50_s;
    // A blend's or mixture's per-domain totals (a stats line's "datasets"), the step its state is at,
    // and where a mixture's targets count from: what --mixture checks against the schedule.
    struct domain_total {
        std::string name;
        double samples = 0, tokens = 0;
    };
    std::vector<domain_total> domains;
    std::optional<double> next_step, mixture_from_step, mixture_weights_set;
    std::vector<std::string> notes;  // what the reader passed over (a cut last line)
};

struct finding {
    std::string code, severity;  // severity: "action" (needs action) or "info"
    nlohmann::json evidence;
    std::string action;
    // What the change would bring, where it can be estimated: the share more tokens/s (0.69: 1.69x).
    std::optional<double> gain;
    // The finding whose cause makes this one moot (shown as info under it), or empty.
    std::string moot_by;
};

// Thresholds (docs/sizing.md says why each is where it is).
inline constexpr double data_bound_stall = 0.05;      // the trainer waits >= 5% of its time
inline constexpr double gpu_ahead_stall = 0.02;       // below this the data side is ahead
inline constexpr double gpu_busy = 0.90;              // utilization that counts as busy
inline constexpr double gpu_memory_headroom = 0.60;   // used / total at or below this while busy
inline constexpr double gpu_memory_target = 0.95;     // the most a raised micro-batch may use (an upper bound)
inline constexpr double host_memory_pressure = 0.90;  // RAM used / total
inline constexpr double swap_in_use_mib = 64;         // swap used beyond noise
inline constexpr double remote_retried = 0.01;        // retried attempts / requests: the store pushes back
inline constexpr double cpu_idle = 0.50;              // host CPU utilization below this: the CPUs are not what the GPU waits on

namespace detail {

[[noreturn]] inline void bad(const std::string& where, const std::string& field, const std::string& why) {
    throw feedline::config_error(field, where + ": " + why);
}

// A number >= 0 (or null: unknown), for a field of a scenario; anything else names the field.
inline std::optional<double> number(const nlohmann::json& o, const char* key, const std::string& where, const std::string& prefix) {
    const auto it = o.find(key);
    if (it == o.end() || it->is_null()) return std::nullopt;
    const std::string field = prefix + key;
    if (!it->is_number()) bad(where, field, "must be a number or null");
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < 0) bad(where, field, "must be a number >= 0 (got " + it->dump() + ")");
    return v;
}

// The names other tools give some fields (PyTorch's DataLoader, nvidia-smi): the error says which one
// this schema means instead of only "unknown".
inline const char* known_alias(const std::string& k) {
    static const std::pair<const char*, const char*> aliases[] = {{"num_workers", "data_workers"},
                                                                  {"pin_memory", "pinned_memory"},
                                                                  {"batch_size", "micro_batch"},
                                                                  {"micro_batch_size", "micro_batch"},
                                                                  {"gradient_accumulation_steps", "grad_accum"},
                                                                  {"accumulation_steps", "grad_accum"},
                                                                  {"memory.total", "memory_total_mib"},
                                                                  {"memory.used", "memory_used_mib"},
                                                                  {"utilization.gpu", "utilization"},
                                                                  {"nproc", "cores"},
                                                                  {"parameters", "params"}};
    for (const auto& [from, to] : aliases)
        if (k == from) return to;
    return nullptr;
}

inline void only(const nlohmann::json& o, std::initializer_list<const char*> keys, const std::string& where, const std::string& prefix) {
    if (!o.is_object()) bad(where, prefix.empty() ? "scenario" : prefix.substr(0, prefix.size() - 1), "must be a JSON object");
    for (auto it = o.begin(); it != o.end(); ++it) {
        const std::string& k = it.key();  // not a structured binding: clang 14 cannot capture one
        if (std::any_of(keys.begin(), keys.end(), [&](const char* x) { return k == x; })) continue;
        std::string hint;
        if (const char* a = known_alias(k); a && std::any_of(keys.begin(), keys.end(), [&](const char* x) { return std::string(x) == a; }))
            hint = std::string(": this schema calls it ") + prefix + a;
        else {
            const char* best = nullptr;
            std::size_t best_d = 3;  // at most 2 edits away
            for (const char* x : keys)
                if (const std::size_t d = feedline::detail::edit_distance(k, x); d < best_d) best = x, best_d = d;
            if (best) hint = std::string(" (did you mean ") + prefix + best + "?)";
        }
        bad(where, prefix + k, "unknown field" + hint);
    }
}

// A fraction in [0, 1]; a number in (1, 100] reads as a percentage and the error says how to write it.
inline void fraction(const std::optional<double>& v, const std::string& where, const std::string& field) {
    if (!v || *v <= 1) return;
    if (*v >= 2 && *v <= 100) bad(where, field, fmt::format("is a fraction in [0, 1]: {:g}% is {:g}", *v, *v / 100));
    bad(where, field, "is a fraction in [0, 1]");
}

inline void not_above(const std::optional<double>& used, const std::optional<double>& total, const std::string& where,
                      const std::string& field) {
    if (used && total && *used > *total) bad(where, field, fmt::format("{} is more than the total {}", *used, *total));
}

}  // namespace detail

// The scenario schema (docs/sizing.md): {"gpus": [...], "host": {...}, "training": {...}, "process": {...}, "numa": {...}}.
inline observations parse_scenario(const nlohmann::json& j, const std::string& where) {
    using namespace detail;
    only(j, {"gpus", "host", "training", "process", "numa"}, where, "");
    observations o;
    if (auto g = j.find("gpus"); g != j.end()) {
        if (!g->is_array()) bad(where, "gpus", "must be an array");
        for (std::size_t i = 0; i < g->size(); ++i) {
            const auto& e = (*g)[i];
            const std::string p = "gpus[" + std::to_string(i) + "].";
            only(e, {"memory_total_mib", "memory_used_mib", "utilization", "peak_tflops"}, where, p);
            gpu_observation x{number(e, "memory_total_mib", where, p), number(e, "memory_used_mib", where, p),
                              number(e, "utilization", where, p), number(e, "peak_tflops", where, p)};
            fraction(x.utilization, where, p + "utilization");
            not_above(x.memory_used_mib, x.memory_total_mib, where, p + "memory_used_mib");
            o.gpus.push_back(x);
        }
    }
    if (auto h = j.find("host"); h != j.end()) {
        only(*h, {"cores", "ram_total_mib", "ram_used_mib", "swap_total_mib", "swap_used_mib", "cpu_utilization"}, where, "host.");
        o.cores = number(*h, "cores", where, "host.");
        o.cpu_utilization = number(*h, "cpu_utilization", where, "host.");
        fraction(o.cpu_utilization, where, "host.cpu_utilization");
        o.ram_total_mib = number(*h, "ram_total_mib", where, "host.");
        o.ram_used_mib = number(*h, "ram_used_mib", where, "host.");
        o.swap_total_mib = number(*h, "swap_total_mib", where, "host.");
        o.swap_used_mib = number(*h, "swap_used_mib", where, "host.");
        not_above(o.ram_used_mib, o.ram_total_mib, where, "host.ram_used_mib");
        not_above(o.swap_used_mib, o.swap_total_mib, where, "host.swap_used_mib");
    }
    if (auto t = j.find("training"); t != j.end()) {
        only(*t, {"micro_batch", "grad_accum", "data_workers", "pinned_memory", "stall_fraction", "tokens_per_s", "params"}, where,
             "training.");
        o.params = number(*t, "params", where, "training.");
        o.micro_batch = number(*t, "micro_batch", where, "training.");
        o.grad_accum = number(*t, "grad_accum", where, "training.");
        o.data_workers = number(*t, "data_workers", where, "training.");
        o.stall_fraction = number(*t, "stall_fraction", where, "training.");
        o.tokens_per_s = number(*t, "tokens_per_s", where, "training.");
        fraction(o.stall_fraction, where, "training.stall_fraction");
        if (auto p = t->find("pinned_memory"); p != t->end() && !p->is_null()) {
            if (!p->is_boolean()) bad(where, "training.pinned_memory", "must be true, false or null");
            o.pinned_memory = p->get<bool>();
        }
    }
    if (auto p = j.find("process"); p != j.end()) {
        only(*p, {"rss_anon_mib", "rss_file_mib"}, where, "process.");
        o.rss_anon_mib = number(*p, "rss_anon_mib", where, "process.");
        o.rss_file_mib = number(*p, "rss_file_mib", where, "process.");
    }
    if (auto n = j.find("numa"); n != j.end()) {
        only(*n, {"gpu_node", "worker_nodes"}, where, "numa.");
        o.gpu_numa_node = number(*n, "gpu_node", where, "numa.");
        if (auto w = n->find("worker_nodes"); w != n->end()) {
            if (!w->is_array()) bad(where, "numa.worker_nodes", "must be an array of node numbers");
            for (const auto& v : *w) {
                if (!v.is_number_unsigned()) bad(where, "numa.worker_nodes", "must be an array of node numbers");
                o.worker_numa_nodes.push_back(v.get<double>());
            }
        }
    }
    return o;
}

namespace detail {

constexpr double mib = 1024.0 * 1024.0;

// A log line's number field, or nullopt when the line lacks it (or has null); anything but a number in
// [0, max] is an error naming the line and the field.
inline std::optional<double> log_number(const nlohmann::json& j, const char* key, double max, const std::string& where,
                                        const std::string& line) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    if (!it->is_number() || !(it->get<double>() >= 0 && it->get<double>() <= max))
        throw feedline::format_error(where, 0, line + ": " + key + " must be a number in [0, " + fmt::format("{:g}", max) + "]");
    return it->get<double>();
}

// What one log line says about the run beyond the stall: the telemetry feedline-train and the
// pipeline's stats lines carry (host RAM and swap, RssAnon/RssFile, the GPU through NVML) and the
// trainer's settings. Fields a line lacks leave what `o` has.
inline void read_log_fields(const nlohmann::json& j, observations& o, const std::string& where, const std::string& line) {
    // A trainer's summary nests its pipeline's stats: read first, so the trainer's own fields win.
    if (auto p = j.find("pipeline"); p != j.end() && p->is_object()) read_log_fields(*p, o, where, line + " (pipeline)");
    constexpr double any = std::numeric_limits<double>::max();
    auto set = [](std::optional<double>& to, std::optional<double> v, double scale = 1) {
        if (v) to = *v / scale;
    };
    gpu_observation g = o.gpus.empty() ? gpu_observation{} : o.gpus.front();
    set(g.utilization, log_number(j, "gpu_utilization", 1, where, line));
    set(g.memory_used_mib, log_number(j, "gpu_memory_used_bytes", any, where, line), mib);
    set(g.memory_total_mib, log_number(j, "gpu_memory_total_bytes", any, where, line), mib);
    if (g.utilization || g.memory_total_mib) o.gpus.assign(1, g);
    const auto ram_total = log_number(j, "host_ram_total_bytes", any, where, line);
    const auto ram_available = log_number(j, "host_ram_available_bytes", any, where, line);
    if (ram_total && ram_available) {
        if (*ram_available > *ram_total)
            throw feedline::format_error(where, 0, line + ": host_ram_available_bytes is more than host_ram_total_bytes");
        o.ram_total_mib = *ram_total / mib;
        o.ram_used_mib = (*ram_total - *ram_available) / mib;
    }
    set(o.swap_total_mib, log_number(j, "swap_total_bytes", any, where, line), mib);
    set(o.swap_used_mib, log_number(j, "swap_used_bytes", any, where, line), mib);
    set(o.rss_anon_mib, log_number(j, "rss_anon_bytes", any, where, line), mib);
    set(o.rss_file_mib, log_number(j, "rss_file_bytes", any, where, line), mib);
    set(o.unmapped_files, log_number(j, "unmapped_files", any, where, line));
    set(o.remote_requests, log_number(j, "remote_requests", any, where, line));
    set(o.remote_retries, log_number(j, "remote_retries", any, where, line));
    set(o.remote_latency_p50_s, log_number(j, "remote_latency_p50_s", any, where, line));
    set(o.micro_batch, log_number(j, "micro_batch", any, where, line));
    set(o.grad_accum, log_number(j, "grad_accum", any, where, line));
    set(o.cores, log_number(j, "cores", any, where, line));
    set(o.data_workers, log_number(j, "data_workers", any, where, line));
    if (!j.contains("data_workers")) set(o.data_workers, log_number(j, "workers", any, where, line));  // a pipeline stats line
    if (auto d = j.find("datasets"); d != j.end()) {
        if (!d->is_array()) throw feedline::format_error(where, 0, line + ": datasets must be a list");
        o.domains.clear();
        for (const auto& x : *d) {
            const auto name = x.is_object() ? x.find("name") : x.end();
            if (!x.is_object() || name == x.end() || !name->is_string())
                throw feedline::format_error(where, 0, line + ": each of datasets must be an object with a name");
            o.domains.push_back({name->get<std::string>(), log_number(x, "samples", any, where, line + " datasets").value_or(0),
                                 log_number(x, "tokens", any, where, line + " datasets").value_or(0)});
        }
        o.next_step = log_number(j, "next_step", any, where, line);  // this line's, or none: never an older line's
        o.mixture_from_step = log_number(j, "mixture_from_step", any, where, line);
        o.mixture_weights_set = log_number(j, "mixture_weights_set", 1, where, line);
    }
    // A GPU ring ("pinned ring on CUDA device ...") pins its slots unless pinning failed or was off,
    // and then it holds no pinned bytes: pageable copies.
    if (auto d = j.find("device"); d != j.end() && d->is_string() && d->get<std::string>().rfind("pinned ring", 0) == 0) {
        const auto pinned = log_number(j, "pinned_bytes", any, where, line);
        o.pinned_memory = !pinned || *pinned > 0;
    }
}

}  // namespace detail

// Limits on what is read: log lines are a few hundred bytes and three levels deep; a longer or deeper
// one is refused naming it, before any parser builds it (a DOM costs ~100 bytes per level).
inline constexpr std::size_t max_line_bytes = std::size_t(16) << 20;
inline constexpr std::size_t max_depth = 64;

// Is this object a line of a log (a trainer's progress or summary line, a pipeline's stats line)
// rather than a scenario?
inline bool is_log_line(const nlohmann::json& j) {
    return j.is_object() && (j.contains("step") || j.contains("summary") ||
                             (j.contains("stall_fraction") && j.contains("unix_time") && j.contains("batches")));
}

// Parses one JSON text of at most max_depth levels; nullopt when it is not JSON.
inline std::optional<nlohmann::json> parse_bounded(const std::string& text, const std::string& where, const std::string& what) {
    if (feedline::jsonl_field_parser::deeper_than(text, max_depth))
        throw feedline::format_error(where, 0, what + " nests arrays or objects deeper than " + std::to_string(max_depth) + " levels");
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
}

namespace detail {
// std::getline with a bound: false at the end; throws format_error naming the line when it is longer
// than max_line_bytes (memory stays bounded by it whatever the input: /dev/zero has no newline).
inline bool bounded_getline(std::istream& in, std::string& line, std::size_t n, const std::string& where, bool& ended_by_newline) {
    line.clear();
    ended_by_newline = false;
    for (int c; (c = in.get()) != std::char_traits<char>::eof();) {
        if (c == '\n') {
            ended_by_newline = true;
            return true;
        }
        if (line.size() == max_line_bytes)
            throw feedline::format_error(
                where, 0, "line " + std::to_string(n) + " is longer than " + std::to_string(max_line_bytes >> 20) + " MiB: not a log line");
        line.push_back(static_cast<char>(c));
    }
    return !line.empty();
}
}  // namespace detail

// A run's JSON-lines log: feedline-train --json (progress lines and a summary line) or a pipeline's
// stats_jsonl (cumulative snapshots). The trainer's summary wins when there is one; else the last
// pipeline stats line with the most batches (its stall is cumulative); else the mean stall of the progress lines, with the
// last line's telemetry. Lines that do not start with '{' are text and skipped (the trainer's start
// line); one that does and is not a JSON object is an error naming the line, except the last line of
// a log still being written (no newline after it), which is passed over with a note.
inline observations parse_log(std::istream& in, const std::string& where) {
    observations o;
    std::string line;
    std::size_t n = 0, progress = 0;
    double stall_sum = 0, tps_sum = 0;
    std::optional<nlohmann::json> summary, last_stats;
    std::size_t summary_line = 0, stats_line = 0;
    double last_stats_batches = 0;
    bool headers_disagree = false;
    bool ended = true;
    while (detail::bounded_getline(in, line, n + 1, where, ended)) {
        ++n;
        const auto first = line.find_first_not_of(" \t\r");
        if (first == std::string::npos || line[first] != '{') continue;  // blank, or text (feedline-train's start line)
        auto parsed = parse_bounded(line, where, "line " + std::to_string(n));
        if (!parsed && !ended && in.peek() == std::char_traits<char>::eof()) {
            o.notes.push_back("line " + std::to_string(n) + " (the last) is cut short, as in a log still being written: read the " +
                              std::to_string(n - 1) + " lines before it");
            break;
        }
        if (!parsed) throw feedline::format_error(where, 0, "line " + std::to_string(n) + " is not JSON");
        nlohmann::json& j = *parsed;
        if (!j.is_object()) throw feedline::format_error(where, 0, "line " + std::to_string(n) + " is not a JSON object");
        const std::string here = "line " + std::to_string(n);
        const auto is_summary = j.find("summary");  // not value(): it throws nlohmann's own error for a non-boolean
        if (is_summary != j.end() && is_summary->is_boolean() && is_summary->get<bool>()) {
            summary = std::move(j), summary_line = n;
        } else if (const auto opts = j.find("options"); opts != j.end() && opts->is_object() && !j.contains("stall_fraction")) {
            // A stats log's first line: the options the run was given. Its batch size is the
            // micro-batch (a trainer's own lines, read later, win).
            // Pipelines of other batch sizes sharing the log (a trainer's and its evaluation's): none
            // of them is known to be the training run's, so none is taken.
            if (const auto b = detail::log_number(*opts, "batch_size", std::numeric_limits<double>::max(), where, here + " options")) {
                if (!headers_disagree && (!o.micro_batch || *o.micro_batch == *b)) {
                    o.micro_batch = *b;
                } else if (!headers_disagree) {
                    headers_disagree = true;
                    o.micro_batch.reset();
                    o.notes.push_back(here + ": pipelines of several batch sizes share this log; the micro-batch is not taken from it");
                }
            }
        } else if (j.contains("stall_fraction") && j.contains("unix_time") && j.contains("batches")) {
            detail::log_number(j, "stall_fraction", 1, where, here);
            // Lines are cumulative, so a run's latest has the most batches. Several pipelines of one
            // process (a trainer's and its evaluation's) may share a log: the one with the most
            // batches is the training run's.
            const auto batches = detail::log_number(j, "batches", std::numeric_limits<double>::max(), where, here).value_or(0);
            if (!last_stats || batches >= last_stats_batches) last_stats = std::move(j), stats_line = n, last_stats_batches = batches;
        } else if (j.contains("stall_fraction")) {
            const auto s = detail::log_number(j, "stall_fraction", 1, where, here);
            const auto t = detail::log_number(j, "tokens_per_s", std::numeric_limits<double>::max(), where, here);
            stall_sum += s.value_or(0);
            tps_sum += t.value_or(0);
            ++progress;
            detail::read_log_fields(j, o, where, here);
        }
    }
    if (!summary && !last_stats && progress == 0)
        throw feedline::format_error(where, 0,
                                     "no progress, summary or stats lines (is this a feedline-train --json log or a stats_jsonl?)");
    if (summary || last_stats) {
        const nlohmann::json& s = summary ? *summary : *last_stats;
        const std::string here = "line " + std::to_string(summary ? summary_line : stats_line);
        o.stall_fraction = detail::log_number(s, "stall_fraction", 1, where, here);
        o.tokens_per_s = detail::log_number(s, "tokens_per_s", std::numeric_limits<double>::max(), where, here);
        detail::read_log_fields(s, o, where, here);
    } else {
        o.stall_fraction = stall_sum / double(progress);
        o.tokens_per_s = tps_sum / double(progress);
    }
    return o;
}

// What `diagnose` reads from a whole input (up to a few MiB; larger inputs are logs, read by
// parse_log a line at a time): one JSON object that is not a log line is a scenario (`scenario` set),
// anything else is a log. Throws format_error/config_error naming `where` and the line or field.
inline observations parse_input(const std::string& text, const std::string& where, bool& scenario) {
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
        throw feedline::format_error(where, 0, "empty: expected a scenario or a log");
    const auto whole = feedline::jsonl_field_parser::deeper_than(text, max_depth) ? std::nullopt : parse_bounded(text, where, "the file");
    scenario = whole && whole->is_object() && !is_log_line(*whole);
    if (scenario) return parse_scenario(*whole, where);
    if (whole && !whole->is_object()) throw feedline::format_error(where, 0, "expected a JSON object (a scenario) or JSON lines (a log)");
    std::istringstream lines(text);
    return parse_log(lines, where);
}

// 0.4 GiB, 512 MiB, 31.4 GiB: sizes as a person reads them (never "0.00 GiB").
inline std::string mib_text(double mib_value) {
    if (mib_value >= 1024) return fmt::format("{:.1f} GiB", mib_value / 1024);
    if (mib_value >= 10) return fmt::format("{:.0f} MiB", mib_value);
    if (mib_value >= 1) return fmt::format("{:.1f} MiB", mib_value);
    if (mib_value * 1024 >= 1) return fmt::format("{:.0f} KiB", mib_value * 1024);  // never "0.0 MiB"
    return fmt::format("{:.0f} bytes", mib_value * 1024 * 1024);
}

// 1.2 M, 7.0 B, 850: counts as a person reads them (no scientific notation).
inline std::string human_count(double v) {
    if (v >= 1e12) return fmt::format("{:.1f} T", v / 1e12);
    if (v >= 1e9) return fmt::format("{:.1f} B", v / 1e9);
    if (v >= 1e6) return fmt::format("{:.1f} M", v / 1e6);
    if (v >= 1e4) return fmt::format("{:.1f} k", v / 1e3);
    return fmt::format("{:.0f}", v);
}

// Findings in the order of what they bring. First the actions with a gain estimated from the run
// (waiting for data, an idle GPU), largest first; then memory that is running out (swap, RAM), which
// can cost more than any of them; then the other actions. A busy GPU with the data ahead (gpu-bound)
// makes the data side's setup moot: those findings become info, listed right under it, so nobody adds
// loader processes and pinned memory to a host that is already short of RAM to no gain. Other info
// comes last.
inline void rank(std::vector<finding>& f) {
    const bool gpu_bound = std::any_of(f.begin(), f.end(), [](const finding& x) { return x.code == "gpu-bound"; });
    const bool short_of_ram =
        std::any_of(f.begin(), f.end(), [](const finding& x) { return x.code == "swap-in-use" || x.code == "host-memory-pressure"; });
    for (auto& x : f) {
        const bool data_side =
            x.code == "no-data-workers" || x.code == "pageable-copies" || x.code == "cores-short" || x.code == "numa-remote";
        if (!data_side) continue;
        if (gpu_bound) {
            x.severity = "info";
            x.moot_by = "gpu-bound";
            x.action = "moot while the GPU is the bottleneck (gpu-bound): " + x.action;
        } else if (short_of_ram && (x.code == "no-data-workers" || x.code == "pageable-copies")) {
            x.action += "; free host memory first: each loader process and pinned buffer takes RAM";
        }
    }
    auto tier = [](const finding& x) {
        if (x.severity == "action") {
            if (x.gain) return 0;
            if (x.code == "swap-in-use" || x.code == "host-memory-pressure") return 1;
            return 2;
        }
        if (x.code == "gpu-bound") return 3;
        if (x.moot_by == "gpu-bound") return 4;
        return 5;
    };
    std::stable_sort(f.begin(), f.end(), [&](const finding& a, const finding& b) {
        if (tier(a) != tier(b)) return tier(a) < tier(b);
        return a.gain.value_or(0) > b.gain.value_or(0);
    });
}

inline std::vector<finding> diagnose(const observations& o) {
    std::vector<finding> out;
    auto mean_util = [&]() -> std::optional<double> {
        double s = 0;
        int k = 0;
        for (const auto& g : o.gpus)
            if (g.utilization) s += *g.utilization, ++k;
        return k ? std::optional<double>(s / k) : std::nullopt;
    }();
    const bool busy = mean_util && *mean_util >= gpu_busy;
    const bool data_bound = o.stall_fraction && *o.stall_fraction >= data_bound_stall;
    auto or_null = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
    // Removing a wait of s of the time: 1 / (1 - s) the tokens/s.
    const std::optional<double> stall_gain =
        data_bound ? std::optional<double>(1 / (1 - std::min(*o.stall_fraction, 0.99)) - 1) : std::nullopt;

    if (o.stall_fraction && *o.stall_fraction >= data_bound_stall)
        out.push_back(
            {"data-bound",
             "action",
             {{"stall_fraction", *o.stall_fraction}, {"data_workers", o.data_workers ? nlohmann::json(*o.data_workers) : nlohmann::json()}},
             fmt::format(
                 "the trainer waited for data {:.1f}% of its time: raise the data workers{}, deepen the prefetch, or tokenize ahead "
                 "(feedline-pack) instead of on the fly",
                 100 * *o.stall_fraction, o.data_workers ? fmt::format(" (now {:g})", *o.data_workers) : std::string()),
             stall_gain});
    // Starved by object storage: the waits are requests' latency, which more requests in flight hide.
    if (o.stall_fraction && *o.stall_fraction >= data_bound_stall && o.remote_requests && *o.remote_requests > 0)
        out.push_back(
            {"remote-bound",
             "action",
             {{"stall_fraction", *o.stall_fraction},
              {"remote_requests", *o.remote_requests},
              {"remote_latency_p50_s", o.remote_latency_p50_s ? nlohmann::json(*o.remote_latency_p50_s) : nlohmann::json()}},
             fmt::format(
                 "the data comes from object storage{} and the trainer waited {:.1f}% of its time: keep more requests in flight "
                 "(FEEDLINE_S3_MAX_REQUESTS per worker, more workers), or copy the data to local disk; feedline-doctor check "
                 "--data URL measures how many a rate needs (docs/remote.md)",
                 o.remote_latency_p50_s ? fmt::format(" at {:.0f} ms a request (p50)", *o.remote_latency_p50_s * 1e3) : std::string(),
                 100 * *o.stall_fraction),
             stall_gain});
    if (o.remote_requests && o.remote_retries && *o.remote_requests > 0 && *o.remote_retries / *o.remote_requests >= remote_retried)
        out.push_back({"remote-retries",
                       "info",
                       {{"remote_requests", *o.remote_requests}, {"remote_retries", *o.remote_retries}},
                       fmt::format("{:.1f}% of the requests to object storage were retried (5xx, SlowDown, resets or stalls): the store "
                                   "or the network pushes back; fewer requests in flight, or a store closer to the job",
                                   100 * *o.remote_retries / *o.remote_requests)});
    if (busy && (!o.stall_fraction || *o.stall_fraction < gpu_ahead_stall))
        out.push_back(
            {"gpu-bound",
             "info",
             {{"gpu_utilization", *mean_util}, {"stall_fraction", o.stall_fraction ? nlohmann::json(*o.stall_fraction) : nlohmann::json()}},
             "the GPU is busy and the data side is ahead: more data workers or prefetch will not speed this run up"});
    // A GPU below 90% busy that no data stall explains: what decides the cause, and how to measure it.
    if (mean_util && !busy && !data_bound) {
        std::string why;
        if (!o.stall_fraction)
            why =
                "how long the trainer waits for data is not known, and it decides the cause: measure it in the training loop (the "
                "time spent getting the next batch over the step's time; feedline's stats().stall_fraction). 5% or more: the "
                "loader is short (more workers, pinned memory, data packed ahead); under 2%: the GPU waits on the training "
                "process itself";
        else
            why = fmt::format("the trainer waited for data only {:.1f}% of its time, so the GPU waits on the training process itself",
                              100 * *o.stall_fraction);
        std::string cpu;
        if (o.cpu_utilization)
            cpu = *o.cpu_utilization < cpu_idle
                      ? fmt::format(
                            " The CPUs are {:.0f}% busy: not short of cores; look for waits (host syncs such as .item() or "
                            ".cpu() each step, logging, checkpoints, collective communication).",
                            100 * *o.cpu_utilization)
                      : fmt::format(
                            " The CPUs are {:.0f}% busy: the training process may be short of CPU (Python between kernel "
                            "launches, an optimizer on the CPU, loader processes competing with it).",
                            100 * *o.cpu_utilization);
        out.push_back({"gpu-underused",
                       "action",
                       {{"gpu_utilization", *mean_util},
                        {"stall_fraction", or_null(o.stall_fraction)},
                        {"cpu_utilization", or_null(o.cpu_utilization)}},
                       fmt::format("the GPU is busy {:.0f}% of the time (a fed GPU is at 90% or more): {}. Between steps it then waits "
                                   "on kernel launches and Python between them, host syncs, small kernels or communication: profile "
                                   "one step (torch.profiler, nsys), raise the micro-batch, capture the step in a CUDA graph.{}",
                                   100 * *mean_util, why, cpu),
                       gpu_busy / std::max(*mean_util, 0.01) - 1});
    }
    // The fullest GPU decides how far the micro-batch can grow: data-parallel ranks hold the same model,
    // and the one with the most memory in use (its activations, another process) runs out first.
    if (o.micro_batch && o.grad_accum) {
        std::optional<std::size_t> fullest;
        double share = 0;
        for (std::size_t i = 0; i < o.gpus.size(); ++i) {
            const auto& g = o.gpus[i];
            if (!g.memory_total_mib || !g.memory_used_mib || *g.memory_total_mib <= 0) continue;
            if (const double s = *g.memory_used_mib / *g.memory_total_mib; !fullest || s > share) fullest = i, share = s;
        }
        // Memory grows at most linearly with the micro-batch (weights and optimizer states do not
        // grow at all): the factor keeps even that bound under 95%, and divides the accumulation,
        // so the global batch stays what it is.
        double k = 1;
        if (fullest && share <= gpu_memory_headroom)
            while (*o.grad_accum / (2 * k) >= 1 && std::fmod(*o.grad_accum, 2 * k) == 0 && share * 2 * k <= gpu_memory_target) k *= 2;
        if (k >= 2) {
            const auto& g = o.gpus[*fullest];
            out.push_back(
                {"gpu-memory-headroom",
                 "action",
                 {{"gpu", *fullest},
                  {"memory_used_mib", *g.memory_used_mib},
                  {"memory_total_mib", *g.memory_total_mib},
                  {"utilization", or_null(g.utilization)},
                  {"micro_batch", *o.micro_batch},
                  {"grad_accum", *o.grad_accum}},
                 fmt::format("GPU {} (the fullest{}) uses {:.0f}% of its memory: micro-batch {:g} -> {:g} and gradient accumulation "
                             "{:g} -> {:g} keep the global batch ({:g} sequences per GPU per step) with {:g}x fewer, larger kernels. "
                             "Compare tokens/s, not steps/s, after the change: each micro-batch then holds more tokens. A checkpoint "
                             "resumes with the new shape where the loader takes a whole step's rows at once and splits them into "
                             "micro-batches (feedline-train does; a feedline pipeline given batch_size = micro-batch x accumulation does)",
                             *fullest, o.gpus.size() > 1 ? fmt::format(" of {}", o.gpus.size()) : std::string(), 100 * share,
                             *o.micro_batch, *o.micro_batch * k, *o.grad_accum, *o.grad_accum / k, *o.micro_batch * *o.grad_accum, k)});
        }
    }
    if (o.ram_total_mib && o.ram_used_mib && *o.ram_total_mib > 0 && *o.ram_used_mib / *o.ram_total_mib >= host_memory_pressure) {
        const double avail = *o.ram_total_mib - *o.ram_used_mib;
        // Who holds it: the training process's own (anonymous) memory, against the page cache it maps,
        // which the kernel reclaims; loader processes each hold their own copy of the dataset object.
        std::string who =
            o.rss_anon_mib
                ? fmt::format(" The training process holds {} of its own memory{}.", mib_text(*o.rss_anon_mib),
                              o.rss_file_mib ? fmt::format(" and maps {} of files (page cache, reclaimable)", mib_text(*o.rss_file_mib))
                                             : std::string())
                : std::string();
        if (o.data_workers && *o.data_workers > 0)
            who += fmt::format(" Each of the {:g} loader worker processes holds its own copy of what the dataset object keeps in memory.",
                               *o.data_workers);
        out.push_back({"host-memory-pressure",
                       "action",
                       {{"ram_used_mib", *o.ram_used_mib},
                        {"ram_total_mib", *o.ram_total_mib},
                        {"rss_anon_mib", or_null(o.rss_anon_mib)},
                        {"data_workers", or_null(o.data_workers)}},
                       fmt::format("host RAM is {:.0f}% used ({} free): find what holds it before adding anything (`ps -eo rss,pid,comm "
                                   "--sort=-rss | head`; RssAnon in /proc/PID/status is a process's own memory, RssFile mapped page "
                                   "cache).{}",
                                   100 * *o.ram_used_mib / *o.ram_total_mib, mib_text(avail), who)});
    }
    if (o.swap_used_mib && *o.swap_used_mib >= swap_in_use_mib)
        out.push_back({"swap-in-use",
                       "action",
                       {{"swap_used_mib", *o.swap_used_mib},
                        {"swap_total_mib", o.swap_total_mib ? nlohmann::json(*o.swap_total_mib) : nlohmann::json()}},
                       fmt::format("{} swapped out: a training step that touches swapped pages waits for the disk; free memory "
                                   "(fewer loader processes, a smaller prefetch) or turn swap off on training nodes",
                                   mib_text(*o.swap_used_mib))});
    if (o.data_workers && *o.data_workers == 0)
        out.push_back({"no-data-workers",
                       "action",
                       {{"data_workers", 0}},
                       "batches are prepared on the training process's own thread, between steps: give the loader workers (DataLoader "
                       "num_workers, or feedline, whose workers are threads) so the next batch is ready when a step ends"});
    if (o.pinned_memory && !*o.pinned_memory)
        out.push_back(
            {"pageable-copies",
             "action",
             {{"pinned_memory", false}},
             "batches are copied to the GPU from pageable memory, which runs at a fraction of pinned bandwidth (0.11x on an H100, "
             "docs/benchmarks.md) and cannot overlap compute: pin_memory=True, or feedline's pinned ring"});
    if (o.cores && !o.gpus.empty() && o.data_workers) {
        const double need = double(o.gpus.size()) * (1 + *o.data_workers) + feedline::os_reserve_cores;
        if (*o.cores < need)
            out.push_back(
                {"cores-short",
                 "action",
                 {{"cores", *o.cores}, {"gpus", o.gpus.size()}, {"data_workers", *o.data_workers}, {"cores_needed", need}},
                 fmt::format("{:g} cores for {} training process(es) with {:g} data workers each and {} for the OS ({:g} needed): fewer "
                             "workers per process, or a machine with more cores",
                             *o.cores, o.gpus.size(), *o.data_workers, feedline::os_reserve_cores, need)});
    }
    if (o.rss_anon_mib && o.rss_file_mib && *o.rss_file_mib >= 1024 && *o.rss_file_mib >= *o.rss_anon_mib)
        out.push_back({"mmap-counted-as-rss",
                       "info",
                       {{"rss_anon_mib", *o.rss_anon_mib}, {"rss_file_mib", *o.rss_file_mib}},
                       fmt::format("{:.0f} MiB of the process's RSS are mapped file pages (the dataset in the page cache, shared and "
                                   "reclaimable), against {:.0f} MiB of its own memory: not a leak, and not what the process costs",
                                   *o.rss_file_mib, *o.rss_anon_mib)});
    if (o.unmapped_files && *o.unmapped_files > 0)
        out.push_back({"files-unmapped",
                       "action",
                       {{"unmapped_files", *o.unmapped_files}},
                       fmt::format("{:g} of the data's files are read with a syscall per window instead of from a mapping: the process "
                                   "reached its budget of mappings under vm.max_map_count (each mapped shard is one); raise it "
                                   "above twice the data's files (sysctl -w vm.max_map_count=262144), or pack the domains into fewer, "
                                   "larger shards",
                                   *o.unmapped_files)});
    if (o.gpu_numa_node) {
        std::set<double> away;
        for (double n : o.worker_numa_nodes)
            if (n != *o.gpu_numa_node) away.insert(n);
        if (!away.empty())
            out.push_back(
                {"numa-remote",
                 "action",
                 {{"gpu_node", *o.gpu_numa_node}, {"worker_nodes", o.worker_numa_nodes}},
                 fmt::format("data workers run on NUMA node(s) other than the GPU's ({:g}): their batches cross the inter-socket link "
                             "before PCIe; pin them to the GPU's node",
                             *o.gpu_numa_node)});
    }
    // Model FLOPs utilization: 6 FLOPs per parameter per token (forward and backward) over the GPUs' peak.
    if (o.tokens_per_s && o.params && *o.params > 0 && !o.gpus.empty()) {
        std::optional<double> peak;
        for (const auto& g : o.gpus)
            if (g.peak_tflops && *g.peak_tflops > 0) peak = *g.peak_tflops;
        // Figures typed by hand can be absurd (1e300 parameters): no finding rather than an infinite one.
        const double mfu = peak ? 6 * *o.params * *o.tokens_per_s / (double(o.gpus.size()) * *peak * 1e12) : 0;
        if (peak && std::isfinite(mfu)) {
            out.push_back(
                {"mfu",
                 "info",
                 {{"mfu", mfu}, {"tokens_per_s", *o.tokens_per_s}, {"params", *o.params}, {"gpus", o.gpus.size()}, {"peak_tflops", *peak}},
                 fmt::format("{:.1f}% model FLOPs utilization ({} tokens/s x 6 x {} parameters over {} GPU(s) of {:g} TFLOP/s); "
                             "30-50% is usual for dense transformers. Compare tokens/s, not steps/s, when the batch shape changes",
                             100 * mfu, human_count(*o.tokens_per_s), human_count(*o.params), o.gpus.size(), *peak)});
        }
    }
    rank(out);
    return out;
}

inline bool needs_action(const std::vector<finding>& f) {
    return std::any_of(f.begin(), f.end(), [](const finding& x) { return x.severity == "action"; });
}

}  // namespace feedline::doctor
