// Fuzz target: the token-lengths cache file must decode or throw format_error for any bytes, and what
// decodes must encode back to the same bytes (so nothing damaged is ever read as valid).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include <feedline/format/token_lengths.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    try {
        const feedline::token_lengths t = feedline::token_lengths::decode(bytes, "fuzz.lengths");
        const auto again = t.encode();
        if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) __builtin_trap();
    } catch (const feedline::format_error&) {
    }
    return 0;
}
