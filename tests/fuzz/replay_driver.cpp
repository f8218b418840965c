// A stand-in for libFuzzer when the compiler is not clang: feeds the target valid inputs and
// deterministic mutations of them (bit flips, byte overwrites with boundary values, truncations,
// extensions), so the ASan/UBSan build exercises the parser with hostile bytes on every CI run.
// Usage: <fuzzer> [iterations] [seed]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
std::vector<std::vector<std::uint8_t>> fuzz_seeds();  // defined per target

int main(int argc, char** argv) {
    long iterations = argc > 1 ? std::atol(argv[1]) : 200000;
    std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
    auto seeds = fuzz_seeds();
    for (auto& s : seeds) LLVMFuzzerTestOneInput(s.data(), s.size());
    const std::uint64_t boundary[] = {0, 1, 0x7f, 0x80, 0xff, 0x7fffffff, 0x80000000, 0xffffffff, ~0ull, 1ull << 62};
    for (long it = 0; it < iterations; ++it) {
        std::vector<std::uint8_t> v = seeds[rng() % seeds.size()];
        int edits = 1 + static_cast<int>(rng() % 4);
        for (int e = 0; e < edits; ++e) {
            switch (rng() % 5) {
                case 0:
                    if (!v.empty()) v[rng() % v.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
                    break;
                case 1:
                    if (v.size() >= 8) {
                        std::uint64_t b = boundary[rng() % (sizeof(boundary) / 8)];
                        std::memcpy(v.data() + rng() % (v.size() - 7), &b, 8);
                    }
                    break;
                case 2: v.resize(v.empty() ? 0 : rng() % v.size()); break;
                case 3: v.resize(v.size() + rng() % 64, static_cast<std::uint8_t>(rng())); break;
                default:
                    if (!v.empty()) v[rng() % v.size()] = static_cast<std::uint8_t>(rng());
                    break;
            }
        }
        LLVMFuzzerTestOneInput(v.data(), v.size());
    }
    std::printf("%ld mutated inputs, no crash\n", iterations);
    return 0;
}
