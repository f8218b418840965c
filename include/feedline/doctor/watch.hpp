// feedline/doctor/watch.hpp: `feedline-doctor watch`: samples a running training process, any trainer
// (PyTorch or not), and the machine around it, then turns what it saw into the scenario `diagnose`
// reads. From /proc: the process tree (the trainer and its children, e.g. DataLoader worker
// processes), each process's CPU time, anonymous and file-backed resident memory, locked and pinned
// memory (where the kernel counts it) and threads, the bytes it read; the host's CPU utilization, RAM,
// swap and swap traffic. From NVML (when present): each GPU's utilization and memory. From the run's
// feedline log, when it keeps one: the stall its loop measured, tokens/s and the batch shape. Nothing is written to the process; reading another user's process
// needs the rights /proc asks for (its owner or root).
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <feedline/device/nvml.hpp>
#include <feedline/doctor/check.hpp>
#include <feedline/doctor/diagnose.hpp>
#include <feedline/exec/host_memory.hpp>
#include <feedline/exec/topology.hpp>

namespace feedline::doctor {

struct watch_options {
    double seconds = 0;     // how long to watch; 0: until the process ends
    double interval = 0.5;  // seconds between samples
    // The run's own JSON-lines log, read once the watch ends when it has lines: a feedline pipeline's
    // stats_jsonl (every pipeline of a command watch starts appends to one, FEEDLINE_STATS_JSONL) or a
    // feedline-train --json log. Empty: none.
    std::string log;
};

// One process as /proc shows it at one moment.
struct process_reading {
    pid_t pid = 0, ppid = 0;
    std::string name;                           // comm
    double cpu_seconds = 0;                     // user + system, since it started
    double rss_anon_mib = 0, rss_file_mib = 0;  // RssAnon, RssFile (+ RssShmem)
    unsigned threads = 0;
    double locked_mib = 0;             // VmLck + VmPin: mlock'd and pinned pages, where the kernel counts them
    std::optional<double> read_bytes;  // /proc/PID/io read_bytes (storage reads), when readable
};

namespace detail {

// /proc/PID/stat and status and io; nullopt when the process is gone (or was never there).
inline std::optional<process_reading> read_process(pid_t pid) {
    const std::string dir = "/proc/" + std::to_string(pid);
    std::ifstream stat(dir + "/stat");
    std::string text;
    if (!stat || !std::getline(stat, text)) return std::nullopt;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields count from the last ')'.
    const auto open = text.find('('), close = text.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
    process_reading r;
    r.pid = pid;
    r.name = text.substr(open + 1, close - open - 1);
    std::istringstream rest(text.substr(close + 2));
    std::vector<std::string> f;
    for (std::string w; rest >> w && f.size() < 20;) f.push_back(w);
    // A zombie has ended: only its parent has not reaped it yet (a --pid whose parent is busy).
    if (f.size() < 13 || f[0] == "Z") return std::nullopt;
    // After ')': state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
    r.ppid = static_cast<pid_t>(std::stol(f[1]));
    static const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
    r.cpu_seconds = (std::stod(f[11]) + std::stod(f[12])) / tick;
    std::ifstream status(dir + "/status");
    for (std::string line; std::getline(status, line);) {
        std::istringstream in(line);
        std::string key;
        double v = 0;
        in >> key >> v;
        if (key == "RssAnon:") r.rss_anon_mib = v / 1024;
        if (key == "RssFile:" || key == "RssShmem:") r.rss_file_mib += v / 1024;
        if (key == "Threads:") r.threads = static_cast<unsigned>(v);
        if (key == "VmLck:" || key == "VmPin:") r.locked_mib += v / 1024;
    }
    std::ifstream io(dir + "/io");
    for (std::string line; std::getline(io, line);)
        if (line.rfind("read_bytes:", 0) == 0) r.read_bytes = std::stod(line.substr(11));
    return r;
}

// The process `root` and all its descendants alive now (by their parent pids).
inline std::vector<process_reading> read_tree(pid_t root) {
    std::map<pid_t, process_reading> all;
    for (const auto& e : std::filesystem::directory_iterator("/proc", std::filesystem::directory_options::skip_permission_denied)) {
        const std::string n = e.path().filename().string();
        if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos) continue;
        if (auto r = read_process(static_cast<pid_t>(std::stol(n)))) all.emplace(r->pid, std::move(*r));
    }
    std::vector<process_reading> out;
    if (!all.count(root)) return out;
    std::set<pid_t> in_tree{root};
    out.push_back(all[root]);
    for (std::size_t i = 0; i < out.size(); ++i)  // breadth first: children of what is already in
        for (const auto& [pid, r] : all)
            if (r.ppid == out[i].pid && in_tree.insert(pid).second) out.push_back(r);
    return out;
}

// The host's CPU time: (busy, total) jiffies from /proc/stat's first line.
inline std::optional<std::pair<double, double>> read_host_cpu() {
    std::ifstream f("/proc/stat");
    std::string cpu;
    if (!(f >> cpu) || cpu != "cpu") return std::nullopt;
    double v[10] = {};
    for (double& x : v) f >> x;
    const double idle = v[3] + v[4], total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    return std::pair{total - idle, total};
}

// Pages swapped in and out since boot (/proc/vmstat).
inline std::pair<double, double> read_swap_traffic() {
    std::ifstream f("/proc/vmstat");
    double in = 0, out = 0;
    std::string key;
    double v = 0;
    while (f >> key >> v) {
        if (key == "pswpin") in = v;
        if (key == "pswpout") out = v;
    }
    return {in, out};
}

}  // namespace detail

// What watch saw: the observations diagnose reads, the scenario JSON that holds them (feedline-doctor
// diagnose reads it back), and the figures behind them.
struct watch_report {
    observations seen;
    nlohmann::json scenario, summary;
};

// Samples the process `pid` and its descendants every `o.interval` until it ends or `o.seconds` pass
// (or `stop()` says so). Throws io_error naming the pid when it is not there at the start.
inline watch_report watch(
    pid_t pid, const watch_options& o, const std::function<bool()>& stop = [] { return false; }) {
    using clock = std::chrono::steady_clock;
    // There at the start, ended or not (a command that ended at once is a zombie until reaped).
    if (!std::filesystem::exists("/proc/" + std::to_string(pid)))
        throw feedline::io_error("/proc/" + std::to_string(pid), ESRCH, "no such process to watch");
    const machine m = read_machine("/");  // the GPUs as check finds them (sysfs, NVML, CUDA)
    const auto& topo = m.topo;
    // GPUs through NVML, each sampled on its own thread (the mean over the watch).
    std::vector<std::unique_ptr<feedline::gpu_sampler>> gpus;
    std::string gpu_note = m.gpus.empty() ? "no GPU (" + m.gpu_source + ")" : "no GPU NVML can sample";
    for (const auto& g : m.gpus)
        if (auto s = g.visible ? feedline::gpu_sampler::for_gpu(g.where.pci_bus_id, &gpu_note) : nullptr) gpus.push_back(std::move(s));
    for (auto& g : gpus) g->take();  // start the means now

    const auto start = clock::now();
    const auto cpu0 = detail::read_host_cpu();
    const auto swap0 = detail::read_swap_traffic();
    std::map<pid_t, process_reading> first, last;     // each process's first and latest reading
    std::map<pid_t, std::pair<double, double>> peak;  // each process's most anonymous and file-backed memory
    double ram_used_peak = 0, samples = 0;
    unsigned processes_peak = 0, threads_peak = 0;
    double anon_peak = 0, file_peak = 0, tree_anon_peak = 0, tree_locked_peak = 0;
    for (;;) {
        const auto tree = detail::read_tree(pid);
        if (tree.empty()) break;  // it ended
        ++samples;
        double tree_anon = 0, tree_locked = 0;
        unsigned threads = 0;
        for (const auto& r : tree) {
            first.emplace(r.pid, r);
            last[r.pid] = r;
            auto& [anon, file] = peak[r.pid];
            anon = std::max(anon, r.rss_anon_mib), file = std::max(file, r.rss_file_mib);
            tree_anon += r.rss_anon_mib;
            tree_locked += r.locked_mib;
            threads += r.threads;
        }
        anon_peak = std::max(anon_peak, tree.front().rss_anon_mib);
        file_peak = std::max(file_peak, tree.front().rss_file_mib);
        tree_anon_peak = std::max(tree_anon_peak, tree_anon);
        tree_locked_peak = std::max(tree_locked_peak, tree_locked);
        processes_peak = std::max(processes_peak, static_cast<unsigned>(tree.size()));
        threads_peak = std::max(threads_peak, threads);
        const auto mem = feedline::read_host_memory({});
        if (mem.used()) ram_used_peak = std::max(ram_used_peak, static_cast<double>(*mem.used()) / (1024.0 * 1024.0));
        const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
        if ((o.seconds > 0 && elapsed >= o.seconds) || stop()) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(o.interval));
    }
    const double wall = std::max(1e-3, std::chrono::duration<double>(clock::now() - start).count());
    const auto cpu1 = detail::read_host_cpu();
    const auto swap1 = detail::read_swap_traffic();
    const auto mem = feedline::read_host_memory({});

    watch_report w;
    observations& s = w.seen;
    s.cores = topo.usable_cores();
    if (mem.total) s.ram_total_mib = static_cast<double>(*mem.total) / (1024.0 * 1024.0);
    if (s.ram_total_mib) s.ram_used_mib = std::min(ram_used_peak, *s.ram_total_mib);
    if (mem.swap_total) s.swap_total_mib = static_cast<double>(*mem.swap_total) / (1024.0 * 1024.0);
    if (mem.swap_used()) s.swap_used_mib = static_cast<double>(*mem.swap_used()) / (1024.0 * 1024.0);
    if (cpu0 && cpu1 && cpu1->second > cpu0->second)
        s.cpu_utilization = std::clamp((cpu1->first - cpu0->first) / (cpu1->second - cpu0->second), 0.0, 1.0);
    if (samples > 0) {
        s.rss_anon_mib = anon_peak;
        s.rss_file_mib = file_peak;
    }
    // Child processes are loader workers (PyTorch's DataLoader); a trainer without any may still load
    // with threads (feedline's own), so none leaves data_workers unknown rather than 0.
    if (processes_peak > 1) s.data_workers = processes_peak - 1;
    for (auto& g : gpus)
        if (auto i = g->take()) {
            gpu_observation x;
            x.utilization = i->utilization;
            if (i->memory_used) x.memory_used_mib = static_cast<double>(*i->memory_used) / (1024.0 * 1024.0);
            if (i->memory_total) x.memory_total_mib = static_cast<double>(*i->memory_total) / (1024.0 * 1024.0);
            s.gpus.push_back(x);
        }

    // Per process: the CPU it used over the watch (in cores), its peak memory.
    nlohmann::json procs = nlohmann::json::array();
    double tree_cpu = 0, tree_read = 0;
    for (const auto& [p, r] : last) {
        const double cpu = (r.cpu_seconds - first.at(p).cpu_seconds) / wall;
        tree_cpu += cpu;
        if (r.read_bytes && first.at(p).read_bytes) tree_read += *r.read_bytes - *first.at(p).read_bytes;
        procs.push_back({{"pid", p},
                         {"name", r.name},
                         {"cpu_cores", cpu},
                         {"rss_anon_mib", peak[p].first},  // peaks: a process's last reading may be after it freed all
                         {"rss_file_mib", peak[p].second},
                         {"threads", r.threads}});
    }
    std::sort(procs.begin(), procs.end(), [](const auto& a, const auto& b) { return a["cpu_cores"] > b["cpu_cores"]; });
    const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
    w.summary = {{"pid", pid},
                 {"seconds", wall},
                 {"samples", samples},
                 {"processes_peak", processes_peak},
                 {"threads_peak", threads_peak},
                 {"tree_cpu_cores", tree_cpu},
                 {"tree_rss_anon_mib_peak", tree_anon_peak},
                 {"tree_locked_mib_peak", tree_locked_peak},  // CUDA's pinned host memory is not always counted here
                 {"read_bytes_per_s", tree_read / wall},
                 {"swap_in_mib_per_s", (swap1.first - swap0.first) * page / (1024.0 * 1024.0) / wall},
                 {"swap_out_mib_per_s", (swap1.second - swap0.second) * page / (1024.0 * 1024.0) / wall},
                 {"gpu_source", gpus.empty() ? gpu_note : "nvml"},
                 {"processes", procs}};

    // What the run says of itself, where it keeps a feedline log: the stall the loop measured (what no
    // outside view can tell: a GPU below 90% busy is starved or not), tokens/s, the batch shape, the
    // loader's workers (threads, which /proc does not tell from the trainer's) and pinning. What watch
    // sampled over the whole watch (GPUs, host, memory) stays.
    std::error_code ec;  // a log that is not a regular file (a FIFO, /dev/stderr) is not read back
    if (!o.log.empty() && std::filesystem::is_regular_file(o.log, ec) && std::filesystem::file_size(o.log, ec) > 0 && !ec) {
        w.summary["feedline_log"] = o.log;
        try {
            std::ifstream in(o.log);
            const observations own = parse_log(in, o.log);
            s.stall_fraction = own.stall_fraction;
            s.tokens_per_s = own.tokens_per_s;
            if (own.micro_batch) s.micro_batch = own.micro_batch;
            if (own.grad_accum) s.grad_accum = own.grad_accum;
            if (own.data_workers) s.data_workers = own.data_workers;
            if (own.pinned_memory) s.pinned_memory = own.pinned_memory;
            if (s.gpus.empty()) s.gpus = own.gpus;
            for (const auto& n : own.notes) s.notes.push_back(o.log + ": " + n);
        } catch (const std::exception& e) {
            w.summary["feedline_log_error"] = e.what();  // the watch's own figures still stand
        }
    }

    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
    nlohmann::json gpu_list = nlohmann::json::array();
    for (const auto& g : s.gpus)
        gpu_list.push_back({{"memory_total_mib", opt(g.memory_total_mib)},
                            {"memory_used_mib", opt(g.memory_used_mib)},
                            {"utilization", opt(g.utilization)}});
    w.scenario = {{"gpus", gpu_list},
                  {"host",
                   {{"cores", opt(s.cores)},
                    {"ram_total_mib", opt(s.ram_total_mib)},
                    {"ram_used_mib", opt(s.ram_used_mib)},
                    {"swap_total_mib", opt(s.swap_total_mib)},
                    {"swap_used_mib", opt(s.swap_used_mib)},
                    {"cpu_utilization", opt(s.cpu_utilization)}}},
                  {"training",
                   {{"data_workers", opt(s.data_workers)},
                    {"micro_batch", opt(s.micro_batch)},
                    {"grad_accum", opt(s.grad_accum)},
                    {"stall_fraction", opt(s.stall_fraction)},
                    {"tokens_per_s", opt(s.tokens_per_s)},
                    {"pinned_memory", s.pinned_memory ? nlohmann::json(*s.pinned_memory) : nlohmann::json()}}},
                  {"process", {{"rss_anon_mib", opt(s.rss_anon_mib)}, {"rss_file_mib", opt(s.rss_file_mib)}}}};
    return w;
}

}  // namespace feedline::doctor
