// feedline/doctor/check.hpp: is this machine set up for training. Reads the machine through feedline's
// topology and memory readers (so a fixture tree under a root describes a machine we do not have):
// usable cores (affinity, cgroup quota), SMT, NUMA nodes and each GPU's node and link, RAM, swap and
// vm.swappiness, the locked-memory limit, transparent hugepages, io_uring; on the live machine the GPUs
// through NVML (cudaGetDeviceCount without it). The rules turn what was read into findings with stable
// codes, like diagnose's; docs/sizing.md lists them with their thresholds.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <feedline/device/cuda_runtime.hpp>
#include <feedline/device/nvml.hpp>
#include <feedline/exec/host_memory.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/storage/reader.hpp>

#include <feedline/doctor/diagnose.hpp>

namespace feedline::doctor {

// One GPU: where it sits (sysfs) and, on the live machine with NVML, what it holds.
struct gpu_status {
    feedline::gpu_info where;
    std::optional<feedline::gpu_reading> nvml;
    // Whether this process can use it. /sys/bus/pci is not namespaced: a container given 1 of 8 GPUs
    // sees all 8 there, but NVML (which opens /dev/nvidiaN) reports only its own.
    bool visible = true;
};

struct machine {
    feedline::topology topo;
    feedline::host_memory memory;
    std::optional<std::string> io_uring_unavailable;  // why not; nullopt: usable
    std::vector<gpu_status> gpus;
    int cuda_devices = -1;          // cudaGetDeviceCount's answer (live only; -1: not asked)
    int cuda_visible_devices = -1;  // entries of CUDA_VISIBLE_DEVICES (live only; -1: not set)
    std::string gpu_source;         // "nvml", "cuda", "sysfs", and why not the better ones
};

// Reads the machine under `root` ("/": this one, with NVML and CUDA; anything else: the files there).
inline machine read_machine(const std::string& root = "/") {
    const bool live = root == "/";
    machine m;
    m.topo = feedline::read_topology({.root = root});
    m.memory = feedline::read_host_memory({.root = root});
    if (live) {
        m.io_uring_unavailable = feedline::io_uring_unavailable_reason();
    } else if (auto s = feedline::detail::read_first_line(feedline::detail::under(root, "/proc/sys/kernel/io_uring_disabled"))) {
        // 0: allowed; 1: only for privileged processes (or the io_uring_group); 2: for nobody (Linux 6.6+).
        if (*s == "2") m.io_uring_unavailable = "kernel.io_uring_disabled = 2: io_uring is off for every process";
        if (*s == "1") m.io_uring_unavailable = "kernel.io_uring_disabled = 1: io_uring is for privileged processes only";
    }
    for (const auto& g : m.topo.gpus) m.gpus.push_back({g, std::nullopt});
    if (!live) {
        m.gpu_source = "sysfs (a fixture: no NVML)";
        return m;
    }
    // CUDA_VISIBLE_DEVICES: CUDA uses the entries up to the first invalid one ("-1", "" hide the rest).
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
        m.cuda_visible_devices = 0;
        for (std::string_view s = v;;) {
            const auto comma = s.find(',');
            const auto entry = s.substr(0, comma);
            if (entry.empty() || entry[0] == '-') break;
            ++m.cuda_visible_devices;
            if (comma == std::string_view::npos) break;
            s.remove_prefix(comma + 1);
        }
    }
    const auto& nv = feedline::nvml::get();
    if (nv.available()) {
        for (unsigned i = 0; i < nv.count(); ++i) {
            auto r = nv.read(i);
            if (!r) continue;
            auto it = std::find_if(m.gpus.begin(), m.gpus.end(),
                                   [&](const gpu_status& s) { return !r->pci_bus_id.empty() && s.where.pci_bus_id == r->pci_bus_id; });
            if (it == m.gpus.end()) it = m.gpus.insert(m.gpus.end(), gpu_status{{.pci_bus_id = r->pci_bus_id}, std::nullopt});
            it->nvml = r;
        }
    }
    // Which of them this process can use: sysfs lists every GPU of the machine (/sys/bus/pci is not
    // namespaced). CUDA's own list where CUDA answers (after CUDA_VISIBLE_DEVICES and the container's
    // device nodes), else NVML's (the container's device nodes), else all of them.
    const auto probe = feedline::gpu_probe();
    m.cuda_devices = probe.devices;
    if (probe) {
        std::vector<std::array<unsigned, 3>> cuda_ids;
        for (int i = 0; i < probe.devices; ++i)
            if (auto id = feedline::detail::parse_pci_bus_id(feedline::gpu_pci_bus_id(i))) cuda_ids.push_back(*id);
        if (cuda_ids.size() == static_cast<std::size_t>(probe.devices))  // else CUDA could not name them all: count only
            for (auto& g : m.gpus) {
                const auto id = feedline::detail::parse_pci_bus_id(g.where.pci_bus_id);
                g.visible = id && std::find(cuda_ids.begin(), cuda_ids.end(), *id) != cuda_ids.end();
            }
    } else if (probe.none_visible) {
        for (auto& g : m.gpus) g.visible = false;
    } else if (nv.available()) {
        for (auto& g : m.gpus) g.visible = g.nvml.has_value();
    }
    if (nv.available())
        m.gpu_source = probe ? "nvml; cuda" : "nvml (" + probe.reason + ")";
    else
        m.gpu_source = probe ? "cuda (" + nv.reason() + ")" : probe.reason + "; " + nv.reason();
    return m;
}

// What the job will run, for the core count: GPUs (0: as many as the machine has) and data workers per
// GPU (0: what feedline would pick, recommend_workers).
struct check_job {
    unsigned gpus = 0, workers_per_gpu = 0;
};

inline constexpr double gpu_memory_in_use = 0.10;          // another process holds > 10% of a GPU before the job
inline constexpr std::uint64_t memlock_low = 64ull << 20;  // below 64 MiB: io_uring and mlock'd staging fail
inline constexpr int swappiness_high = 10;

inline std::vector<finding> check(const machine& m, const check_job& job = {}) {
    std::vector<finding> out;
    const auto& t = m.topo;
    // The GPUs this process can use (read_machine marks them): as many as CUDA counts where it
    // answered, else those marked, no more than CUDA_VISIBLE_DEVICES names.
    std::vector<const gpu_status*> mine;
    for (const auto& g : m.gpus)
        if (g.visible) mine.push_back(&g);
    std::size_t visible = mine.size();
    if (m.cuda_devices > 0)
        visible = static_cast<std::size_t>(m.cuda_devices);
    else if (m.cuda_visible_devices >= 0)
        visible = std::min<std::size_t>(visible, static_cast<std::size_t>(m.cuda_visible_devices));
    const unsigned gpus = job.gpus ? job.gpus : static_cast<unsigned>(visible);

    // Cores: what the affinity mask and the cgroup quota leave, against ranks + workers + the OS.
    const double usable = t.usable_cores();
    if (t.cgroup_cpu_quota && *t.cgroup_cpu_quota + 1e-9 < static_cast<double>(t.allowed_cpus.size()))
        out.push_back(
            {"cgroup-cpu-quota",
             "action",
             {{"cpu_quota", *t.cgroup_cpu_quota}, {"allowed_cpus", t.allowed_cpus.size()}},
             fmt::format("the cgroup allows {:g} CPUs of time but {} CPUs are in the affinity mask: threads beyond the quota are "
                         "throttled in bursts, which shows up as step-time spikes; size workers by the quota (feedline does) or raise it",
                         *t.cgroup_cpu_quota, t.allowed_cpus.size())});
    {
        feedline::worker_plan p = feedline::recommend_workers(t, gpus);
        const unsigned workers = job.workers_per_gpu ? job.workers_per_gpu : p.workers_per_gpu;
        const double need = std::max(1u, gpus) * (workers + 1.0) + p.os_reserve;
        nlohmann::json ev{{"usable_cores", usable}, {"gpus", gpus}, {"workers_per_gpu", workers}, {"cores_needed", need}};
        // Short only of the OS's core: a small machine (a 2-vCPU VM with the one worker feedline starts)
        // runs such a job fine, a little slower; that is what the machine is, not something to fix, so
        // it is info and a plain check exits 0 there. Short of cores for the trainers and workers
        // themselves needs action.
        const bool only_the_os = usable + 1e-9 >= need - p.os_reserve;
        if (usable + 1e-9 < need)
            out.push_back(
                {"cores-short", only_the_os ? "info" : "action", ev,
                 fmt::format("{:g} usable core{} for {} training process{} x ({} data worker{} + 1) + {} for the OS = {:g}: {}", usable,
                             usable == 1 ? "" : "s", std::max(1u, gpus), std::max(1u, gpus) == 1 ? "" : "es", workers,
                             workers == 1 ? "" : "s", p.os_reserve, need,
                             only_the_os ? "the trainers and workers fit, and share their cores with the OS (a small machine: expect "
                                           "a few percent of step time lost to the system's own work)"
                                         : "the workers will compete with the trainers; fewer workers per GPU, or more cores")});
    }
    if (t.threads_per_core > 1)
        out.push_back(
            {"smt-siblings",
             "info",
             {{"threads_per_core", t.threads_per_core}, {"usable_cores", usable}},
             fmt::format("{} hardware threads per core: the {:g} usable CPUs share the execution units of {:g} core(s); a worker "
                         "on the trainer's sibling slows the trainer (feedline keeps workers off the trainer's CPU, not its sibling)",
                         t.threads_per_core, usable, usable / t.threads_per_core)});

    // NUMA: GPUs and the CPUs near them.
    if (t.nodes.size() > 1) {
        nlohmann::json per = nlohmann::json::object();
        for (const auto* g : mine) per[g->where.pci_bus_id] = g->where.numa_node;
        out.push_back(
            {"numa-nodes",
             "info",
             {{"nodes", t.nodes.size()}, {"gpu_nodes", per}},
             fmt::format("{} NUMA nodes: each GPU's data workers and pinned staging belong on its node (feedline places them when it "
                         "can read the GPU's node; check worker_placement in its stats)",
                         t.nodes.size())});
        for (const auto* gp : mine) {
            const auto& g = *gp;
            if (g.where.local_cpus.empty()) continue;
            const bool any_allowed = std::any_of(g.where.local_cpus.begin(), g.where.local_cpus.end(), [&](int c) {
                return std::binary_search(t.allowed_cpus.begin(), t.allowed_cpus.end(), c);
            });
            if (!any_allowed)
                out.push_back(
                    {"gpu-cpus-outside-affinity",
                     "action",
                     {{"gpu", g.where.pci_bus_id}, {"gpu_node", g.where.numa_node}},
                     fmt::format("none of the CPUs near GPU {} (node {}) are in this process's affinity mask: its batches would be "
                                 "assembled on a remote node; launch its rank with the GPU's CPUs (numactl --cpunodebind={})",
                                 g.where.pci_bus_id, g.where.numa_node, g.where.numa_node)});
        }
    }

    // PCIe: a link trained narrower than the slot is a fault (a reseat, a riser); a slower speed at idle is power saving.
    for (const auto* gp : mine) {
        const auto& g = *gp;
        const auto& w = g.where;
        if (w.link_width > 0 && w.max_link_width > 0 && w.link_width < w.max_link_width)
            out.push_back(
                {"pcie-link-narrow",
                 "action",
                 {{"gpu", w.pci_bus_id}, {"link_width", w.link_width}, {"max_link_width", w.max_link_width}},
                 fmt::format("GPU {} runs its PCIe link at x{} of the x{} it supports: host-to-device copies get {:.0f}% of the bandwidth; "
                             "reseat the card, check the riser, the slot's wiring and the BIOS lane settings",
                             w.pci_bus_id, w.link_width, w.max_link_width, 100.0 * w.link_width / w.max_link_width)});
        // sysfs says "Unknown" for a link that is down: no speed to compare.
        const double speed = std::strtod(w.link_speed.c_str(), nullptr), top = std::strtod(w.max_link_speed.c_str(), nullptr);
        if (speed > 0 && top > 0 && speed < top)
            out.push_back({"pcie-link-slow",
                           "info",
                           {{"gpu", w.pci_bus_id}, {"link_speed", w.link_speed}, {"max_link_speed", w.max_link_speed}},
                           fmt::format("GPU {} link at {} of {}: normal for an idle GPU (it lowers the speed to save power); under load it "
                                       "should reach {}",
                                       w.pci_bus_id, w.link_speed, w.max_link_speed, w.max_link_speed)});
        // Not on MIG: there the figures are the whole GPU's, and other instances' memory is not this job's loss.
        if (g.nvml && !g.nvml->mig && g.nvml->memory_total && g.nvml->memory_used && *g.nvml->memory_total > 0 &&
            static_cast<double>(*g.nvml->memory_used) > gpu_memory_in_use * static_cast<double>(*g.nvml->memory_total))
            out.push_back({"gpu-memory-in-use",
                           "action",
                           {{"gpu", w.pci_bus_id},
                            {"memory_used_mib", *g.nvml->memory_used >> 20},
                            {"memory_total_mib", *g.nvml->memory_total >> 20}},
                           fmt::format("GPU {} already has {} MiB of {} MiB in use before the job: another process holds it (nvidia-smi "
                                       "lists it); the job's plan loses that much",
                                       w.pci_bus_id, *g.nvml->memory_used >> 20, *g.nvml->memory_total >> 20)});
    }
    if (mine.empty() && m.cuda_devices <= 0)
        out.push_back(
            {"no-gpu",
             "info",
             {{"source", m.gpu_source}, {"hidden_gpus", m.gpus.size()}},
             (m.gpus.empty() ? "no NVIDIA GPU found (" + m.gpu_source + ")"
                             : fmt::format("{} NVIDIA GPU(s) in the machine, none usable by this process (CUDA_VISIBLE_DEVICES or the "
                                           "container hides them; {})",
                                           m.gpus.size(), m.gpu_source)) +
                 ": feedline delivers batches to host memory, and the sample trainer trains on the CPU"});

    // Host memory: swap, and the limit a container sets below the machine's RAM.
    const auto& mem = m.memory;
    if (auto used = mem.swap_used(); used && static_cast<double>(*used) >= swap_in_use_mib * 1048576)
        out.push_back({"swap-in-use",
                       "action",
                       {{"swap_used_mib", *used >> 20}, {"swap_total_mib", *mem.swap_total >> 20}},
                       fmt::format("{} MiB are swapped out already: a step that touches a swapped page waits for the disk; free memory "
                                   "before training, or turn swap off on training nodes",
                                   *used >> 20)});
    if (mem.swap_total && *mem.swap_total > 0 && mem.swappiness && *mem.swappiness > swappiness_high)
        out.push_back({"swappiness-high",
                       "info",
                       {{"swappiness", *mem.swappiness}, {"swap_total_mib", *mem.swap_total >> 20}},
                       fmt::format("vm.swappiness is {} with swap on: under memory pressure the kernel swaps out anonymous memory (the "
                                   "trainer's) instead of dropping page cache (the dataset, which can be read again); 1-10 suits training",
                                   *mem.swappiness)});
    if (t.cgroup_memory_max && mem.total && *t.cgroup_memory_max < *mem.total)
        out.push_back({"cgroup-memory-limit",
                       "info",
                       {{"cgroup_memory_max_mib", *t.cgroup_memory_max >> 20}, {"ram_total_mib", *mem.total >> 20}},
                       fmt::format("the cgroup caps this process's memory at {} MiB of the machine's {} MiB; page cache counts against it, "
                                   "so size prefetch and memory_budget by the cap, not by free(1)",
                                   *t.cgroup_memory_max >> 20, *mem.total >> 20)});
    if (t.memlock_limit && *t.memlock_limit < memlock_low)
        out.push_back({"memlock-low",
                       "info",
                       {{"memlock_limit_bytes", *t.memlock_limit}},
                       fmt::format("ulimit -l is {} KiB: io_uring's registered buffers and any mlock'd staging are refused (feedline then "
                                   "reads without registration); CUDA's pinned memory is not limited by it. ulimit -l unlimited in the job",
                                   *t.memlock_limit >> 10)});
    if (mem.transparent_hugepages == "always")
        out.push_back({"thp-always",
                       "info",
                       {{"transparent_hugepages", mem.transparent_hugepages}},
                       "transparent hugepages are 'always': compaction to build them can stall allocating threads for milliseconds "
                       "(step-time spikes); 'madvise' keeps them for programs that ask"});
    if (m.io_uring_unavailable)
        out.push_back({"io-uring-unavailable",
                       "info",
                       {{"reason", *m.io_uring_unavailable}},
                       "io_uring is not usable (" + *m.io_uring_unavailable +
                           "): feedline reads through mmap or pread instead, which costs "
                           "more CPU per read on cold data"});
    return out;
}

// The facts check read, for --json and the text report.
inline nlohmann::json describe(const machine& m) {
    const auto& t = m.topo;
    auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(); };
    nlohmann::json gpus = nlohmann::json::array();
    for (const auto& g : m.gpus) {
        nlohmann::json j{{"pci_bus_id", g.where.pci_bus_id},
                         {"numa_node", g.where.numa_node},
                         {"local_cpus", feedline::detail::format_cpu_list(g.where.local_cpus)},
                         {"link_speed", g.where.link_speed},
                         {"link_width", g.where.link_width},
                         {"max_link_speed", g.where.max_link_speed},
                         {"max_link_width", g.where.max_link_width},
                         {"visible", g.visible}};
        if (g.nvml) {
            j["name"] = g.nvml->name;
            j["mig"] = g.nvml->mig;
            if (g.nvml->memory_total) j["memory_total_bytes"] = *g.nvml->memory_total;
            if (g.nvml->memory_used) j["memory_used_bytes"] = *g.nvml->memory_used;
            if (g.nvml->utilization) j["utilization"] = *g.nvml->utilization;
            if (g.nvml->pcie_gen) j["pcie_gen"] = *g.nvml->pcie_gen;
            if (g.nvml->pcie_width) j["pcie_width"] = *g.nvml->pcie_width;
            if (g.nvml->pcie_max_gen) j["pcie_max_gen"] = *g.nvml->pcie_max_gen;
            if (g.nvml->pcie_max_width) j["pcie_max_width"] = *g.nvml->pcie_max_width;
        }
        gpus.push_back(j);
    }
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& n : t.nodes)
        nodes.push_back({{"id", n.id}, {"cpus", feedline::detail::format_cpu_list(n.cpus)}, {"memory_bytes", n.memory_bytes}});
    return {
        {"online_cpus", t.online_cpus.size()},
        {"allowed_cpus", feedline::detail::format_cpu_list(t.allowed_cpus)},
        {"cgroup_cpu_quota", opt(t.cgroup_cpu_quota)},
        {"usable_cores", t.usable_cores()},
        {"threads_per_core", t.threads_per_core ? nlohmann::json(t.threads_per_core) : nlohmann::json()},
        {"numa_nodes", nodes},
        {"ram_total_bytes", opt(m.memory.total)},
        {"ram_available_bytes", opt(m.memory.available)},
        {"swap_total_bytes", opt(m.memory.swap_total)},
        {"swap_used_bytes", opt(m.memory.swap_used())},
        {"swappiness", opt(m.memory.swappiness)},
        {"cgroup_memory_max_bytes", opt(t.cgroup_memory_max)},
        {"memlock_limit_bytes", opt(t.memlock_limit)},  // null: unlimited (or unknown)
        {"transparent_hugepages", m.memory.transparent_hugepages},
        {"io_uring", m.io_uring_unavailable ? *m.io_uring_unavailable : std::string("available")},
        {"gpus", gpus},
        {"cuda_devices", m.cuda_devices >= 0 ? nlohmann::json(m.cuda_devices) : nlohmann::json()},  // cudaGetDeviceCount's; null: a fixture
        {"cuda_visible_devices", m.cuda_visible_devices >= 0 ? nlohmann::json(m.cuda_visible_devices) : nlohmann::json()},
        {"gpu_source", m.gpu_source}};
}

}  // namespace feedline::doctor
