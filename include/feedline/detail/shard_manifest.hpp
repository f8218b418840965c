// feedline/detail/shard_manifest.hpp: publishing a numbered set of shards ("<prefix>_000000.bin", ...)
// so that a later writer of the same prefix removes exactly what an earlier one wrote, never a file of
// another dataset. A writer may delete a file only when it can prove it wrote it: the file carries this
// writer's numbering ("_" and six digits, more only past 999999) and the set's manifest
// "<prefix>.manifest" lists it with its size and modification time. Anything else named like a
// shard of the set (another Megatron dataset "web_2024", a user's "web_000003.bin" copied in) makes the
// writer refuse, naming it. Used by llmc_writer and megatron_shards_writer, under an output_lock.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/detail/paths.hpp>
#include <feedline/error.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/output/output_lock.hpp>

namespace feedline::detail {

// A file a manifest vouches for: its name (no directory) and identity.
struct manifest_entry {
    std::string name;
    file_identity id;
};

inline constexpr std::string_view shard_manifest_header = "feedline shard manifest 1";

// "<bytes> <mtime_ns> <name>" lines after the header. Names run to the end of the line.
inline std::string format_shard_manifest(const std::vector<manifest_entry>& entries) {
    std::string out(shard_manifest_header);
    out += '\n';
    for (const auto& e : entries) out += std::to_string(e.id.bytes) + ' ' + std::to_string(e.id.mtime_ns) + ' ' + e.name + '\n';
    return out;
}

// Parses a manifest; nullopt for anything malformed (an unreadable manifest vouches for nothing).
inline std::optional<std::vector<manifest_entry>> parse_shard_manifest(const std::string& text) {
    std::istringstream in(text);
    std::string line;
    if (!std::getline(in, line) || line != shard_manifest_header) return std::nullopt;
    std::vector<manifest_entry> out;
    while (std::getline(in, line)) {
        manifest_entry e;
        unsigned long long bytes = 0;
        long long mtime = 0;
        int used = 0;
        if (std::sscanf(line.c_str(), "%llu %lld %n", &bytes, &mtime, &used) != 2 || used <= 0 ||
            static_cast<std::size_t>(used) >= line.size())
            return std::nullopt;
        e.name = line.substr(static_cast<std::size_t>(used));
        if (e.name.find('/') != std::string::npos) return std::nullopt;
        e.id = {bytes, mtime};
        out.push_back(std::move(e));
    }
    return out;
}

// Is `name` "<stem>_<number><ext>" with this writer's numbering (six digits, or more without a
// leading zero)? Sets `number`.
inline bool is_numbered_like_ours(std::string_view name, std::string_view stem, std::string_view ext, std::uint64_t* number = nullptr) {
    if (name.size() < stem.size() + 1 + 6 + ext.size() || name.substr(0, stem.size()) != stem || name[stem.size()] != '_' ||
        name.substr(name.size() - ext.size()) != ext)
        return false;
    const std::string_view digits = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
    if (digits.size() > 6 && digits[0] == '0') return false;
    if (digits.size() > 18) return false;
    if (number) *number = std::stoull(std::string(digits));
    return true;
}

// The numbered shards of one prefix and their manifest. Not thread-safe.
class numbered_outputs {
public:
    // `exts`: each shard's files in the order they are published (Megatron: .bin then .idx). Reads
    // the manifest and throws io_error naming every file numbered like the set's shards that it does
    // not vouch for (see check()). `lock` must be held on `prefix` for this object's life.
    numbered_outputs(std::string prefix, std::vector<std::string> exts, const output_lock& lock)
            : prefix_(std::move(prefix)), exts_(std::move(exts)), lock_(lock) {
        if (prefix_.find('\n') != std::string::npos) throw config_error("output", "an output prefix with a newline in it");
        const std::filesystem::path p(prefix_);
        dir_ = p.has_parent_path() ? p.parent_path().string() : ".";
        stem_ = p.filename().string();
        check();
    }

    // "<prefix>_<index as six digits><ext>".
    std::string path(std::size_t index, std::string_view ext) const {
        char num[24];
        std::snprintf(num, sizeof num, "_%06zu", index);
        return prefix_ + num + std::string(ext);
    }
    std::string manifest_path() const { return prefix_ + ".manifest"; }

    // The set's files that exist now and that the manifest vouches for (same name, size and
    // modification time), sorted. Throws io_error naming the files numbered like the set's that it
    // does not vouch for: they are someone else's, and feedline never deletes or replaces them.
    std::vector<std::string> check() const {
        const auto listed = read_manifest();
        std::vector<std::string> owned, foreign;
        for (const auto& name : numbered_names()) {
            const std::string full = (std::filesystem::path(dir_) / name).string();
            const auto id = identity_of(full);
            const bool ours =
                id && std::any_of(listed.begin(), listed.end(), [&](const manifest_entry& e) { return e.name == name && e.id == *id; });
            (ours ? owned : foreign).push_back(full);
        }
        if (!foreign.empty()) {
            std::string names;
            for (std::size_t i = 0; i < foreign.size() && i < 5; ++i) names += (i ? ", " : "") + foreign[i];
            if (foreign.size() > 5) names += " and " + std::to_string(foreign.size() - 5) + " more";
            throw io_error(
                foreign.front(), EEXIST,
                std::to_string(foreign.size()) + " file(s) named like the shards of " + prefix_ +
                    " that no manifest of an earlier pack into it (" + manifest_path() + ") vouches for: " + names +
                    ". feedline replaces or removes only files it can prove it wrote; move them away or write to another prefix");
        }
        return owned;
    }

    // Publishes shards 0..n-1. `identities[i]` holds shard i's files' identities (in `exts` order) as
    // written under their temporary names; `commit(i)` renames shard i's files into place. In order,
    // each step synced: a manifest vouching for the earlier set and the new one; the earlier set's
    // files removed (indexes before data, last shard first, so a kill leaves shards 0..k of one set);
    // the new shards committed in order; a manifest of the new set alone. A kill anywhere leaves every
    // shard file present listed in the manifest present, so the next writer can clean up after it.
    void publish(const std::vector<std::vector<file_identity>>& identities, const std::function<void(std::size_t)>& commit) {
        const auto owned = check();
        std::vector<manifest_entry> next;
        for (std::size_t i = 0; i < identities.size(); ++i)
            for (std::size_t k = 0; k < exts_.size(); ++k)
                next.push_back({std::filesystem::path(path(i, exts_[k])).filename().string(), identities[i].at(k)});
        std::vector<manifest_entry> both = next;
        for (const auto& full : owned) both.push_back({std::filesystem::path(full).filename().string(), *identity_of(full)});
        write_manifest(both);
        for (auto ext = exts_.rbegin(); ext != exts_.rend(); ++ext) {
            std::vector<std::string> these;
            for (const auto& full : owned)
                if (ends_with(full, *ext)) these.push_back(full);
            std::sort(these.rbegin(), these.rend());
            for (const auto& full : these)
                if (::unlink(full.c_str()) != 0 && errno != ENOENT)
                    throw io_error(full, errno, "cannot remove a shard of the earlier pack");
        }
        if (!owned.empty()) sync_parent_directory(prefix_);
        for (std::size_t i = 0; i < identities.size(); ++i) commit(i);
        write_manifest(next);
    }

private:
    // Names in the directory numbered like the set's shards, for any of its extensions.
    std::vector<std::string> numbered_names() const {
        std::vector<std::string> out;
        std::error_code ec;
        for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
            const std::string name = it->path().filename().string();
            if (std::any_of(exts_.begin(), exts_.end(), [&](const std::string& ext) { return is_numbered_like_ours(name, stem_, ext); }))
                out.push_back(name);
        }
        if (ec) throw io_error(dir_, ec.value(), "cannot list the directory");
        std::sort(out.begin(), out.end());
        return out;
    }
    std::vector<manifest_entry> read_manifest() const {
        const std::string mp = manifest_path();
        struct stat st {};
        if (::lstat(mp.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) return {};
        std::ifstream in(mp, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return parse_shard_manifest(text).value_or(std::vector<manifest_entry>{});
    }
    void write_manifest(const std::vector<manifest_entry>& entries) {
        atomic_file out(manifest_path(), 1u << 16, lock_.tag());
        const std::string text = format_shard_manifest(entries);
        out.write(text.data(), text.size());
        out.commit();
    }

    std::string prefix_, dir_, stem_;
    std::vector<std::string> exts_;
    const output_lock& lock_;
};

}  // namespace feedline::detail
