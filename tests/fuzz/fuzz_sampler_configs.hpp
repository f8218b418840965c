// The small samplers fuzz_sampler_state restores into, shared with its seeds: windows, packed rows,
// shard-block shuffling with padded tails, a blend of two datasets, and the same two mixed by a
// schedule (two stages and a ramp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <feedline/sampling/sampler.hpp>

#include "../support/synthetic_lengths.hpp"

namespace feedline::fuzzing {

using lengths = test::synthetic_lengths;

inline constexpr unsigned sampler_kinds = 5;

// Dataset `d` of sampler kind `which` (only the blend and the mixture have a dataset 1).
inline const lengths& dataset(unsigned which, std::uint32_t d) {
    static const lengths a{{5, 0, 17, 3, 40, 1, 9, 26, 2, 11}}, b{{12, 30, 2, 7}};
    return which >= 3 && d == 1 ? b : a;
}

inline std::unique_ptr<sampler> make_sampler(unsigned which) {
    sampler_config c{.seq_len = 8, .global_batch = 4, .seed = 7, .rank = 0, .world_size = 1};
    switch (which) {
        case 0: return std::make_unique<sampler>(dataset(0, 0), c);
        case 1: c.mode = sample_mode::packed; return std::make_unique<sampler>(dataset(1, 0), c);
        case 2:
            c.shuffle = shuffle_mode::shard_blocks;
            c.tail = tail_policy::pad;
            c.global_batch = 6;
            return std::make_unique<sampler>(dataset(2, 0), c, std::vector<std::uint64_t>{0, 4, 7});
        case 3: {
            std::vector<const lengths*> both{&dataset(3, 0), &dataset(3, 1)};
            return std::make_unique<sampler>(both, std::vector<double>{0.7, 0.3}, c);
        }
        default: {
            std::vector<sampler_dataset> both;
            for (std::uint32_t d = 0; d < 2; ++d) {
                const lengths& l = dataset(4, d);
                both.push_back({l.document_count(), [&l](std::uint64_t i) { return l.document_length(i); }, {}, false});
            }
            static const auto schedule = std::make_shared<const mixture_schedule>(
                std::vector<std::string>{"a", "b"}, std::vector<mixture_stage>{{0, {3, 1}, 0, ""}, {4, {0, 1}, 3, ""}});
            return std::make_unique<sampler>(std::move(both), schedule, c);
        }
    }
}

}  // namespace feedline::fuzzing
