// tool_main.hpp: what every feedline command-line tool does the same way. Every exception ends the tool
// with one line on stderr and an exit code that says what happened (never an abort): `failure` (1; 2
// for feedline-doctor, whose 1 means "findings that need action") for bad data, a bad config, an I/O
// error or a resource limit (out of memory, no threads or file descriptors left). JSON a tool prints
// never fails on text that is not UTF-8 (a file name): such bytes print as U+FFFD.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <new>
#include <string>
#include <system_error>

#include <feedline/error.hpp>

namespace tools {

// One JSON value as text, invalid UTF-8 replaced rather than thrown on (nlohmann's type_error 316).
inline std::string json_text(const nlohmann::json& j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Runs `body` (returning the exit code) and turns any exception into "NAME: what" on stderr and
// `failure`. Resource failures get a hint: std::bad_alloc (an address-space or memory limit) and
// std::system_error from thread creation (a process or thread limit).
template <class Body>
int run_tool(const char* name, int failure, Body&& body) {
    try {
        return body();
    } catch (const feedline::error& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%s: out of memory (a memory or address-space limit, ulimit -v, was reached); use fewer workers, a smaller batch or "
                             "memory budget, or raise the limit\n", name);
    } catch (const std::system_error& e) {
        std::fprintf(stderr, "%s: %s (a system limit: threads, processes or open files; see ulimit -u / -n)\n", name, e.what());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
    }
    return failure;
}

}  // namespace tools
