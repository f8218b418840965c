// feedline/format/dtype.hpp: the element types token files use, and the conversions between them.
// Megatron's .idx stores a dtype code; llm.c implies one by its magic number. Readers hand tokens to
// the pipeline as fixed-width integers; writers pick the narrowest type the vocabulary fits in.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include <feedline/error.hpp>

namespace feedline {

enum class token_dtype : std::uint8_t { uint8, int8, int16, int32, int64, float64, float32, uint16, uint32 };

inline constexpr std::size_t dtype_size(token_dtype t) noexcept {
    switch (t) {
        case token_dtype::uint8:
        case token_dtype::int8: return 1;
        case token_dtype::int16:
        case token_dtype::uint16: return 2;
        case token_dtype::int32:
        case token_dtype::uint32:
        case token_dtype::float32: return 4;
        case token_dtype::int64:
        case token_dtype::float64: return 8;
    }
    return 0;
}

inline constexpr std::string_view to_string(token_dtype t) noexcept {
    switch (t) {
        case token_dtype::uint8: return "uint8";
        case token_dtype::int8: return "int8";
        case token_dtype::int16: return "int16";
        case token_dtype::int32: return "int32";
        case token_dtype::int64: return "int64";
        case token_dtype::float64: return "float64";
        case token_dtype::float32: return "float32";
        case token_dtype::uint16: return "uint16";
        case token_dtype::uint32: return "uint32";
    }
    return "?";
}

// Parses a dtype name as written by to_string. Throws config_error naming the value.
inline token_dtype parse_dtype(std::string_view s) {
    for (auto t : {token_dtype::uint8, token_dtype::int8, token_dtype::int16, token_dtype::int32, token_dtype::int64, token_dtype::float64,
                   token_dtype::float32, token_dtype::uint16, token_dtype::uint32})
        if (to_string(t) == s) return t;
    throw config_error("dtype", "unknown dtype '" + std::string(s) + "'");
}

// Megatron's DType.optimal_dtype: uint16 while the vocabulary fits with headroom, else int32.
inline token_dtype megatron_optimal_dtype(std::uint64_t vocab_size) noexcept {
    return vocab_size < 65500 ? token_dtype::uint16 : token_dtype::int32;
}

namespace detail {

// Megatron-LM's DType codes (megatron/core/datasets/indexed_dataset.py). uint32 has no code there.
inline std::optional<token_dtype> dtype_from_megatron_code(std::uint8_t code) noexcept {
    switch (code) {
        case 1: return token_dtype::uint8;
        case 2: return token_dtype::int8;
        case 3: return token_dtype::int16;
        case 4: return token_dtype::int32;
        case 5: return token_dtype::int64;
        case 6: return token_dtype::float64;
        case 7: return token_dtype::float32;
        case 8: return token_dtype::uint16;
        default: return std::nullopt;
    }
}

inline std::optional<std::uint8_t> megatron_code(token_dtype t) noexcept {
    switch (t) {
        case token_dtype::uint8: return 1;
        case token_dtype::int8: return 2;
        case token_dtype::int16: return 3;
        case token_dtype::int32: return 4;
        case token_dtype::int64: return 5;
        case token_dtype::float64: return 6;
        case token_dtype::float32: return 7;
        case token_dtype::uint16: return 8;
        case token_dtype::uint32: return std::nullopt;
    }
    return std::nullopt;
}

// Calls f(U{}) with U the C++ type of `t` (std::uint16_t for uint16, float for float32, ...) and
// returns what it returns: one dispatch for every loop that reads or writes tokens of any type.
template <class F>
inline decltype(auto) with_element_type(token_dtype t, F&& f) {
    switch (t) {
        case token_dtype::uint8: return f(std::uint8_t{});
        case token_dtype::int8: return f(std::int8_t{});
        case token_dtype::int16: return f(std::int16_t{});
        case token_dtype::uint16: return f(std::uint16_t{});
        case token_dtype::int32: return f(std::int32_t{});
        case token_dtype::uint32: return f(std::uint32_t{});
        case token_dtype::int64: return f(std::int64_t{});
        case token_dtype::float32: return f(float{});
        case token_dtype::float64: break;
    }
    return f(double{});
}

// Reads element `i` of a little-endian array of `t` starting at `src` (no alignment needed) as T.
template <class T>
inline T load_token(const std::byte* src, token_dtype t, std::size_t i) noexcept {
    auto get = [&]<class U>(U) {
        U v;
        std::memcpy(&v, src + i * sizeof(U), sizeof(U));
        return static_cast<T>(v);
    };
    return with_element_type(t, get);
}

// Converts `count` tokens of type `t` at `src` to T. Same-type integer copies become one memcpy.
template <class T>
inline void convert_tokens(const std::byte* src, token_dtype t, std::size_t count, T* out) noexcept {
    if ((t == token_dtype::uint16 && std::is_same_v<T, std::uint16_t>) || (t == token_dtype::uint32 && std::is_same_v<T, std::uint32_t>) ||
        (t == token_dtype::int32 && std::is_same_v<T, std::int32_t>) || (t == token_dtype::int64 && std::is_same_v<T, std::int64_t>)) {
        std::memcpy(out, src, count * sizeof(T));
        return;
    }
    if (t == token_dtype::uint16) {  // the common case gets its own loop so it vectorises
        std::size_t i = 0;
        // uint16 -> int32 with SIMD zero-extension, whatever the optimisation level: GCC vectorises a
        // loop of unknown length at -O3 only, and at -O2 (RelWithDebInfo, most users' builds) this
        // copy, the pipeline's hot loop, ran 2.5x slower (bench_end_to_end, docs/benchmarks.md).
        // Loads stay inside [src, src + 2 * count): nothing past the window is touched.
        if constexpr (std::is_same_v<T, std::int32_t>) {
#if defined(__AVX2__)
            for (; i + 16 <= count; i += 16) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 8), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)));
            }
#elif defined(__SSE2__)
            const __m128i zero = _mm_setzero_si128();
            for (; i + 8 <= count; i += 8) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(v, zero));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(v, zero));
            }
#endif
        }
        const std::byte* rest = src + 2 * i;  // walked by pointer: an index times 2 made GCC warn of overflow
        for (T* o = out + i; o != out + count; ++o, rest += 2) {
            std::uint16_t v;
            std::memcpy(&v, rest, 2);
            *o = static_cast<T>(v);
        }
        return;
    }
    for (std::size_t i = 0; i < count; ++i) out[i] = load_token<T>(src, t, i);
}

// Stores `value` as element `i` of a `t` array at `dst`. Returns false when it does not fit exactly.
template <class T>
inline bool store_token(std::byte* dst, token_dtype t, std::size_t i, T value) noexcept {
    auto put = [&]<class U>(U) {
        auto v = static_cast<U>(value);
        if (static_cast<T>(v) != value) return false;
        if constexpr (std::is_integral_v<T> && std::is_integral_v<U>)
            if ((value < T{}) != (v < U{})) return false;
        std::memcpy(dst + i * sizeof(U), &v, sizeof(U));
        return true;
    };
    return with_element_type(t, put);
}

}  // namespace detail
}  // namespace feedline
