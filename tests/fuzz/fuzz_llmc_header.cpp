// Fuzz target: the llm.c header parser must accept or throw format_error for any bytes and file size.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <feedline/format/llmc.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    // The last 8 bytes choose the claimed file size: odd values claim another size than the bytes.
    std::uint64_t file_size = size;
    if (size >= 8) {
        std::uint64_t claim;
        std::memcpy(&claim, data + size - 8, 8);
        size -= 8;
        file_size = (claim & 1) ? claim % (1ull << 34) : size;
    }
    try {
        auto h = feedline::parse_llmc_header(std::span(reinterpret_cast<const std::byte*>(data), size), file_size, "fuzz.bin");
        if (1024 + h.tokens * feedline::dtype_size(h.dtype) != file_size) __builtin_trap();
    } catch (const feedline::format_error&) {
    }
    return 0;
}
