// Fuzz target: mixture files (sampling/mixture_file.hpp). Any bytes either parse or throw
// config_error; a schedule that parses gives every domain a share in [0, 1] summing to 1 at any step,
// and a mixer over it keeps every domain within one sample of its target (the mixer's guarantee).
#include <cstddef>
#include <cstdint>
#include <string>

#include <feedline/sampling/mixer.hpp>
#include <feedline/sampling/mixture_file.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::uint64_t batch = 1 + data[0] % 16;  // byte 0: the global batch
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        const feedline::mixture_file f = feedline::parse_mixture(text, "fuzz/mixture.json", batch * 64);
        const auto& s = *f.schedule;
        if (s.domains() > 64) return 0;  // the walk below is O(domains) per sample
        const std::uint64_t last = s.stage_step(s.stages() - 1) + s.stage_ramp(s.stages() - 1);
        for (std::uint64_t step : {std::uint64_t{0}, last / 2, last, last + 1}) {
            double sum = 0;
            for (std::size_t d = 0; d < s.domains(); ++d) {
                const double x = s.share(d, step);
                if (!(x >= 0 && x <= 1)) __builtin_trap();
                sum += x;
            }
            if (sum < 0.999999 || sum > 1.000001) __builtin_trap();
        }
        if (last > 4096) return 0;  // keep each input's walk short
        feedline::mixer m(f.schedule, batch);
        for (std::uint64_t i = 0; i < (last + 4) * batch && i < 20000; ++i) {
            m.next();
            for (std::uint32_t d = 0; d < s.domains(); ++d)
                if (!m.within_bound(d)) __builtin_trap();
        }
    } catch (const feedline::config_error&) {
    }
    return 0;
}
