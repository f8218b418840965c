// feedline/version.hpp: the library version, for logs and compatibility checks.
#pragma once

#define FEEDLINE_VERSION_MAJOR 0
#define FEEDLINE_VERSION_MINOR 1
#define FEEDLINE_VERSION_PATCH 0

namespace feedline {
inline constexpr const char* version_string = "0.1.0";
}  // namespace feedline
