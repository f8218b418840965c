// feedline/doctor/mixture_totals.hpp: whether a finished (or running) mixture run drew what its schedule
// says. A run's log has each domain's samples and the step its state is at (pipeline_stats' datasets and
// next_step); the mixture file gives each domain's exact target after that many samples
// (sampling/mixture_schedule.hpp's mixture_targets). The sampler keeps every count within one sample of
// its target, so a domain further off means the data was not mixed by this file: another file, an
// edited one, a run resumed with another schedule, or a bug worth a report.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <feedline/doctor/diagnose.hpp>
#include <feedline/error.hpp>
#include <feedline/sampling/mixture_file.hpp>
#include <feedline/sampling/mixture_schedule.hpp>

namespace feedline::doctor {

// The findings for `o`'s per-domain totals against the mixture file `text` (named `path`):
// mixture-on-schedule (info: every domain within one sample), mixture-off-schedule (action: the
// domains further off, worst first), or mixture-changed (info: the run's targets count from a later
// step, where weights were set during the run or another schedule took over, so totals from step 0
// cannot be checked). Throws config_error when the log has no totals or names other domains.
inline std::vector<finding> mixture_totals(const observations& o, const std::string& text, const std::string& path) {
    if (o.domains.empty() || !o.next_step)
        throw config_error("mixture",
                           "the log has no per-domain totals (a pipeline stats line or a feedline-train --json summary "
                           "with \"datasets\" and \"next_step\")");
    // Counts as the log wrote them: whole numbers a double holds exactly, summing below 2^53.
    constexpr double most = 9007199254740992.0;  // 2^53
    auto whole = [&](double v, const std::string& what) {
        if (!(v >= 0 && v < most && v == std::floor(v)))
            throw config_error("mixture", fmt::format("the log's {} ({:g}) is not a whole number below 2^53", what, v));
        return static_cast<std::uint64_t>(v);
    };
    std::uint64_t samples = 0, tokens = 0;
    std::vector<std::uint64_t> counts;
    for (const auto& d : o.domains) {
        counts.push_back(whole(d.samples, d.name + " samples"));
        samples = whole(static_cast<double>(samples) + d.samples, "samples over all domains");
        tokens = whole(static_cast<double>(tokens) + whole(d.tokens, d.name + " tokens"), "tokens over all domains");
    }
    const std::uint64_t steps = whole(*o.next_step, "next_step");
    if (steps == 0 || samples == 0) return {};  // nothing drawn yet
    if (samples % steps != 0)
        throw config_error("mixture",
                           fmt::format("the log's {} samples are not a whole number of global batches over its {} steps", samples, steps));
    const std::uint64_t global_batch = samples / steps, seq_len = tokens / samples;
    const mixture_file file = parse_mixture(text, path, global_batch * seq_len);
    const auto& names = file.schedule->names();
    if (names.size() != o.domains.size())
        throw config_error("mixture", fmt::format("{} has {} domains; the log has {}", path, names.size(), o.domains.size()));
    for (std::size_t d = 0; d < names.size(); ++d)
        if (names[d] != o.domains[d].name)
            throw config_error("mixture",
                               fmt::format("{}: domain {} is \"{}\"; the log's is \"{}\"", path, d + 1, names[d], o.domains[d].name));
    const double from = o.mixture_from_step.value_or(0);
    if (from > 0 || o.mixture_weights_set.value_or(0) > 0)
        return {{"mixture-changed",
                 "info",
                 {{"mixture_from_step", from}, {"mixture_weights_set", o.mixture_weights_set.value_or(0) > 0}, {"next_step", steps}},
                 fmt::format("the run's targets count from step {:g} with {} (weights set during the run, or another schedule from "
                             "there): its totals cannot be checked against {} from step 0",
                             from, o.mixture_weights_set.value_or(0) > 0 ? "weights set during the run" : "the schedule", path)}};
    // Each domain's count against its exact target; the sampler keeps every one strictly within one.
    const mixture_targets targets(file.schedule, global_batch);
    struct off {
        std::string name;
        double samples, target;
    };
    std::vector<off> far;
    double worst = 0;
    for (std::size_t d = 0; d < names.size(); ++d) {
        // Exactly, in integers: |count - num / den| < 1 (a double near 2^48 samples resolves 1/32 of one).
        const auto t = targets.target(d, samples);
        const mixture_uint128 scaled = mixture_uint128{counts[d]} * t.den;
        const bool within = scaled >= t.num ? scaled - t.num < t.den : t.num - scaled < t.den;
        const double target = targets.expected(d, samples);
        worst = std::max(worst, std::abs(o.domains[d].samples - target));
        if (!within) far.push_back({names[d], o.domains[d].samples, target});
    }
    if (far.empty())
        return {{"mixture-on-schedule",
                 "info",
                 {{"domains", names.size()}, {"samples", samples}, {"global_batch", global_batch}, {"largest_difference", worst}},
                 fmt::format("every one of the {} domains drew within one sample of its target after {} samples (at most {:.2f} off)",
                             names.size(), samples, worst)}};
    std::sort(far.begin(), far.end(),
              [](const off& a, const off& b) { return std::abs(a.samples - a.target) > std::abs(b.samples - b.target); });
    nlohmann::json shown = nlohmann::json::array();
    std::string list;
    for (std::size_t k = 0; k < far.size() && k < 5; ++k) {
        shown.push_back({{"name", far[k].name}, {"samples", far[k].samples}, {"target", far[k].target}});
        list += fmt::format("{}{} drew {:g}, its target is {:.1f}", k ? "; " : "", far[k].name, far[k].samples, far[k].target);
    }
    return {
        {"mixture-off-schedule",
         "action",
         {{"domains_off", far.size()}, {"domains", names.size()}, {"samples", samples}, {"global_batch", global_batch}, {"worst", shown}},
         fmt::format("{} of {} domains are more than one sample from what {} schedules after {} samples ({}): the run was not mixed "
                     "by this file (another or an edited one, or a resume with another schedule); check which file the run read",
                     far.size(), names.size(), path, samples, list)}};
}

}  // namespace feedline::doctor
