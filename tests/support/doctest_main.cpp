// The tests' main: doctest's, after deriving the run's directories from FEEDLINE_TEST_TMPDIR (set by
// ctest for every case; one variable, because doctest_discover_tests splits a list of them): the
// token-count cache under it unless FEEDLINE_CACHE_DIR says otherwise, so no test writes to ~/.cache.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <stdlib.h>

#include <string>

int main(int argc, char** argv) {
    const char* tmp = std::getenv("FEEDLINE_TEST_TMPDIR");
    if (tmp != nullptr && std::getenv("FEEDLINE_CACHE_DIR") == nullptr)
        ::setenv("FEEDLINE_CACHE_DIR", (std::string(tmp) + "/cache").c_str(), 0);
    return doctest::Context(argc, argv).run();
}
