// feedline-doctor: sizes a training job from its model and machine (plan), says whether this machine
// is set up right and what it delivers on a dataset (check), and why a GPU waits from what a run
// measured (diagnose). Exit status: 0 when nothing needs action (the job fits; no finding asks for
// action), 1 when something does, 2 for bad input (the message names the field).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>

#include <feedline/doctor/check.hpp>
#include <feedline/doctor/diagnose.hpp>
#include <feedline/doctor/measure.hpp>
#include <feedline/doctor/mixture_totals.hpp>
#include <feedline/doctor/plan.hpp>
#include <feedline/doctor/watch.hpp>
#include <feedline/pipeline/detail/telemetry.hpp>
#include "tool_main.hpp"

namespace doctor = feedline::doctor;

namespace {

// A number with an optional unit after it (spaces allowed between), scaled by the unit's factor.
// Throws config_error naming `field`, with `example` and the units known, for anything else.
double parse_scaled(const std::string& text, const char* field, const std::vector<std::pair<std::string, double>>& units, const char* what,
                    const char* example) {
    std::size_t used = 0;
    double v = 0;
    try {
        v = std::stod(text, &used);
    } catch (const std::exception&) {
        throw feedline::config_error(field, "'" + text + "' is not " + what + " (e.g. " + example + ")");
    }
    std::string unit = text.substr(used);
    unit.erase(0, unit.find_first_not_of(' '));
    std::string known;
    for (const auto& [name, scale] : units) {
        if (unit == name) {
            if (!(v >= 0) || !std::isfinite(v * scale)) throw feedline::config_error(field, "'" + text + "' must be " + what + " >= 0");
            return v * scale;
        }
        if (!name.empty()) known += (known.empty() ? "" : ", ") + name;
    }
    throw feedline::config_error(field, "'" + text + "': unknown unit '" + unit + "' (" + known + ")");
}

// "80GiB", "1.5e9", "512 MiB", "2TB": bytes. Binary units are 1024^n, decimal ones 1000^n.
double parse_bytes(const std::string& text, const char* field) {
    static const std::vector<std::pair<std::string, double>> units = {
        {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},          {"GB", 1e9},
        {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", doctor::gib}, {"TiB", doctor::gib * 1024}};
    return parse_scaled(text, field, units, "a size", "80GiB, 1.5e9");
}

// "7B", "1.3e9", "350M", "70 b": a parameter count (k, M, B or G, T: powers of 1000).
double parse_count(const std::string& text, const char* field) {
    static const std::vector<std::pair<std::string, double>> units = {{"", 1},    {"k", 1e3}, {"K", 1e3}, {"M", 1e6},  {"m", 1e6},
                                                                      {"B", 1e9}, {"b", 1e9}, {"G", 1e9}, {"T", 1e12}, {"t", 1e12}};
    return parse_scaled(text, field, units, "a count", "7B, 350M, 1.3e9");
}

// Figures as a person reads them: 512 MiB, 31.4 GiB (never "0.00 GiB"), 17 cores (never "1 cores").
std::string human(const doctor::figure& f) {
    if (f.value == 0 && f.unit != "cores") return "0";  // not computed, or nothing: the rule says which
    const auto bytes = [](double v) { return (v < 0 ? "-" : "") + doctor::mib_text(std::abs(v) / (1024.0 * 1024.0)); };
    if (f.unit == "bytes") return bytes(f.value);
    if (f.unit == "bytes/s") return bytes(f.value) + "/s";
    if (f.unit == "tokens/s") return doctor::human_count(f.value) + " tokens/s";
    if (f.unit == "cores") return fmt::format("{:g} core{}", f.value, f.value == 1 ? "" : "s");
    return fmt::format("{:g} {}", f.value, f.unit);
}

nlohmann::json to_json(const std::vector<doctor::figure>& figures) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& f : figures) out[f.name] = {{"value", f.value}, {"unit", f.unit}, {"rule", f.rule}};
    return out;
}

// --config FILE.json: an object whose keys are the flags' names ("zero-stage": 2, "offload-optimizer":
// true); turned into arguments placed before the command line's, which therefore win.
std::vector<std::string> config_arguments(const std::string& path) {
    std::string text;
    try {
        text = feedline::read_regular_file(path, std::uint64_t(1) << 20);  // a FIFO is refused, not waited on
    } catch (const feedline::io_error& e) {
        throw feedline::config_error("config", e.what());
    }
    nlohmann::json j;
    try {
        if (feedline::jsonl_field_parser::deeper_than(text, doctor::max_depth))
            throw feedline::config_error("config", path + ": nested too deep");
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw feedline::config_error("config", path + ": not JSON: " + e.what());
    }
    if (!j.is_object()) throw feedline::config_error("config", path + ": expected a JSON object of flag names and values");
    std::vector<std::string> args;
    for (const auto& [key, value] : j.items()) {
        if (key == "config") throw feedline::config_error("config", path + ": a config file cannot name another");
        if (value.is_boolean()) {
            if (value.get<bool>()) args.push_back("--" + key);
        } else if (value.is_number() || value.is_string()) {
            args.push_back("--" + key);
            args.push_back(value.is_string() ? value.get<std::string>() : value.dump());
        } else {
            throw feedline::config_error(key, path + ": expected a number, a string or true/false");
        }
    }
    return args;
}

// Most useful first (doctor::rank); a finding made moot by another is indented under it.
void print_findings(const std::vector<doctor::finding>& findings) {
    for (const auto& x : findings) {
        const char* indent = x.moot_by.empty() ? "" : "    ";
        const std::string gain =
            x.gain ? fmt::format(" (gain: {}{:.0f}% tokens/s)", x.code == "gpu-underused" ? "up to +" : "+", 100 * *x.gain) : std::string();
        std::printf("%s%s [%s]%s: %s\n%s  evidence: %s\n", indent, x.code.c_str(), x.severity.c_str(), gain.c_str(), x.action.c_str(),
                    indent, tools::json_text(x.evidence).c_str());
    }
}

nlohmann::json findings_json(const std::vector<doctor::finding>& findings) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& x : findings) {
        nlohmann::json f{{"code", x.code},
                         {"severity", x.severity},
                         {"evidence", x.evidence},
                         {"action", x.action},
                         {"gain", x.gain ? nlohmann::json(*x.gain) : nlohmann::json()}};
        if (!x.moot_by.empty()) f["moot_by"] = x.moot_by;
        list.push_back(std::move(f));
    }
    return list;
}

// The most of a scenario file read whole (a scenario is a small JSON object; anything larger is a log,
// read a line at a time).
constexpr std::uint64_t max_scenario_bytes = std::uint64_t(16) << 20;

// `mixture`: a mixture file whose schedule each domain's total in the log is checked against.
int run_diagnose(const std::string& path, const std::string& mixture, bool json) {
    // A regular file only: a FIFO without a writer would block the open forever, /dev/zero would be
    // read until memory ran out.
    feedline::require_regular_file(path);
    std::ifstream f(path, std::ios::binary);
    if (!f) throw feedline::io_error(path, errno, "cannot open");
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    doctor::observations o;
    bool scenario = false;
    if (!ec && size <= max_scenario_bytes) {
        o = doctor::parse_input(feedline::read_regular_file(path, max_scenario_bytes), path, scenario);
    } else {
        o = doctor::parse_log(f, path);
    }
    auto findings = doctor::diagnose(o);
    if (!mixture.empty()) {
        if (scenario) throw feedline::config_error("mixture", "checks a run's log, not a scenario");
        feedline::require_regular_file(mixture);
        for (auto& f : doctor::mixture_totals(o, feedline::read_regular_file(mixture, feedline::max_mixture_file_bytes), mixture))
            findings.push_back(std::move(f));
        doctor::rank(findings);
    }
    if (json) {
        std::printf("%s\n", tools::json_text(nlohmann::json{{"findings", findings_json(findings)},
                                                            {"needs_action", doctor::needs_action(findings)},
                                                            {"input", scenario ? "scenario" : "log"},
                                                            {"notes", o.notes}})
                                .c_str());
    } else {
        for (const auto& note : o.notes) std::printf("note: %s\n", note.c_str());
        if (findings.empty())
            std::printf("feedline-doctor diagnose: no findings in %s\n", path.c_str());
        else
            print_findings(findings);
    }
    return doctor::needs_action(findings) ? 1 : 0;
}

std::string rate(double bytes_per_s) { return fmt::format("{:.2f} GB/s", bytes_per_s / 1e9); }

int run_check(const std::string& root, const doctor::check_job& job, const doctor::measure_options& m, bool measure_h2d, bool json) {
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) throw feedline::config_error("root", root + ": not a directory");
    const doctor::machine machine = doctor::read_machine(root);
    const auto findings = doctor::check(machine, job);
    nlohmann::json out{
        {"machine", doctor::describe(machine)}, {"findings", findings_json(findings)}, {"needs_action", doctor::needs_action(findings)}};
    if (!m.data.empty()) {
        if (root != "/") throw feedline::config_error("data", "measures this machine: not with --root");
        out["data"] = {{"dataset", m.data}, {"reads", doctor::measure_reads(m)}, {"pipeline", doctor::measure_pipeline(m)}};
        out["cpu_adam"] = doctor::measure_cpu_adam(m.seconds);  // what plan's --cpu-adam-params-per-s wants
        // With a GPU: the same pipeline into GPU memory through the pinned ring, at the most workers.
        if (feedline::gpu_probe()) {
            const unsigned most = m.max_workers ? m.max_workers : std::max(1u, static_cast<unsigned>(machine.topo.usable_cores()));
            out["data"]["pipeline_gpu"] = doctor::measure_pipeline_once(m, most, "auto");
        }
    }
    if (measure_h2d) out["h2d"] = doctor::measure_h2d();
    if (json) {
        std::printf("%s\n", tools::json_text(out).c_str());
    } else {
        const auto& d = out["machine"];
        const auto n = [](double v, const char* one, const char* many) { return fmt::format("{:g} {}", v, v == 1 ? one : many); };
        const auto mib = [&](const char* key) { return d[key].is_null() ? 0.0 : d[key].get<double>() / (1024.0 * 1024.0); };
        const std::string swap = mib("swap_total_bytes") == 0 ? std::string("no swap")
                                                              : fmt::format("swap {} used of {}", doctor::mib_text(mib("swap_used_bytes")),
                                                                            doctor::mib_text(mib("swap_total_bytes")));
        std::printf(
            "feedline-doctor check: %s (%s allowed%s), %s per core, %s, %s RAM (%s available), %s, io_uring: %s\n  GPUs: %zu (%s)\n",
            n(d["usable_cores"].get<double>(), "usable core", "usable cores").c_str(), d["allowed_cpus"].get<std::string>().c_str(),
            d["cgroup_cpu_quota"].is_null() ? "" : fmt::format(", cgroup quota {:g}", d["cgroup_cpu_quota"].get<double>()).c_str(),
            d["threads_per_core"].is_null() ? "? threads" : n(d["threads_per_core"].get<double>(), "thread", "threads").c_str(),
            n(double(d["numa_nodes"].size()), "NUMA node", "NUMA nodes").c_str(), doctor::mib_text(mib("ram_total_bytes")).c_str(),
            doctor::mib_text(mib("ram_available_bytes")).c_str(), swap.c_str(), d["io_uring"].get<std::string>().c_str(), d["gpus"].size(),
            d["gpu_source"].get<std::string>().c_str());
        for (const auto& g : d["gpus"]) {
            std::string line =
                fmt::format("    {} on NUMA node {} (CPUs {})", g["pci_bus_id"].get<std::string>(), g["numa_node"].get<int>(),
                            g["local_cpus"].get<std::string>().empty() ? "?" : g["local_cpus"].get<std::string>());
            if (!g["link_speed"].get<std::string>().empty())
                line += fmt::format(", link {} x{} of {} x{}", g["link_speed"].get<std::string>(), g["link_width"].get<int>(),
                                    g["max_link_speed"].get<std::string>(), g["max_link_width"].get<int>());
            if (g.contains("name")) line += ", " + g["name"].get<std::string>();
            if (g.contains("memory_used_bytes") && g.contains("memory_total_bytes"))
                line += fmt::format(" with {:.1f} of {:.1f} GiB in use", g["memory_used_bytes"].get<double>() / doctor::gib,
                                    g["memory_total_bytes"].get<double>() / doctor::gib);
            if (g.value("mig", false)) line += " (MIG on: the whole GPU's figures)";
            if (!g["visible"].get<bool>()) line += " (not visible to this process: another job's, or hidden from this container)";
            std::printf("%s\n", line.c_str());
        }
        if (out.contains("data")) {
            const auto& reads = out["data"]["reads"];
            if (reads.value("remote", false)) {
                std::printf("  remote reads of %s (%llu objects, %s):\n", m.data.c_str(), reads["files"].get<unsigned long long>(),
                            fmt::format("{:.0f} MiB", reads["dataset_bytes"].get<double>() / 1048576).c_str());
                if (reads.contains("latency_p50_s"))
                    std::printf(
                        "    latency of one %llu-byte window: %.1f ms (p50), %.1f ms (slowest of 16)\n"
                        "    one stream %s, 16 at once %s; %.0f windows/s with 16 in flight\n"
                        "    1 M tokens/s of windows needs %.0f requests in flight (each worker keeps FEEDLINE_S3_MAX_REQUESTS)\n",
                        reads["window_bytes"].get<unsigned long long>(), reads["latency_p50_s"].get<double>() * 1e3,
                        reads["latency_max_s"].get<double>() * 1e3, rate(reads["one_stream_bytes_per_s"]).c_str(),
                        rate(reads["sixteen_streams_bytes_per_s"]).c_str(), reads["windows_per_s_16_in_flight"].get<double>(),
                        reads["in_flight_per_million_tokens_per_s"].get<double>());
            } else {
                std::printf("  reads of %s (%s per pass of %s, 1 MiB requests):\n", m.data.c_str(),
                            fmt::format("{:.0f} MiB", reads["bytes_per_pass"].get<double>() / 1048576).c_str(),
                            fmt::format("{:.0f} MiB", reads["dataset_bytes"].get<double>() / 1048576).c_str());
                for (const char* b : {"mmap", "pread", "io_uring"}) {
                    const auto& r = out["data"]["reads"][b];
                    if (r.contains("unavailable"))
                        std::printf("    %-8s unavailable: %s\n", b, r["unavailable"].get<std::string>().c_str());
                    else
                        std::printf("    %-8s cold %s, warm %s\n", b, rate(r["cold_bytes_per_s"]).c_str(),
                                    rate(r["warm_bytes_per_s"]).c_str());
                }
            }
            std::printf("  pipeline (batch %llu x %llu tokens, host memory):\n", static_cast<unsigned long long>(m.batch_size),
                        static_cast<unsigned long long>(m.seq_len));
            for (const auto& row : out["data"]["pipeline"])
                std::printf(
                    "    %u worker(s): %.3g tokens/s%s\n", row["workers"].get<unsigned>(), row["tokens_per_s"].get<double>(),
                    row.contains("tokenize_tokens_per_s_per_worker")
                        ? fmt::format(" (one worker tokenizes {:.3g} tokens/s)", row["tokenize_tokens_per_s_per_worker"].get<double>())
                              .c_str()
                        : "");
            if (out["data"].contains("pipeline_gpu")) {
                const auto& g = out["data"]["pipeline_gpu"];
                std::printf("    into the GPU, %u worker(s): %.3g tokens/s (%s)\n", g["workers"].get<unsigned>(),
                            g["tokens_per_s"].get<double>(), g["device"].get<std::string>().c_str());
            }
        }
        if (out.contains("cpu_adam"))
            std::printf("  an offloaded optimizer (CPU Adam, fp32 states) on one core: %s parameters/s (plan --cpu-adam-params-per-s)\n",
                        doctor::human_count(out["cpu_adam"]["params_per_s_per_core"].get<double>()).c_str());
        if (out.contains("h2d")) {
            const auto& h = out["h2d"];
            if (h.contains("unavailable"))
                std::printf("  host-to-device: %s\n", h["unavailable"].get<std::string>().c_str());
            else
                std::printf("  host-to-device: pinned %s, pageable %s (%.2fx)\n", rate(h["pinned_bytes_per_s"]).c_str(),
                            rate(h["pageable_bytes_per_s"]).c_str(), h["pageable_vs_pinned"].get<double>());
        }
        if (findings.empty()) std::printf("no findings\n");
        print_findings(findings);
    }
    return doctor::needs_action(findings) ? 1 : 0;
}

// watch: the process `pid` (or the command it runs, started here and stopped with SIGTERM when
// --seconds runs out), then its findings and, with --scenario, the scenario diagnose reads back.
int run_watch(pid_t pid, const std::vector<std::string>& command, doctor::watch_options o, const std::string& scenario_path, bool json) {
    if ((pid > 0) == !command.empty()) throw feedline::config_error("watch", "give --pid N or a command after --, one of them");
    int child_status = -1;
    std::function<bool()> stop = [] { return false; };
    // A command's feedline pipelines append their stats lines to a log of watch's own (or to the one
    // FEEDLINE_STATS_JSONL already names, or --log), read when the watch ends; removed after.
    std::string own_log;
    struct remove_log {
        const std::string& path;
        ~remove_log() {
            if (!path.empty()) ::unlink(path.c_str());
        }
    } remove{own_log};
    if (!command.empty()) {
        const std::string variable = feedline::detail::stats_jsonl_variable;
        std::vector<std::string> env_text;
        for (char** e = environ; *e; ++e)
            if (std::string_view(*e).substr(0, variable.size() + 1) != variable + "=") env_text.emplace_back(*e);  // set below
        const char* inherited = std::getenv(variable.c_str());
        if (o.log.empty() && inherited && *inherited) o.log = inherited;
        if (o.log.empty()) {
            std::string path = (std::filesystem::temp_directory_path() / "feedline-watch-XXXXXX").string();
            const int fd = ::mkstemp(path.data());
            if (fd >= 0) {
                ::close(fd);
                own_log = o.log = path;
            }
        }
        if (!o.log.empty()) env_text.push_back(variable + "=" + o.log);
        std::vector<char*> env;
        for (auto& e : env_text) env.push_back(e.data());
        env.push_back(nullptr);
        std::vector<char*> argv;
        for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        if (const int e = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), env.data()); e != 0)
            throw feedline::io_error(command[0], e, "cannot start the command to watch");
        stop = [&] {  // reaped as soon as it ends: a zombie would look alive in /proc
            int st = 0;
            if (::waitpid(pid, &st, WNOHANG) == pid) child_status = st;
            return child_status != -1;
        };
    }
    auto stop_command = [&] {  // --seconds ran out (or the watch failed): stop it, as a scheduler would
        if (command.empty() || child_status != -1) return;
        ::kill(pid, SIGTERM);
        for (int i = 0; i < 100 && ::waitpid(pid, &child_status, WNOHANG) == 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (child_status == -1) ::kill(pid, SIGKILL), ::waitpid(pid, &child_status, 0);
    };
    doctor::watch_report w;
    try {
        w = doctor::watch(pid, o, stop);
    } catch (...) {
        stop_command();  // never left running, nor its log removed under it
        throw;
    }
    stop_command();
    if (!scenario_path.empty()) {
        std::ofstream f(scenario_path);
        f << w.scenario.dump(1) << "\n";
        if (!f) throw feedline::io_error(scenario_path, errno, "cannot write the scenario");
    }
    const auto findings = doctor::diagnose(w.seen);
    if (json) {
        std::printf("%s\n", tools::json_text(nlohmann::json{{"findings", findings_json(findings)},
                                                            {"needs_action", doctor::needs_action(findings)},
                                                            {"scenario", w.scenario},
                                                            {"watched", w.summary}})
                                .c_str());
    } else {
        const auto& m = w.summary;
        std::printf(
            "feedline-doctor watch: pid %d for %.1f s (%g samples): up to %u process%s and %u thread%s; the tree used %.2f cores, "
            "held up to %s of its own memory, read %s/s; swap in %.1f MiB/s, out %.1f MiB/s; GPUs: %s\n",
            static_cast<int>(pid), m["seconds"].get<double>(), m["samples"].get<double>(), m["processes_peak"].get<unsigned>(),
            m["processes_peak"].get<unsigned>() == 1 ? "" : "es", m["threads_peak"].get<unsigned>(),
            m["threads_peak"].get<unsigned>() == 1 ? "" : "s", m["tree_cpu_cores"].get<double>(),
            doctor::mib_text(m["tree_rss_anon_mib_peak"].get<double>()).c_str(),
            doctor::mib_text(m["read_bytes_per_s"].get<double>() / (1024.0 * 1024.0)).c_str(), m["swap_in_mib_per_s"].get<double>(),
            m["swap_out_mib_per_s"].get<double>(),
            w.seen.gpus.empty() ? m["gpu_source"].get<std::string>().c_str() : std::to_string(w.seen.gpus.size()).c_str());
        if (w.seen.stall_fraction)
            std::printf("its feedline log (%s): the loop waited %.1f%% of its time for data, %s tokens/s\n",
                        m["feedline_log"].get<std::string>().c_str(), 100 * *w.seen.stall_fraction,
                        w.seen.tokens_per_s ? doctor::human_count(*w.seen.tokens_per_s).c_str() : "?");
        else if (m.contains("feedline_log_error"))
            std::printf("its feedline log was not read: %s\n", m["feedline_log_error"].get<std::string>().c_str());
        for (const auto& p : m["processes"])
            std::printf("  %7d %-16s %5.2f cores  %s own, %s mapped, %u thread(s)\n", p["pid"].get<int>(),
                        p["name"].get<std::string>().c_str(), p["cpu_cores"].get<double>(),
                        doctor::mib_text(p["rss_anon_mib"].get<double>()).c_str(),
                        doctor::mib_text(p["rss_file_mib"].get<double>()).c_str(), p["threads"].get<unsigned>());
        if (findings.empty()) std::printf("no findings\n");
        print_findings(findings);
    }
    if (!command.empty() && WIFEXITED(child_status) && WEXITSTATUS(child_status) != 0)
        std::fprintf(stderr, "feedline-doctor watch: the command exited with status %d\n", WEXITSTATUS(child_status));
    return doctor::needs_action(findings) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "feedline-doctor: what a training job needs (plan), whether this machine is set up for it (check), and why a GPU waits (diagnose)"};
    app.require_subcommand(1);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

    doctor::plan_input in;
    std::string gpu_memory = "80GiB", gpu_reserve = "1GiB", dataset_bytes = "0", process_overhead = "4GiB", config;
    bool json = false;
    CLI::App* plan = app.add_subcommand("plan", "GPU memory, host memory, CPU cores and read bandwidth a data-parallel job needs");
    plan->add_option("--config", config, "JSON object with these flags' names as keys (flags on the command line win)");
    std::string params;
    plan->add_option("--params", params, "model parameters (7B, 350M, 1.3e9); or give the shape below");
    plan->add_option("--layers", in.layers, "transformer layers");
    plan->add_option("--hidden", in.hidden, "hidden size");
    plan->add_option("--heads", in.heads, "attention heads");
    plan->add_option("--vocab", in.vocab, "vocabulary size");
    plan->add_option("--precision", in.precision, "bf16 | fp16 (mixed precision, fp32 master weights) | fp32")->capture_default_str();
    plan->add_option("--optimizer", in.optimizer, "adamw | sgd (with momentum)")->capture_default_str();
    plan->add_option("--gpus", in.gpus, "GPUs per node (one data-parallel rank each)")->capture_default_str();
    plan->add_option("--nodes", in.nodes, "nodes")->capture_default_str();
    plan->add_option("--zero-stage", in.zero_stage, "0: replicated; 1: optimizer states partitioned; 2: + gradients; 3: + parameters")
        ->capture_default_str();
    plan->add_flag("--offload-optimizer", in.offload_optimizer, "optimizer states in host memory (ZeRO-Offload)");
    plan->add_option("--micro-batch", in.micro_batch, "sequences per GPU per forward pass")->capture_default_str();
    plan->add_option("--seq-len", in.seq_len, "tokens per sequence")->capture_default_str();
    plan->add_option("--grad-accum", in.grad_accum, "micro-batches per optimizer step")->capture_default_str();
    plan->add_flag("--activation-checkpointing", in.activation_checkpointing, "recompute each layer's activations in the backward pass");
    plan->add_option("--gpu-memory", gpu_memory, "memory of one GPU (80GiB, 141GB, ...)")->capture_default_str();
    plan->add_option("--gpu-reserve", gpu_reserve, "per GPU: CUDA context, workspaces, allocator slack")->capture_default_str();
    plan->add_option("--tokens-per-s-per-gpu", in.tokens_per_s_per_gpu, "expected training rate of one GPU");
    plan->add_option("--gpu-tflops", in.gpu_tflops, "or: the GPU's dense peak (bf16 TFLOP/s), with --mfu");
    plan->add_option("--mfu", in.mfu, "model FLOPs utilisation expected of --gpu-tflops")->capture_default_str();
    plan->add_option("--data", in.data, "shards (pre-tokenized) | text (tokenized on the fly)")->capture_default_str();
    plan->add_option("--worker-tokens-per-s", in.worker_tokens_per_s,
                     "tokens/s one data worker delivers (default: measured, see docs/sizing.md)");
    plan->add_option("--cpu-adam-params-per-s", in.cpu_adam_params_per_s,
                     "parameters one core updates per second as an offloaded optimizer (default: measured; feedline-doctor check "
                     "--data measures this machine's)");
    plan->add_option("--dataset-bytes", dataset_bytes, "dataset size to keep in each node's page cache (0: not counted)")
        ->capture_default_str();
    plan->add_option("--process-overhead", process_overhead, "host memory of one training process besides its data")->capture_default_str();
    plan->add_option("--os-cores", in.os_cores, "cores left to the OS per node")->capture_default_str();
    plan->add_option("--prefetch", in.prefetch, "batches staged ahead per GPU (pinned)")->capture_default_str();
    plan->add_flag("--json", json, "one JSON object: every figure (bytes, cores, bytes/s, tokens/s) with its rule");

    std::string input;
    CLI::App* diag = app.add_subcommand("diagnose", "findings with stable codes from a scenario file or a run's JSON-lines log");
    diag->add_option("input", input, "a scenario (JSON object, docs/sizing.md) or a feedline-train --json log")->required();
    diag->add_flag("--json", json, "one JSON object: {\"findings\": [{code, severity, evidence, action}], ...}");
    std::string diag_mixture;
    diag->add_option("--mixture", diag_mixture,
                     "a mixture file: check each domain's total in the log against its schedule (within one sample)");

    std::string root = "/";
    doctor::check_job job;
    doctor::measure_options measure;
    bool h2d = false;
    CLI::App* chk = app.add_subcommand(
        "check", "this machine's cores, NUMA, GPUs, memory, swap and I/O, with findings; --data measures it on a dataset");
    chk->add_option("--root", root, "read /sys and /proc under this directory instead (a copied or fixture tree)")->capture_default_str();
    chk->add_option("--gpus", job.gpus, "GPUs the job uses (0: all found)")->capture_default_str();
    chk->add_option("--workers", job.workers_per_gpu, "data workers per GPU (0: what feedline would pick)")->capture_default_str();
    chk->add_option("--data", measure.data, "measure reads per backend and the pipeline's tokens/s with 1..N workers on this dataset");
    tools::add_storage_flags(*chk);
    chk->add_option("--tokenizer", measure.tokenizer, "sentencepiece model, for text data");
    std::uint64_t read_mib = 0;
    chk->add_option("--read-mib", read_mib, "MiB read per backend and pass (0: 4 GiB or half the available memory, if less)")
        ->capture_default_str();
    chk->add_option("--seconds", measure.seconds, "time per worker count")->capture_default_str()->check(CLI::PositiveNumber);
    chk->add_option("--max-workers", measure.max_workers, "most workers to measure (0: the usable cores)")->capture_default_str();
    chk->add_option("--batch-size", measure.batch_size, "sequences per batch")->capture_default_str()->check(CLI::PositiveNumber);
    chk->add_option("--seq-len", measure.seq_len, "tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
    chk->add_flag("--h2d", h2d, "with a GPU: host-to-device copy rates from pinned and pageable memory");
    chk->add_flag("--json", json, "one JSON object: {\"machine\": {...}, \"findings\": [...], \"data\": {...}}");

    pid_t watch_pid = 0;
    std::vector<std::string> watch_command;
    std::string watch_scenario;
    doctor::watch_options watching;
    CLI::App* wat = app.add_subcommand(
        "watch", "samples a training process (any trainer) and the machine, then gives the findings: watch -- CMD ARGS..., or --pid N");
    wat->add_option("--pid", watch_pid, "a running process to watch (with its child processes)");
    wat->add_option("--seconds", watching.seconds, "how long to watch (0: until the process ends); a command is then stopped (SIGTERM)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    wat->add_option("--interval", watching.interval, "seconds between samples")->capture_default_str()->check(CLI::Range(0.01, 60.0));
    wat->add_option("--log", watching.log,
                    "the run's feedline log to read at the end: a pipeline's stats_jsonl or a feedline-train --json log (a command "
                    "watch starts logs its pipelines' stats by itself, FEEDLINE_STATS_JSONL)");
    wat->add_option("--scenario", watch_scenario, "write what was seen as a scenario file (feedline-doctor diagnose reads it)");
    wat->add_flag("--json", json, "one JSON object: {\"findings\", \"scenario\", \"watched\": per-process figures}");
    wat->add_option("command", watch_command, "the training command to start and watch, after --");

    try {
        // A --config file's values go first, so the command line's override them.
        std::vector<std::string> args(argv + 1, argv + argc);
        for (std::size_t i = 0; i + 1 < args.size(); ++i)
            if (args[i] == "--config") {
                auto extra = config_arguments(args[i + 1]);
                args.insert(args.begin() + static_cast<std::ptrdiff_t>(i), extra.begin(), extra.end());
                break;
            }
        std::reverse(args.begin(), args.end());  // CLI11 parses a vector taken from its back
        app.parse(args);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    } catch (const feedline::error& e) {
        std::fprintf(stderr, "feedline-doctor: %s\n", e.what());
        return 2;
    }

    if (chk->parsed()) {
        measure.read_bytes = read_mib << 20;
        return tools::run_tool("feedline-doctor", 2, [&] { return run_check(root, job, measure, h2d, json); });
    }
    if (diag->parsed()) return tools::run_tool("feedline-doctor", 2, [&] { return run_diagnose(input, diag_mixture, json); });
    if (wat->parsed())
        return tools::run_tool("feedline-doctor", 2, [&] { return run_watch(watch_pid, watch_command, watching, watch_scenario, json); });

    return tools::run_tool("feedline-doctor", 2, [&] {
        if (!params.empty()) in.params = parse_count(params, "params");
        in.gpu_memory = parse_bytes(gpu_memory, "gpu-memory");
        in.gpu_reserve = parse_bytes(gpu_reserve, "gpu-reserve");
        in.dataset_bytes = parse_bytes(dataset_bytes, "dataset-bytes");
        in.process_overhead = parse_bytes(process_overhead, "process-overhead");
        const doctor::plan_result r = doctor::make_plan(in);
        if (json) {
            nlohmann::json out = {{"params", r.params},
                                  {"ranks", r.ranks},
                                  {"fits", r.fits},
                                  {"min_ranks", r.min_ranks},
                                  {"would_fit", r.would_fit},
                                  {"per_gpu", to_json(r.per_gpu)},
                                  {"per_node", to_json(r.per_node)}};
            std::printf("%s\n", tools::json_text(out).c_str());
        } else {
            std::printf(
                "feedline-doctor plan: %s parameters, %llu data-parallel rank(s) (%llu GPU(s) x %llu node(s)), ZeRO stage %u%s, %s, %s\n",
                doctor::human_count(r.params).c_str(), static_cast<unsigned long long>(r.ranks), static_cast<unsigned long long>(in.gpus),
                static_cast<unsigned long long>(in.nodes), in.zero_stage, in.offload_optimizer ? " (optimizer offloaded)" : "",
                in.precision.c_str(), in.optimizer.c_str());
            for (const auto& [title, list] : {std::pair{"per GPU", &r.per_gpu}, {"per node", &r.per_node}}) {
                std::printf("%s:\n", title);
                for (const auto& f : *list) std::printf("  %-22s %16s   %s\n", f.name.c_str(), human(f).c_str(), f.rule.c_str());
            }
            const double margin_mib = r.get("gpu_memory_margin").value / (1024.0 * 1024.0);
            if (r.fits) {
                std::printf("fits: %s of GPU memory to spare\n", doctor::mib_text(margin_mib).c_str());
            } else {
                std::printf("does not fit: %s short per GPU%s\n", doctor::mib_text(-margin_mib).c_str(),
                            r.min_ranks == 0 ? ", and no number of GPUs holds it with these settings" : "");
                if (r.would_fit.empty())
                    std::printf("nothing within these settings' reach fits it: a GPU with more memory, tensor or pipeline parallelism\n");
                else
                    std::printf("what would fit it (one change each):\n");
                for (const auto& w : r.would_fit) std::printf("  %s\n", w.c_str());
            }
        }
        return r.fits ? 0 : 1;
    });
}
