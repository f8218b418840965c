// feedline/detail/thread_name.hpp: names the calling thread ("feedline-w0", ...) so that top -H,
// perf, gdb and /proc/PID/task/*/comm tell the library's threads from the trainer's. Linux keeps 15
// bytes of a name; longer names are cut. Naming is best effort: a failure changes nothing else.
#pragma once

#include <pthread.h>

#include <string>

namespace feedline::detail {

inline void name_this_thread(std::string name) noexcept {
    if (name.size() > 15) name.resize(15);
    ::pthread_setname_np(::pthread_self(), name.c_str());
}

}  // namespace feedline::detail
