// Valid inputs the replay driver mutates: a small Megatron .idx and llm.c headers of both widths.
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {
template <class T>
void put(std::vector<std::uint8_t>& v, T x) {
    std::uint8_t b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    v.insert(v.end(), b, b + sizeof(T));
}
}  // namespace

std::vector<std::vector<std::uint8_t>> fuzz_seeds() {
    std::vector<std::vector<std::uint8_t>> seeds;
#ifdef FEEDLINE_FUZZ_MEGATRON
    for (std::uint8_t code : {1, 4, 8}) {
        std::vector<std::uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
        put<std::uint64_t>(idx, 1);
        idx.push_back(code);
        put<std::uint64_t>(idx, 3);
        put<std::uint64_t>(idx, 3);
        for (std::int32_t len : {4, 0, 2}) put(idx, len);
        std::int64_t item = code == 1 ? 1 : code == 4 ? 4 : 2;
        for (std::int64_t p : {std::int64_t{0}, 4 * item, 4 * item}) put(idx, p);
        for (std::int64_t d : {0, 2, 3}) put<std::int64_t>(idx, d);
        put<std::uint64_t>(idx, 6 * static_cast<std::uint64_t>(item));  // .bin size
        seeds.push_back(idx);
    }
#else
    for (auto [magic, version, width] : {std::tuple{20240520, 1, 2}, std::tuple{20240801, 7, 4}}) {
        std::vector<std::uint8_t> h(1024, 0);
        std::int32_t hdr[4] = {magic, version, 5, 0};
        std::memcpy(h.data(), hdr, sizeof(hdr));
        h.resize(1024 + 5 * static_cast<std::size_t>(width), 1);
        put<std::uint64_t>(h, 0);  // odd size claim: "use the real size"
        seeds.push_back(h);
    }
#endif
    return seeds;
}
