// Run under mpirun: each rank (from Open MPI's environment) writes the sample ids it gets for 25 steps
// to DIR/rank<R>.txt. With --check WORLD it reads all rank files and compares their union, step by
// step, with a single-process run: disjoint, complete, same order. Exit 0 when they match.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <feedline/sampling/sampler.hpp>

#include "synthetic_lengths.hpp"

namespace {
const std::uint64_t G = 12, steps = 25;
std::string line_of(const feedline::sample_plan& s) {
    return std::to_string(s.epoch) + ":" + std::to_string(s.index) + (s.padding ? "p" : "");
}
}  // namespace

int main(int argc, char** argv) {
    auto data = feedline::test::hashed_lengths(3000, 400);
    if (argc == 4 && std::string(argv[1]) == "--check") {
        std::string dir = argv[2];
        int world = std::stoi(argv[3]);
        feedline::sampler one(data, {.seq_len = 128, .global_batch = G, .rank = 0, .world_size = 1});
        std::vector<std::ifstream> files;
        for (int r = 0; r < world; ++r) files.emplace_back(dir + "/rank" + std::to_string(r) + ".txt");
        for (std::uint64_t step = 0; step < steps; ++step) {
            auto whole = one.next();
            std::vector<std::string> joined;
            for (auto& f : files)
                for (std::uint64_t i = 0; i < G / static_cast<std::uint64_t>(world); ++i) {
                    std::string l;
                    if (!std::getline(f, l)) {
                        std::cerr << "rank file too short at step " << step << "\n";
                        return 1;
                    }
                    joined.push_back(l);
                }
            for (std::uint64_t i = 0; i < G; ++i)
                if (joined[i] != line_of(whole.samples[i])) {
                    std::cerr << "step " << step << " sample " << i << ": ranks gave " << joined[i] << ", one process gives "
                              << line_of(whole.samples[i]) << "\n";
                    return 1;
                }
        }
        std::cout << world << " ranks: union of every global batch equals the single-process batch, slices disjoint\n";
        return 0;
    }
    if (argc != 2) {
        std::cerr << "usage: sampler_ranks DIR | sampler_ranks --check DIR WORLD\n";
        return 2;
    }
    feedline::sampler s(data, {.seq_len = 128, .global_batch = G});  // rank and world from the launcher
    std::ofstream out(std::string(argv[1]) + "/rank" + std::to_string(s.rank()) + ".txt");
    for (std::uint64_t step = 0; step < steps; ++step)
        for (auto& x : s.next().samples) out << line_of(x) << "\n";
    return out ? 0 : 1;
}
