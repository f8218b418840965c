// feedline/detail/paths.hpp: turning what a user typed into files, without surprises. Globs are
// expanded by glob(3) (sorted), or as glob(3) would from one listing of their directory while a
// glob_listings lives; directories are listed one level deep, regular files only, sorted.
// Nothing here throws std::filesystem_error: an entry that cannot be examined (a symlink loop, a
// dangling link, no permission) is an io_error naming it, and a path that is not a regular file where
// a file belongs (a FIFO, a device, a directory) is refused before anything opens it.
// Backs the local storage scheme (storage/storage_scheme.hpp); its string helpers serve format/ and
// pipeline/.
#pragma once

#include <dirent.h>
#include <fnmatch.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <feedline/detail/thread_scope.hpp>
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

// Directory listings shared by the globs expanded while one lives (on its thread): a mixture of
// 10,000 domains whose shards share a directory, each domain a glob of its own ("web_17_*.bin"), had
// glob(3) read the whole directory for every domain, twice (its kind, then its files): 30,000 files
// in one directory took 165 s to open. While a memo is active, a pattern with wildcards in its last
// component only reads its directory once; its names are matched as glob(3) matches them (fnmatch
// with FNM_PERIOD: a leading dot must be matched by one; every kind of entry, unexamined), only those
// that start with the pattern's text before its first wildcard, and the paths sorted as it sorts them
// (strcoll). Anything else, or a directory that cannot be listed, goes to glob(3). Files added to a
// directory while its listing is held are not seen by later globs in the scope, as if they had come
// after the open.
class glob_listings : public thread_scope<glob_listings> {
public:
    // What glob(3) would return for `pattern`, from the memo's listing of its directory; nullopt when
    // the pattern is not one it answers (glob(3) then does).
    std::optional<std::vector<std::string>> match(const std::string& pattern) {
        const std::size_t slash = pattern.rfind('/');
        const std::string prefix = slash == std::string::npos ? std::string() : pattern.substr(0, slash + 1);
        const std::string name = pattern.substr(prefix.size());
        // Wildcards or escapes before the last component, an escape or a leading dot in it, and "//x*"
        // (whose matches glob(3) names "/x..."): glob(3).
        if (name.empty() || name.front() == '.' || prefix.find_first_of("*?[\\") != std::string::npos ||
            name.find('\\') != std::string::npos || prefix == "//")
            return std::nullopt;
        const std::vector<std::string>* names = listing(prefix.empty() ? std::string(".") : prefix);
        if (names == nullptr) return std::nullopt;
        // Only the names that start with the pattern's text before its first wildcard can match: a
        // range of the byte-ordered listing, so each domain's glob looks at its own files.
        const std::string literal = name.substr(0, name.find_first_of("*?["));
        std::vector<std::string> out;
        for (auto it = std::lower_bound(names->begin(), names->end(), literal);
             it != names->end() && it->compare(0, literal.size(), literal) == 0; ++it)
            if (::fnmatch(name.c_str(), it->c_str(), FNM_PERIOD) == 0) out.push_back(prefix + *it);
        // Whole paths, as glob(3) compares them (a locale's collation need not order the names alone alike).
        std::sort(out.begin(), out.end(),
                  [](const std::string& a, const std::string& b) { return std::strcoll(a.c_str(), b.c_str()) < 0; });
        return out;
    }
    // Directories read whole so far.
    std::size_t directories_listed() const noexcept { return listed_; }

private:
    // The entries of `dir` but "." and "..", in byte order; nullptr when it cannot be read to the end.
    const std::vector<std::string>* listing(const std::string& dir) {
        auto [it, fresh] = dirs_.try_emplace(dir);
        if (fresh) {
            const std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);  // closed on a throw too
            if (d != nullptr) {
                std::vector<std::string> names;
                errno = 0;
                for (const dirent* e; (e = ::readdir(d.get())) != nullptr; errno = 0)
                    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
                if (errno == 0) {
                    std::sort(names.begin(), names.end());
                    it->second = std::move(names);
                    ++listed_;
                }
            }
        }
        return it->second ? &*it->second : nullptr;
    }

    std::unordered_map<std::string, std::optional<std::vector<std::string>>> dirs_;
    std::size_t listed_ = 0;
};

inline std::vector<std::string> glob_paths(const std::string& pattern) {
    if (glob_listings* memo = glob_listings::active())
        if (auto matches = memo->match(pattern)) return std::move(*matches);
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
