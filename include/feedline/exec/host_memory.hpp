// feedline/exec/host_memory.hpp: how much memory the machine and this process use, read from procfs
// under the same root as the topology readers (so test fixtures describe machines we do not have).
// The machine: RAM total and available, swap total and free, vm.swappiness, transparent hugepages.
// The process: RSS split into anonymous memory (its own), file pages (mapped files: for feedline the
// dataset, shared with the page cache and reclaimable) and shared memory. Feeds the pipeline's stats
// lines, the trainer's log and feedline-doctor. A value the kernel does not give stays empty: absent,
// never zero.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <feedline/detail/thread_scope.hpp>
#include <feedline/exec/topology.hpp>

namespace feedline {

struct host_memory {
    std::optional<std::uint64_t> total, available, swap_total, swap_free;  // bytes
    std::optional<int> swappiness;                                         // vm.swappiness
    std::string transparent_hugepages;  // the selected mode: "always", "madvise", "never"; empty: unknown

    // "Used" as free(1) and the scenario schema mean it: what is not available.
    std::optional<std::uint64_t> used() const {
        if (!total || !available) return std::nullopt;
        return *total > *available ? *total - *available : 0;
    }
    std::optional<std::uint64_t> swap_used() const {
        if (!swap_total || !swap_free) return std::nullopt;
        return *swap_total > *swap_free ? *swap_total - *swap_free : 0;
    }
};

struct process_memory {
    std::optional<std::uint64_t> rss, rss_anon, rss_file, rss_shmem;  // bytes
};

namespace detail {

// "Key:   12345 kB" lines (meminfo, status): the value of `key` in bytes, or nullopt.
inline std::optional<std::uint64_t> kib_field(const std::string& line, const char* key) {
    const std::string k = key;
    if (line.size() <= k.size() || line.compare(0, k.size(), k) != 0 || line[k.size()] != ':') return std::nullopt;
    char* end = nullptr;
    const char* start = line.c_str() + k.size() + 1;
    const unsigned long long v = std::strtoull(start, &end, 10);
    if (end == start) return std::nullopt;
    return static_cast<std::uint64_t>(v) * 1024;
}

// Sets each named field from a procfs file of "Key: N kB" lines (under src's root); a key the file
// does not have leaves its field empty.
inline void read_kib_fields(const topology_source& src, const char* path,
                            std::initializer_list<std::pair<const char*, std::optional<std::uint64_t>*>> fields) {
    std::istringstream in(read_system_file(under(src.root, path)).value_or(std::string()));
    std::string line;
    while (std::getline(in, line))
        for (const auto& [key, field] : fields)
            if (auto v = kib_field(line, key)) {
                *field = v;
                break;
            }
}

}  // namespace detail

// While one lives on this thread, read_host_memory() answers from its first reading (of one root: a
// call under another reads as usual). A pipeline's start lets each source choose its reader, which
// asks how much memory is available: 10,000 domains read /proc/meminfo, vm.swappiness and the
// hugepage mode 10,000 times, 0.28 s of the first batch's 0.29 (bench_mixture). Nests; scoped to the
// calls that want one answer.
class host_memory_memo : public detail::thread_scope<host_memory_memo> {
public:
    std::string root;  // the reading's
    std::optional<host_memory> reading;
};

inline host_memory read_host_memory(const topology_source& src = {}) {
    host_memory_memo* memo = host_memory_memo::active();
    if (memo != nullptr && memo->reading && memo->root != src.root) memo = nullptr;
    if (memo != nullptr && memo->reading) return *memo->reading;
    host_memory m;
    detail::read_kib_fields(
        src, "/proc/meminfo",
        {{"MemTotal", &m.total}, {"MemAvailable", &m.available}, {"SwapTotal", &m.swap_total}, {"SwapFree", &m.swap_free}});
    if (auto s = detail::read_first_line(detail::under(src.root, "/proc/sys/vm/swappiness"))) {
        char* end = nullptr;
        const long v = std::strtol(s->c_str(), &end, 10);
        if (end != s->c_str()) m.swappiness = static_cast<int>(v);
    }
    // "always [madvise] never": the bracketed word is the mode in force.
    if (auto s = detail::read_first_line(detail::under(src.root, "/sys/kernel/mm/transparent_hugepage/enabled"))) {
        const auto open = s->find('['), close = s->find(']');
        if (open != std::string::npos && close != std::string::npos && close > open)
            m.transparent_hugepages = s->substr(open + 1, close - open - 1);
    }
    if (memo != nullptr) memo->root = src.root, memo->reading = m;
    return m;
}

inline process_memory read_process_memory(const topology_source& src = {}) {
    process_memory p;
    detail::read_kib_fields(src, "/proc/self/status",
                            {{"VmRSS", &p.rss}, {"RssAnon", &p.rss_anon}, {"RssFile", &p.rss_file}, {"RssShmem", &p.rss_shmem}});
    return p;
}

}  // namespace feedline
