// Writes a target's seeds (seeds.cpp) as files into a directory, one per seed: the starting corpus of
// its libFuzzer run, so a 20 s run in CI mutates valid resume files, headers and JSONL from the first
// second instead of spending them discovering a magic number.
// Usage: fuzz_<target>_seeds DIRECTORY
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

std::vector<std::vector<std::uint8_t>> fuzz_seeds();  // defined per target

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIRECTORY\n", argv[0]);
        return 2;
    }
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    const auto seeds = fuzz_seeds();
    for (std::size_t i = 0; i < seeds.size(); ++i) {
        std::ofstream out(dir / ("seed_" + std::to_string(i)), std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(seeds[i].data()), static_cast<std::streamsize>(seeds[i].size()));
        if (!out) {
            std::fprintf(stderr, "%s: cannot write seed %zu\n", dir.c_str(), i);
            return 1;
        }
    }
    std::printf("%zu seeds in %s\n", seeds.size(), dir.c_str());
    return 0;
}
