// Shared helpers for feedline's tests: scratch directories on a real disk, files with known bytes,
// and skipping with a reason (ctest treats exit code 77 as "skipped").
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <feedline/exec/topology.hpp>

// 1 in a build under AddressSanitizer or ThreadSanitizer: GCC defines __SANITIZE_*__, clang answers
// __has_feature.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define FEEDLINE_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FEEDLINE_TEST_SANITIZED 1
#endif
#endif
#ifndef FEEDLINE_TEST_SANITIZED
#define FEEDLINE_TEST_SANITIZED 0
#endif

namespace feedline::test {

// Ends the test process as "skipped" with the reason on stderr. Each doctest case runs in its own
// process under ctest, so this skips exactly one case.
[[noreturn]] inline void skip(const std::string& reason) {
    std::fprintf(stderr, "SKIPPED: %s\n", reason.c_str());
    std::fflush(stderr);
    std::_Exit(77);
}

// A fresh directory removed at scope exit. Lives under FEEDLINE_TEST_TMPDIR (set by CMake to the build
// tree, a real disk, so O_DIRECT works) or the system temp directory.
class scratch_dir {
public:
    scratch_dir() {
        const char* base = std::getenv("FEEDLINE_TEST_TMPDIR");
        std::filesystem::path root = base ? base : std::filesystem::temp_directory_path().string();
        std::filesystem::create_directories(root);
        std::string templ = (root / "feedline-XXXXXX").string();
        if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + root.string());
        path_ = templ;
    }
    ~scratch_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    scratch_dir(const scratch_dir&) = delete;
    scratch_dir& operator=(const scratch_dir&) = delete;
    std::string operator/(const std::string& name) const { return (path_ / name).string(); }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const void* data, std::size_t n) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!out) throw std::runtime_error("cannot write " + path);
}
inline void write_text(const std::string& path, const std::string& s) { write_bytes(path, s.data(), s.size()); }

inline std::vector<std::byte> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> v((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(v.size());
    std::memcpy(out.data(), v.data(), v.size());
    return out;
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// "f" and 12: "f12". Appended in place: GCC 12 reports `"f" + std::to_string(i)` as overlapping copies
// (-Wrestrict, a false positive of its inlined std::string concatenation).
inline std::string numbered(std::string prefix, std::uint64_t i) {
    prefix += std::to_string(i);
    return prefix;
}

// Bytes where byte i of file k is a hash of (k, i): any misplaced copy shows up as a mismatch.
inline std::vector<std::byte> patterned_bytes(std::uint64_t n, std::uint64_t seed) {
    std::vector<std::byte> v(n);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::uint64_t i = 0; i < n; ++i) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        v[i] = static_cast<std::byte>((x * 0x2545F4914F6CDD1Dull) >> 56);
    }
    return v;
}

// Documents whose tokens are consecutive integers (document d holds d*1000, d*1000+1, ...), with
// lengths from `lengths`, so any token read back can be checked by arithmetic.
inline std::vector<std::vector<std::uint32_t>> arithmetic_documents(const std::vector<std::uint32_t>& lengths, std::uint32_t modulo = 0) {
    std::vector<std::vector<std::uint32_t>> docs;
    for (std::size_t d = 0; d < lengths.size(); ++d) {
        std::vector<std::uint32_t> t(lengths[d]);
        for (std::uint32_t i = 0; i < lengths[d]; ++i) {
            std::uint32_t v = static_cast<std::uint32_t>(d * 1000 + i);
            t[i] = modulo ? v % modulo : v;
        }
        docs.push_back(std::move(t));
    }
    return docs;
}

}  // namespace feedline::test

namespace feedline::test {

// Threads in this process right now (/proc/self/task), to prove shutdown leaks none. Take the
// baseline with baseline_thread_count(): sanitizers start a helper thread of their own the first time
// a thread is created.
inline std::size_t thread_count() {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
}

inline std::size_t baseline_thread_count() {
    std::thread([] {}).join();
    return thread_count();
}

// The names of this process's threads right now (/proc/self/task/*/comm, as top -H and perf show them).
inline std::vector<std::string> thread_names() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream comm(e.path() / "comm");
        std::string name;
        if (std::getline(comm, name)) names.push_back(name);
    }
    return names;
}
// The CPUs the thread named `name` may run on (Cpus_allowed_list in /proc/self/task/*/status);
// empty when no thread has that name.
inline std::vector<int> allowed_cpus_of_thread(const std::string& name) {
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
        std::ifstream comm(e.path() / "comm");
        std::string line;
        if (!std::getline(comm, line) || line != name) continue;
        std::ifstream status(e.path() / "status");
        while (std::getline(status, line))
            if (line.rfind("Cpus_allowed_list:", 0) == 0) return feedline::detail::parse_cpu_list(line.substr(18));
    }
    return {};
}

// The CPUs the calling thread may run on.
inline std::vector<int> allowed_cpus_of_this_thread() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (::sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

// Confines the calling thread, and the threads it starts meanwhile, to `cpus` until destroyed; then
// gives the thread back the CPUs it had.
class scoped_affinity {
public:
    explicit scoped_affinity(const std::vector<int>& cpus) {
        CPU_ZERO(&before_);
        ok_ = ::sched_getaffinity(0, sizeof before_, &before_) == 0;
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : cpus)
            if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
        ok_ = ok_ && ::sched_setaffinity(0, sizeof set, &set) == 0;
    }
    ~scoped_affinity() {
        if (ok_) ::sched_setaffinity(0, sizeof before_, &before_);
    }
    scoped_affinity(const scoped_affinity&) = delete;
    scoped_affinity& operator=(const scoped_affinity&) = delete;
    bool ok() const noexcept { return ok_; }

private:
    cpu_set_t before_;
    bool ok_ = false;
};

// A trainer's step that keeps its CPU busy (no sleep), as a CPU step or a spinning GPU sync does.
inline void busy_step(std::chrono::microseconds d = std::chrono::microseconds(200)) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
    }
}

// Takes batches from `pipeline` with a busy step after each (up to 2000) until the thread named
// `thread` may run on every CPU of `process` but the trainer's CPU that stats().trainer_cpu reports
// (the pipeline's placement, exec/trainer_cpu.hpp: applied at the thread's next batch, and followed
// when the trainer moves). Whether that happened.
template <class Pipeline>
bool busy_trainer_until_kept_off(Pipeline& pipeline, const std::string& thread, const std::vector<int>& process) {
    for (int i = 0; i < 2000; ++i) {
        if (!pipeline.next()) return false;
        busy_step();
        const int trainer = pipeline.stats().trainer_cpu;
        if (trainer < 0) continue;
        auto expected = process;
        expected.erase(std::remove(expected.begin(), expected.end(), trainer), expected.end());
        if (allowed_cpus_of_thread(thread) == expected) return true;
    }
    return false;
}

inline bool has_thread_named(const std::string& name) {
    const auto names = thread_names();
    return std::find(names.begin(), names.end(), name) != names.end();
}

// Stress sizes: the full count in plain builds; sanitizers slow atomics 5-50x, so they run a tenth.
#if FEEDLINE_TEST_SANITIZED
inline constexpr std::uint64_t stress_items = 1'000'000;
#else
inline constexpr std::uint64_t stress_items = 10'000'000;
#endif

}  // namespace feedline::test
