// feedline/detail/paths.hpp: turning what a user typed into files, without surprises. Globs are
// expanded by glob(3) (sorted); directories are listed one level deep, regular files only, sorted.
// Nothing here throws std::filesystem_error: an entry that cannot be examined (a symlink loop, a
// dangling link, no permission) is an io_error naming it, and a path that is not a regular file where
// a file belongs (a FIFO, a device, a directory) is refused before anything opens it.
// Used by format/dataset.hpp, format/text.hpp and pipeline/data_spec.hpp.
#pragma once

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/error.hpp>

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

inline std::vector<std::string> glob_paths(const std::string& pattern) {
    glob_t g{};
    std::vector<std::string> out;
    int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    if (rc == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    return out;  // glob sorts its results
}

// Throws io_error unless `path` is (or links to) a regular file.
inline void require_regular_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw io_error(path, errno, "cannot stat");
    if (S_ISDIR(st.st_mode)) throw io_error(path, EISDIR, "is a directory where a file belongs");
    if (!S_ISREG(st.st_mode)) throw io_error(path, EINVAL, S_ISFIFO(st.st_mode) ? "is a FIFO, not a regular file" : "is a device or socket, not a regular file");
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
        if (::stat(path.c_str(), &st) != 0) throw io_error(path, errno, "cannot stat this entry of " + dir + " (a dangling link or a symlink loop?)");
        if (S_ISREG(st.st_mode)) files.push_back(path);
    }
    if (ec) throw io_error(dir, ec.value(), "cannot list the directory");
    std::sort(files.begin(), files.end());
    return files;
}

// Files named "<prefix>_<digits><ext>" (a writer's numbered shards) that exist now, sorted. Throws
// io_error when the directory cannot be listed.
inline std::vector<std::string> numbered_files(const std::string& prefix, std::string_view ext) {
    namespace fs = std::filesystem;
    const fs::path p(prefix);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    const std::string stem = p.filename().string() + "_";
    std::vector<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() <= stem.size() + ext.size() || name.compare(0, stem.size(), stem) != 0 || !ends_with(name, ext)) continue;
        const std::string_view digits = std::string_view(name).substr(stem.size(), name.size() - stem.size() - ext.size());
        if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
            out.push_back(p.has_parent_path() ? (dir / name).string() : name);
    }
    if (ec) throw io_error(dir.string(), ec.value(), "cannot list the directory");
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace feedline::detail
