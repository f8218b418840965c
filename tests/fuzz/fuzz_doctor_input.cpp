// Fuzz target: feedline-doctor's inputs. Any bytes, read as diagnose reads a file (a scenario or a
// log, by content; nesting past the limit refused unparsed) or as a run's JSON-lines log, either give
// observations or throw feedline's config_error/format_error naming the field or line; the findings drawn from what parses carry known codes, a known severity, finite numbers and gains, and
// moot findings are info.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>

#include <feedline/doctor/diagnose.hpp>

namespace doctor = feedline::doctor;

namespace {

bool finite_numbers(const nlohmann::json& j) {
    if (j.is_number()) return std::isfinite(j.get<double>());
    if (j.is_object() || j.is_array())
        for (const auto& v : j)
            if (!finite_numbers(v)) return false;
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    static const std::set<std::string> codes = {
        "data-bound",           "remote-bound", "remote-retries",  "gpu-bound",       "gpu-underused", "gpu-memory-headroom",
        "host-memory-pressure", "swap-in-use",  "no-data-workers", "pageable-copies", "cores-short",   "mmap-counted-as-rss",
        "numa-remote",          "mfu"};
    try {
        doctor::observations o;
        if (data[0] % 2 == 0) {  // as feedline-doctor diagnose reads a file: scenario or log, by its content
            bool scenario = false;
            o = doctor::parse_input(text, "fuzz/input", scenario);
        } else {
            std::istringstream in(text);
            o = doctor::parse_log(in, "fuzz/run.log");
        }
        for (const auto& f : doctor::diagnose(o)) {
            if (!codes.count(f.code) || (f.severity != "action" && f.severity != "info") || f.action.empty()) __builtin_trap();
            if (!finite_numbers(f.evidence) || (f.gain && !(std::isfinite(*f.gain) && *f.gain >= 0))) __builtin_trap();
            if (!f.moot_by.empty() && f.severity != "info") __builtin_trap();
        }
    } catch (const feedline::error&) {
    }
    return 0;
}
