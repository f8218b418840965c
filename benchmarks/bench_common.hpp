// Shared helpers for the benchmarks: repeated, interleaved measurements and medians.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace feedline::bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

struct summary {
    double median = 0, lo = 0, hi = 0;
};
inline summary summarise(std::vector<double> v) {
    if (v.empty()) return {};
    std::sort(v.begin(), v.end());
    return {v[v.size() / 2], v.front(), v.back()};
}

// Runs every case once per round, `rounds` times (A B C A B C ...: machine drift hits all alike),
// and returns the median of each.
class interleaved {
public:
    void add(std::string name, std::function<double()> measure) { cases_.emplace_back(std::move(name), std::move(measure)); }
    // Drops the cases whose name does not contain `part` (to profile one case alone).
    void keep_only(const std::string& part) {
        std::erase_if(cases_, [&](const auto& c) { return c.first.find(part) == std::string::npos; });
    }
    std::map<std::string, summary> run(int rounds, const char* unit) {
        std::map<std::string, std::vector<double>> samples;
        for (int r = 0; r < rounds; ++r)
            for (auto& [name, f] : cases_) samples[name].push_back(f());
        std::map<std::string, summary> out;
        std::printf("%-44s %14s   %s\n", "case", unit, "spread (min-max)");
        for (auto& [name, f] : cases_) {
            out[name] = summarise(samples[name]);
            std::printf("%-44s %14.4g   %.4g - %.4g\n", name.c_str(), out[name].median, out[name].lo, out[name].hi);
        }
        return out;
    }

private:
    std::vector<std::pair<std::string, std::function<double()>>> cases_;
};

}  // namespace feedline::bench
