// Fuzz target: the Megatron .idx parser must accept or throw format_error for any bytes, never crash,
// read out of bounds or hang. The last 8 bytes of the input claim the .bin size; the rest is the .idx.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <feedline/format/megatron.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::uint64_t bin_size = 0;
    if (size >= 8) {
        std::memcpy(&bin_size, data + size - 8, 8);
        size -= 8;
    }
    bin_size %= (1ull << 40);
    try {
        feedline::megatron_index_view idx(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz.idx", bin_size);
        // A valid index must describe sequences inside the .bin.
        for (std::uint64_t i = 0; i < idx.sequence_count(); ++i)
            if (idx.pointer(i) + std::uint64_t(idx.length(i)) * feedline::dtype_size(idx.dtype()) > bin_size) __builtin_trap();
    } catch (const feedline::format_error&) {
    }
    return 0;
}
