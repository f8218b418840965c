// feedline/detail/paths.hpp: turning what a user typed into files, without surprises. Globs are
// expanded by glob(3) (sorted); directories are listed one level deep, regular files only, sorted.
// Nothing here throws std::filesystem_error: an entry that cannot be examined (a symlink loop, a
// dangling link, no permission) is an io_error naming it, and a path that is not a regular file where
// a file belongs (a FIFO, a device, a directory) is refused before anything opens it.
// Backs the local storage scheme (storage/storage_scheme.hpp); its string helpers serve format/ and
// pipeline/.
#pragma once

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>

namespace feedline::detail {

inline bool path_exists(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
}

inline bool is_directory(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

inline bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

inline std::string strip_suffix(const std::string& s, std::string_view suffix) {
    return ends_with(s, suffix) ? s.substr(0, s.size() - suffix.size()) : s;
}

// The directory for feedline's caches: `configured`, else $FEEDLINE_CACHE_DIR, else
// $XDG_CACHE_HOME/feedline, else ~/.cache/feedline; empty for "none" or when none can be named.
inline std::string cache_directory(const std::string& configured) {
    if (configured == "none") return {};
    if (!configured.empty()) return configured;
    if (const char* d = std::getenv("FEEDLINE_CACHE_DIR"); d && *d) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/feedline";
    if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/feedline";
    return {};
}

inline std::vector<std::string> glob_paths(const std::string& pattern) {
    glob_t g{};
    std::vector<std::string> out;
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    if (rc == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    return out;  // glob sorts its results
}

// The regular files directly in `dir`, sorted by name. Subdirectories are skipped; an entry that cannot
// be examined (a symlink loop, a dangling link) is an io_error naming it, never silently missing data.
inline std::vector<std::string> regular_files_in(const std::string& dir) {
    std::vector<std::string> files;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec), end;
    if (ec) throw io_error(dir, ec.value(), "cannot list the directory");
    for (; it != end; it.increment(ec)) {
        if (ec) throw io_error(dir, ec.value(), "cannot list the directory");
        const std::string path = it->path().string();
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0)
            throw io_error(path, errno, "cannot stat this entry of " + dir + " (a dangling link or a symlink loop?)");
        if (S_ISREG(st.st_mode)) files.push_back(path);
    }
    if (ec) throw io_error(dir, ec.value(), "cannot list the directory");
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace feedline::detail
