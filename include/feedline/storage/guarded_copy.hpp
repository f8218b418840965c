// feedline/storage/guarded_copy.hpp: copies out of a file mapping that survive the file shrinking.
// A page of a mapping past the file's current end raises SIGBUS when touched: a shard or .idx truncated
// (or rewritten in place) by another process under a running job would kill the trainer without a
// word. Every read feedline makes from a mapping goes through guarded_copy(), which sets a per-thread
// recovery point around one memcpy; feedline's SIGBUS handler jumps back to it when the faulting
// address lies inside the range being copied, and the caller turns that into a format_error naming
// the file. Any other SIGBUS goes to the handler installed before feedline's (or the default action),
// so an application's own handling is kept. Fed by the mmap backend and the Megatron index; see
// docs/reliability.md for the contract with applications that install SIGBUS handlers themselves.
#pragma once

#include <pthread.h>
#include <sys/stat.h>

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>

#include <feedline/error.hpp>

namespace feedline {
namespace detail {

// Where a thread is copying from a mapping, and where to jump back to if that faults. Trivial on
// purpose: the jump skips no destructor.
struct sigbus_recovery_point {
    sigjmp_buf env;
    const std::byte* begin;
    const std::byte* end;
};

// The current thread's recovery point, or null when it is not copying from a mapping. Written by the
// thread before it touches the mapping, so its TLS block exists when the handler reads it.
inline thread_local sigbus_recovery_point* active_sigbus_recovery = nullptr;

// The SIGBUS disposition that was in place when feedline installed its handler, chained to.
inline struct sigaction previous_sigbus_action {};

inline void on_sigbus(int sig, siginfo_t* info, void* context) {
    sigbus_recovery_point* point = active_sigbus_recovery;
    const auto* addr = static_cast<const std::byte*>(info != nullptr ? info->si_addr : nullptr);
    if (point != nullptr && addr >= point->begin && addr < point->end) siglongjmp(point->env, 1);
    // Not ours: hand it to whoever had it before.
    const struct sigaction& prev = previous_sigbus_action;
    if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
        prev.sa_sigaction(sig, info, context);
    } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
        prev.sa_handler(sig);
    } else {
        // Default (or ignored, which cannot skip a faulting load): restore the default action and
        // return; the load runs again and the process dies of SIGBUS as it would have without us.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        ::sigaction(SIGBUS, &dfl, nullptr);
    }
}

// After a jump out of the handler: SIGBUS unblocked again. feedline's handler runs with SIGBUS
// unblocked (SA_NODEFER), but a handler that chains to it may not (one installed without
// SA_NODEFER, ThreadSanitizer's wrapper), and the jump skips the mask's restore; a later fault with
// SIGBUS blocked would kill the process. One syscall, on the failure path only.
inline void unblock_sigbus() noexcept {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGBUS);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

// Installs feedline's SIGBUS handler once per process. SA_NODEFER keeps SIGBUS unblocked inside the
// handler, so jumping out with sigsetjmp(env, 0) (no mask saved: no syscall per copy) leaves the
// thread's signal mask as it was. Never throws; if sigaction fails, faults keep their old meaning.
// Once installed, one load: guarded_reads() calls it every time, and call_once is a library call.
inline void install_sigbus_handler() noexcept {
    static std::atomic<bool> installed{false};
    if (installed.load(std::memory_order_acquire)) return;
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction action {};
        action.sa_sigaction = &on_sigbus;
        action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        ::sigaction(SIGBUS, &action, &previous_sigbus_action);
        installed.store(true, std::memory_order_release);
    });
}

// Handed to the function guarded_reads() runs: before reading a range of a mapping, the function
// says which (one store each, no syscall), so a fault there, and only there, is recovered.
class sigbus_guard {
public:
    explicit sigbus_guard(detail::sigbus_recovery_point* point) noexcept : point_(point) {}
    void covering(const std::byte* begin, std::size_t n) noexcept {
        point_->begin = begin;
        point_->end = begin + n;
        std::atomic_signal_fence(std::memory_order_seq_cst);  // published before the reads
    }

private:
    detail::sigbus_recovery_point* point_;
};

// Runs `read(guard)` under one recovery point: `read` calls guard.covering() before each range of a
// mapping it reads. Returns false when a page of the range being read is gone because the file
// shrank (what `read` wrote so far is left as it is), true otherwise. `read` must hold nothing that
// needs a destructor and take no lock: a fault abandons its frames. Not inlined: a function that
// calls sigsetjmp cannot be. One sigsetjmp (without the signal mask: no syscall) per call, so a batch
// of reads pays it once.
template <class Read>
[[gnu::noinline]] bool guarded_reads(Read&& read) noexcept {
    detail::install_sigbus_handler();
    detail::sigbus_recovery_point point;
    point.begin = point.end = nullptr;
    detail::sigbus_recovery_point* const outer = detail::active_sigbus_recovery;
    if (sigsetjmp(point.env, 0) != 0) {
        detail::active_sigbus_recovery = outer;
        detail::unblock_sigbus();
        return false;
    }
    detail::active_sigbus_recovery = &point;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    sigbus_guard guard(&point);
    read(guard);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    detail::active_sigbus_recovery = outer;
    return true;
}

// guarded_reads() of one range [begin, begin + n) that `read()` reads.
template <class Read>
bool guarded_read(const std::byte* begin, std::size_t n, Read&& read) noexcept {
    return guarded_reads([&](sigbus_guard& guard) noexcept {
        guard.covering(begin, n);
        read();
    });
}

#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool thread_sanitizer = true;
#else
inline constexpr bool thread_sanitizer = false;
#endif
#else
inline constexpr bool thread_sanitizer = false;
#endif

// memcpy, except under ThreadSanitizer, whose memcpy interceptor runs inside its runtime, where a
// SIGBUS is fatal before any handler sees it: there, a byte loop in our own code (volatile, so it is
// not turned back into a memcpy call). Production builds use memcpy.
inline void copy_from_mapping(void* dest, const std::byte* src, std::size_t n) noexcept {
    if constexpr (thread_sanitizer) {
        const volatile std::byte* in = src;
        auto* out = static_cast<std::byte*>(dest);
        for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
    } else {
        std::memcpy(dest, src, n);
    }
}

// Copies `n` bytes from `src` (inside a file mapping) to `dest`: guarded_read of a memcpy.
inline bool guarded_copy(void* dest, const std::byte* src, std::size_t n) noexcept {
    return guarded_read(src, n, [&]() noexcept { detail::copy_from_mapping(dest, src, n); });
}

// The error for a guarded copy that failed: `path` shrank below `offset` while mapped. Names the size
// the file has now, when it can still be stat'ed.
inline format_error file_shrank_error(const std::string& path, std::uint64_t offset) {
    struct stat st {};
    std::string now = ::stat(path.c_str(), &st) == 0 ? " (it is now " + std::to_string(st.st_size) + " bytes)" : " (it is gone)";
    return format_error(path, offset,
                        "the file shrank while mapped" + now +
                            ": it was truncated or rewritten in place under a running job; replace files by renaming a new one over them");
}

}  // namespace detail
}  // namespace feedline
