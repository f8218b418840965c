// Backend fallback, proven by really denying io_uring: a child process installs a seccomp filter that
// makes io_uring_setup fail with EPERM (as container runtimes' default profiles do), then asks for
// the automatic backend. It must get mmap with the kernel's refusal as the reason, and an explicit
// request for io_uring must fail with an io_error.
#include <doctest/doctest.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include <feedline/storage/reader.hpp>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Returns EPERM for io_uring_setup, allows everything else.
bool deny_io_uring_setup() {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Runs `body` in a forked child; the child's exit code is the result (0 = every check passed).
template <class F>
int in_child(F&& body) {
    pid_t pid = ::fork();
    if (pid == 0) {
        int rc = 1;
        try {
            rc = body();
        } catch (...) {
            rc = 2;
        }
        std::_Exit(rc);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("Storage.Fallback.SeccompDeniedUringFallsBackToMmapWithReason") {
#if !defined(__x86_64__)
    ft::skip("the seccomp filter in this test is written for x86-64");
#endif
#if !FEEDLINE_HAS_URING
    ft::skip("io_uring support not built: nothing to deny");
#endif
    if (auto why = io_uring_unavailable_reason()) ft::skip("io_uring already unavailable: " + *why);
    ft::scratch_dir dir;
    auto bytes = ft::patterned_bytes(10000, 7);
    ft::write_bytes(dir / "data", bytes.data(), bytes.size());

    int rc = in_child([&] {
        if (!deny_io_uring_setup()) return 10;
        auto why = io_uring_unavailable_reason();
        if (!why || why->find("EPERM") == std::string::npos) return 11;
        auto r = make_reader();  // automatic
        if (r.backend() != io_backend::mmap) return 12;
        if (r.reason().find("seccomp") == std::string::npos) return 13;
        // The fallback still reads correctly.
        file f(dir / "data");
        std::vector<std::byte> out(500);
        read_request req{&f, 1234, 500, out.data()};
        r.read(std::span(&req, 1));
        if (std::memcmp(out.data(), bytes.data() + 1234, 500) != 0) return 14;
        // Direct I/O falls back to pread, never to mmap (which cannot bypass the page cache).
        if (make_reader({.direct = true}).backend() != io_backend::pread) return 15;
        try {
            make_reader({.backend = io_backend::io_uring});
            return 16;
        } catch (const io_error& e) {
            if (std::string(e.what()).find("EPERM") == std::string::npos) return 17;
        }
        return 0;
    });
    CHECK(rc == 0);
}
