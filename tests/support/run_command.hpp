// Runs a tool the way a user does (through the shell) and captures its exit code, stdout and stderr.
// Shared by the tests of the command-line tools and of the trainer.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "test_support.hpp"

namespace feedline::test {

struct result {
    int code = -1;
    std::string out, err;
};

// Runs a shell command, capturing stdout and stderr (stderr through a file in `dir`).
inline result run(const std::string& cmd, const scratch_dir& dir) {
    std::string err_path = dir / "stderr.txt";
    FILE* p = ::popen((cmd + " 2>" + err_path).c_str(), "r");
    REQUIRE(p != nullptr);
    result r;
    char buf[65536];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    int status = ::pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream e(err_path);
    r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return r;
}

}  // namespace feedline::test
