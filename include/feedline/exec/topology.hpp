// feedline/exec/topology.hpp: what the machine really offers this process, and how many workers to run.
// Reads online CPUs, the affinity mask, the cgroup v2 CPU quota and memory limit, NUMA nodes (CPUs and
// memory), hugepage sizes, the locked-memory limit, and each NVIDIA GPU's NUMA node and local CPUs
// (from its PCI device in sysfs). Everything is read under a configurable root so tests can describe
// machines we do not have (tests/fixtures/topology). On the real machine libnuma answers the NUMA
// questions when it is built in. Feeds the pipeline (how many workers, their CPUs
// near the GPU, the memory budget), make_ring (the NUMA node of pinned memory) and feedline-doctor.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#if FEEDLINE_HAS_NUMA
#include <numa.h>
#endif

#include <feedline/error.hpp>

namespace feedline {

namespace detail {

// The most CPUs a list may name: Linux builds for at most 8192 (CONFIG_NR_CPUS); this leaves room and
// keeps a crafted "0-2147483646" from expanding into gigabytes.
inline constexpr int max_cpu_number = 65535;

// Parses a kernel CPU list ("0-3,8,10-11") into sorted CPU numbers. Throws config_error on garbage and
// on CPU numbers above max_cpu_number.
inline std::vector<int> parse_cpu_list(const std::string& text) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string part;
    while (std::getline(ss, part, ',')) {
        part.erase(std::remove_if(part.begin(), part.end(), [](unsigned char c) { return std::isspace(c); }), part.end());
        if (part.empty()) continue;
        auto dash = part.find('-');
        try {
            int lo = std::stoi(part.substr(0, dash));
            int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
            if (lo < 0 || hi < lo || hi > max_cpu_number) throw std::invalid_argument(part);
            for (int c = lo; c <= hi; ++c) out.push_back(c);
        } catch (const std::exception&) {
            throw config_error("cpu list", "cannot parse '" + text + "'");
        }
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

inline std::string format_cpu_list(const std::vector<int>& cpus) {
    std::string s;
    for (std::size_t i = 0; i < cpus.size();) {
        std::size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
        if (!s.empty()) s += ',';
        s += std::to_string(cpus[i]);
        if (j > i) s += '-' + std::to_string(cpus[j]);
        i = j + 1;
    }
    return s;
}

}  // namespace detail

struct numa_node_info {
    int id = 0;
    std::vector<int> cpus;
    std::uint64_t memory_bytes = 0;
};

struct gpu_info {
    std::string pci_bus_id;  // as in sysfs and cudaDeviceGetPCIBusId: "0000:1a:00.0"
    int numa_node = -1;      // -1: the firmware does not say (single-node machines)
    std::vector<int> local_cpus;
    // The PCIe link as sysfs reports it ("16.0 GT/s PCIe", lanes); empty / 0 where it does not. An idle
    // GPU lowers its link speed to save power, so only a load shows the speed it trains at.
    std::string link_speed, max_link_speed;
    int link_width = 0, max_link_width = 0;
};

struct topology {
    std::vector<int> online_cpus;
    std::vector<int> allowed_cpus;           // the process affinity mask
    std::optional<double> cgroup_cpu_quota;  // in CPUs (cpu.max quota / period); nullopt: no limit
    std::optional<std::uint64_t> cgroup_memory_max;
    std::vector<numa_node_info> nodes;
    std::vector<std::uint64_t> hugepage_sizes;   // bytes
    std::optional<std::uint64_t> memlock_limit;  // bytes; nullopt: unlimited
    std::vector<gpu_info> gpus;
    std::string numa_source;        // "libnuma" or "sysfs"
    unsigned threads_per_core = 0;  // SMT siblings of the first online CPU; 0: unknown

    // Cores this process can really use: the affinity mask, capped by the cgroup quota.
    double usable_cores() const {
        double n = static_cast<double>(allowed_cpus.empty() ? online_cpus.size() : allowed_cpus.size());
        return cgroup_cpu_quota ? std::min(n, *cgroup_cpu_quota) : n;
    }
    // The NUMA node owning `cpu`, or -1.
    int node_of_cpu(int cpu) const {
        for (const auto& n : nodes)
            if (std::binary_search(n.cpus.begin(), n.cpus.end(), cpu)) return n.id;
        return -1;
    }
};

struct topology_source {
    // Where /sys and /proc are. "/" reads this machine (and uses sched_getaffinity, getrlimit and
    // libnuma); anything else reads the files under it only (test fixtures).
    std::string root = "/";
};

namespace detail {

// A sysfs or procfs file (or a fixture's copy of one), whole: nothing unless it is a regular file (a
// FIFO planted in a --root tree would block the read forever), and at most `max_bytes` of it (procfs
// reports size 0, so the size cannot be asked first).
inline std::optional<std::string> read_system_file(const std::filesystem::path& p, std::size_t max_bytes = 1u << 20) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return std::nullopt;
    struct stat st {};
    std::optional<std::string> text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        text.emplace();
        char buf[4096];
        for (ssize_t n; text->size() < max_bytes && (n = ::read(fd, buf, std::min(sizeof buf, max_bytes - text->size()))) > 0;)
            text->append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return text;
}

// Its first line.
inline std::optional<std::string> read_first_line(const std::filesystem::path& p) {
    auto text = read_system_file(p, 64u << 10);
    if (!text || text->empty()) return std::nullopt;
    return text->substr(0, text->find('\n'));
}

inline std::filesystem::path under(const std::string& root, const std::string& path) {
    return std::filesystem::path(root) / std::filesystem::path(path).relative_path();
}

inline std::uint64_t node_memory_from_meminfo(const std::filesystem::path& p) {
    std::istringstream in(read_system_file(p).value_or(std::string()));
    std::string line;
    while (std::getline(in, line)) {
        auto at = line.find("MemTotal:");
        if (at != std::string::npos) return std::strtoull(line.c_str() + at + 9, nullptr, 10) * 1024;
    }
    return 0;
}

}  // namespace detail

// Reads the topology. Never throws for missing files (a container may hide /sys): the field stays empty.
inline topology read_topology(const topology_source& src = {}) {
    namespace fs = std::filesystem;
    using detail::under;
    const bool live = src.root == "/";
    topology t;
    if (auto s = detail::read_first_line(under(src.root, "/sys/devices/system/cpu/online"))) t.online_cpus = detail::parse_cpu_list(*s);

    // Affinity: the kernel's own answer for this process; fixtures carry it in proc/self/status.
    if (live) {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (::sched_getaffinity(0, sizeof(set), &set) == 0)
            for (int c = 0; c < CPU_SETSIZE; ++c)
                if (CPU_ISSET(c, &set)) t.allowed_cpus.push_back(c);
    } else {
        std::istringstream status(detail::read_system_file(under(src.root, "/proc/self/status")).value_or(std::string()));
        std::string line;
        while (std::getline(status, line))
            if (line.rfind("Cpus_allowed_list:", 0) == 0) t.allowed_cpus = detail::parse_cpu_list(line.substr(18));
    }
    if (t.allowed_cpus.empty()) t.allowed_cpus = t.online_cpus;

    // cgroup v2: the process's own cgroup directory, from /proc/self/cgroup ("0::/path").
    fs::path cgroup_dir = under(src.root, "/sys/fs/cgroup");
    {
        std::istringstream in(detail::read_system_file(under(src.root, "/proc/self/cgroup")).value_or(std::string()));
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("0::", 0) == 0) {
                fs::path candidate = cgroup_dir / fs::path(line.substr(3)).relative_path();
                if (fs::exists(candidate / "cpu.max") || fs::exists(candidate / "memory.max")) cgroup_dir = candidate;
            }
    }
    if (auto s = detail::read_first_line(cgroup_dir / "cpu.max")) {
        std::istringstream in(*s);
        std::string quota;
        double period = 100000;
        in >> quota >> period;
        if (quota != "max" && period > 0) t.cgroup_cpu_quota = std::strtod(quota.c_str(), nullptr) / period;
    }
    if (auto s = detail::read_first_line(cgroup_dir / "memory.max"))
        if (*s != "max") t.cgroup_memory_max = std::strtoull(s->c_str(), nullptr, 10);

            // NUMA nodes: libnuma on the live machine when built in, sysfs otherwise.
#if FEEDLINE_HAS_NUMA
    if (live && ::numa_available() >= 0) {
        t.numa_source = "libnuma";
        struct bitmask* cpus = ::numa_allocate_cpumask();
        for (int n = 0; n <= ::numa_max_node(); ++n) {
            if (!::numa_bitmask_isbitset(::numa_all_nodes_ptr, static_cast<unsigned>(n))) continue;
            numa_node_info info;
            info.id = n;
            long long free_bytes = 0;
            info.memory_bytes = static_cast<std::uint64_t>(std::max(0LL, ::numa_node_size64(n, &free_bytes)));
            if (::numa_node_to_cpus(n, cpus) == 0)
                for (unsigned c = 0; c < cpus->size; ++c)
                    if (::numa_bitmask_isbitset(cpus, c)) info.cpus.push_back(static_cast<int>(c));
            t.nodes.push_back(std::move(info));
        }
        ::numa_free_cpumask(cpus);
    }
#endif
    if (t.nodes.empty()) {
        t.numa_source = "sysfs";
        fs::path node_root = under(src.root, "/sys/devices/system/node");
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(node_root, ec)) {
            std::string name = e.path().filename().string();
            if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
            numa_node_info info;
            if (name.size() > 9 || name.find_first_not_of("0123456789", 4) != std::string::npos) continue;  // not a node Linux makes
            info.id = std::stoi(name.substr(4));
            if (auto s = detail::read_first_line(e.path() / "cpulist")) info.cpus = detail::parse_cpu_list(*s);
            info.memory_bytes = detail::node_memory_from_meminfo(e.path() / "meminfo");
            t.nodes.push_back(std::move(info));
        }
        std::sort(t.nodes.begin(), t.nodes.end(), [](auto& a, auto& b) { return a.id < b.id; });
    }

    // SMT: how many hardware threads share the first online CPU's core (a data worker and the trainer
    // on two siblings share one core's execution units).
    if (!t.online_cpus.empty())
        if (auto s = detail::read_first_line(
                under(src.root, "/sys/devices/system/cpu/cpu" + std::to_string(t.online_cpus.front()) + "/topology/thread_siblings_list")))
            t.threads_per_core = static_cast<unsigned>(detail::parse_cpu_list(*s).size());

    std::error_code ec;
    for (const auto& e : fs::directory_iterator(under(src.root, "/sys/kernel/mm/hugepages"), ec)) {
        std::string name = e.path().filename().string();  // hugepages-2048kB
        if (name.rfind("hugepages-", 0) == 0) t.hugepage_sizes.push_back(std::strtoull(name.c_str() + 10, nullptr, 10) * 1024);
    }
    std::sort(t.hugepage_sizes.begin(), t.hugepage_sizes.end());

    if (live) {
        rlimit rl{};
        if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) t.memlock_limit = rl.rlim_cur;
    } else {
        std::istringstream in(detail::read_system_file(under(src.root, "/proc/self/limits")).value_or(std::string()));
        std::string line;
        while (std::getline(in, line))
            if (line.rfind("Max locked memory", 0) == 0) {
                std::istringstream fields(line.substr(17));
                std::string soft;
                fields >> soft;
                if (soft != "unlimited") t.memlock_limit = std::strtoull(soft.c_str(), nullptr, 10);
            }
    }

    // NVIDIA GPUs (vendor 0x10de, display class 0x03xxxx) among the PCI devices.
    for (const auto& e : fs::directory_iterator(under(src.root, "/sys/bus/pci/devices"), ec)) {
        auto vendor = detail::read_first_line(e.path() / "vendor");
        auto cls = detail::read_first_line(e.path() / "class");
        if (!vendor || !cls || *vendor != "0x10de" || cls->rfind("0x03", 0) != 0) continue;
        gpu_info g;
        g.pci_bus_id = e.path().filename().string();
        if (auto s = detail::read_first_line(e.path() / "numa_node")) g.numa_node = std::atoi(s->c_str());
        if (auto s = detail::read_first_line(e.path() / "local_cpulist")) g.local_cpus = detail::parse_cpu_list(*s);
        if (auto s = detail::read_first_line(e.path() / "current_link_speed")) g.link_speed = *s;
        if (auto s = detail::read_first_line(e.path() / "max_link_speed")) g.max_link_speed = *s;
        if (auto s = detail::read_first_line(e.path() / "current_link_width")) g.link_width = std::atoi(s->c_str());
        if (auto s = detail::read_first_line(e.path() / "max_link_width")) g.max_link_width = std::atoi(s->c_str());
        t.gpus.push_back(std::move(g));
    }
    std::sort(t.gpus.begin(), t.gpus.end(), [](auto& a, auto& b) { return a.pci_bus_id < b.pci_bus_id; });
    return t;
}

struct worker_plan {
    unsigned gpus = 0;             // consumers (0 = CPU training: one consumer)
    unsigned workers_per_gpu = 0;  // data workers per consumer
    unsigned os_reserve = 0;
    unsigned cores_needed = 0;  // gpus x (workers_per_gpu + 1) + os_reserve
    double cores_available = 0;
    bool short_of_cores = false;
    std::string explanation;  // one line for logs
};

// Cores left to the OS, interrupts and the launcher by every sizing rule (recommend_workers, and
// feedline-doctor's plan, check and diagnose, so that none of them flags what another picked).
inline constexpr unsigned os_reserve_cores = 1;

// Workers per GPU from the cores this process can really use. Each consumer (training thread) needs a
// core, the OS needs `os_reserve`, the rest are split evenly; at least one worker per GPU even when
// that oversubscribes the machine, and then short_of_cores says so.
inline worker_plan recommend_workers(const topology& t, unsigned gpus, unsigned os_reserve = os_reserve_cores) {
    worker_plan p;
    p.gpus = gpus;
    p.os_reserve = os_reserve;
    p.cores_available = t.usable_cores();
    const unsigned consumers = std::max(1u, gpus);
    const auto whole = static_cast<unsigned>(std::floor(p.cores_available + 1e-9));
    const unsigned spare = whole > os_reserve ? whole - os_reserve : 0;
    p.workers_per_gpu = std::max(1u, spare / consumers > 0 ? spare / consumers - 1 : 0);
    p.cores_needed = consumers * (p.workers_per_gpu + 1) + os_reserve;
    p.short_of_cores = static_cast<double>(p.cores_needed) > p.cores_available + 1e-9;
    std::ostringstream s;
    s << consumers << (gpus ? " GPU(s)" : " CPU trainer") << " x (" << p.workers_per_gpu << " workers + 1 consumer) + " << os_reserve
      << " for the OS = " << p.cores_needed << " cores; " << p.cores_available << " usable";
    if (t.cgroup_cpu_quota) s << " (cgroup quota " << *t.cgroup_cpu_quota << " CPUs)";
    if (p.short_of_cores) s << ": SHORT of cores, expect the data workers to compete with the trainer";
    p.explanation = s.str();
    return p;
}

// CPUs for the workers of GPU `gpu_index`: the GPU's local CPUs (so batches are assembled on its NUMA
// node), restricted to the affinity mask; all allowed CPUs when the GPU's locality is unknown.
inline std::vector<int> cpus_near_gpu(const topology& t, std::size_t gpu_index) {
    std::vector<int> out;
    if (gpu_index < t.gpus.size())
        for (int c : t.gpus[gpu_index].local_cpus)
            if (std::binary_search(t.allowed_cpus.begin(), t.allowed_cpus.end(), c)) out.push_back(c);
    return out.empty() ? t.allowed_cpus : out;
}

// CPUs for the data workers feeding the GPU at `pci_bus_id`: on a machine with several NUMA nodes, its
// local CPUs within the affinity mask (cpus_near_gpu), so batches are assembled next to the pinned
// memory the GPU copies from; empty where placement would change nothing or is unknown (one node, a
// GPU the topology does not list, no local CPUs in the mask).
inline std::vector<int> worker_cpus_for_gpu(const topology& t, const std::string& pci_bus_id) {
    if (t.nodes.size() < 2 || pci_bus_id.empty()) return {};
    for (std::size_t i = 0; i < t.gpus.size(); ++i) {
        if (t.gpus[i].pci_bus_id != pci_bus_id) continue;
        std::vector<int> cpus = cpus_near_gpu(t, i);
        return cpus == t.allowed_cpus ? std::vector<int>{} : cpus;
    }
    return {};
}

}  // namespace feedline
