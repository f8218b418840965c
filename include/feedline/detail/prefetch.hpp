// feedline/detail/prefetch.hpp: a cache-line request the compiler keeps.
// GCC 12 at -O2 drops some __builtin_prefetch calls whose address comes from loads: a prefetch has no
// effect it must keep, so when the loads feed nothing else the whole computation goes (seen: an index
// shifted by a variable amount, a pointer read out of a std::variant). The chains of requests that
// overlap a batch's misses (a mixture's cold domains, an epoch's random windows) are exactly such
// loads. On x86-64 the instruction is written out, which the compiler may not remove; elsewhere the
// builtin, as good as the compiler makes it.
#pragma once

namespace feedline::detail {

// Requests the cache line holding `p` for reading, into every level. Never faults, whatever `p` is.
inline void prefetch(const void* p) noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    asm volatile("prefetcht0 (%0)" : : "r"(p));
#else
    __builtin_prefetch(p);
#endif
}

}  // namespace feedline::detail
