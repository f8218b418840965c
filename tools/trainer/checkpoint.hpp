// trainer/checkpoint.hpp: durable, verified training checkpoints.
// `--checkpoint ROOT` keeps checkpoints as ROOT/step-<12 digits>/, each holding trainer.json (step,
// model and run shape, the pipeline's state), tensors.bin (parameters and AdamW moments, fp32, behind
// a small header) and manifest.json (every file's size and CRC-32), written last. A checkpoint is
// built in a fresh directory under an unpredictable name, every file and the directory are fsync'd,
// and one rename publishes it; the root is fsync'd after. So a kill or power loss at any point leaves
// either the complete checkpoint or none under a step-* name, and the checkpoints before it intact.
// Loading verifies the manifest (sizes, checksums), every number's type and range, the tensors
// (exact size, finite values) and that the trainer's and the pipeline's steps agree; resuming from a
// root takes the newest checkpoint that verifies and warns naming what was wrong with newer ones.
#pragma once

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_*
#include <sys/stat.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <feedline/format/json_fields.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/pipeline/options.hpp>
#include <feedline/pipeline/state.hpp>

#include "model.hpp"

namespace trainer {

struct checkpoint {
    std::uint64_t step = 0;    // optimizer steps done
    std::uint64_t tokens = 0;  // tokens trained on, all ranks
    model_config model;
    std::uint64_t global_batch = 0, seq_len = 0, grad_accum = 1, seed = 0;
    std::string mode;
    std::string pipeline_state;  // feedline::to_json(pipeline.state())
    // The training pipeline's options (feedline::options_to_json): what produced the batches, in the
    // form --config reads; null in checkpoints from before it was recorded.
    nlohmann::json pipeline_options;
    std::vector<float> params, m, v;
    // The run's lineage: this checkpoint's id (64 random bits as hex, set by save_checkpoint), the id
    // of the checkpoint the run went on from (the one it resumed from or saved before; "" for none),
    // and its place in the root's write order (1, 2, ...; 0 in checkpoints from before lineages).
    std::string id, parent;
    std::uint64_t generation = 0;
};

inline nlohmann::json to_json(const model_config& c) {
    return {{"vocab", c.vocab}, {"context", c.context}, {"embed", c.embed}, {"hidden", c.hidden}};
}

class checkpoint_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {

constexpr char tensors_magic[8] = {'F', 'L', 'T', 'R', 'N', 'v', '1', '\0'};
constexpr const char* manifest_format = "feedline-train checkpoint manifest";
constexpr const char* step_prefix = "step-";

inline std::uint32_t crc32_of(const std::string& bytes) {
    boost::crc_32_type crc;
    crc.process_bytes(bytes.data(), bytes.size());
    return crc.checksum();
}

// A whole file's bytes. Throws checkpoint_error naming it (a directory or FIFO in its place included).
inline std::string read_file(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) throw checkpoint_error(path.string() + ": cannot open (" + std::strerror(errno) + ")");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw checkpoint_error(path.string() + ": not a regular file");
    }
    std::string out(static_cast<std::size_t>(st.st_size), '\0');
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
    if (done != out.size())
        throw checkpoint_error(path.string() + ": changed while read (" + std::to_string(done) + " of " + std::to_string(out.size()) +
                               " bytes)");
    return out;
}

// Writes `bytes` to dir/name and fsyncs it. The directory is private to this save (see save_checkpoint).
inline void write_synced(const std::filesystem::path& path, const std::string& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) throw checkpoint_error(path.string() + ": cannot create (" + std::strerror(errno) + ")");
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = errno;
            ::close(fd);
            throw checkpoint_error(path.string() + ": write failed (" + std::strerror(err) + ")");
        }
        done += static_cast<std::size_t>(n);
    }
    const int rc = ::fsync(fd), err = errno;
    ::close(fd);
    if (rc != 0) throw checkpoint_error(path.string() + ": fsync failed (" + std::strerror(err) + ")");
}

inline void sync_directory(const std::filesystem::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw checkpoint_error(dir.string() + ": cannot open to sync (" + std::strerror(errno) + ")");
    const int rc = ::fsync(fd), err = errno;
    ::close(fd);
    if (rc != 0 && err != EINVAL) throw checkpoint_error(dir.string() + ": fsync failed (" + std::strerror(err) + ")");
}

// 16 lowercase hex digits (or "" where `may_be_empty`).
inline bool is_lineage_id(const std::string& s, bool may_be_empty) {
    if (s.empty()) return may_be_empty;
    return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

inline std::string step_name(std::uint64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "%s%012llu", step_prefix, static_cast<unsigned long long>(step));
    return name;
}

}  // namespace detail

// One file a manifest vouches for.
struct manifest_entry {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint32_t crc32 = 0;
};

// Parses manifest.json. Throws checkpoint_error naming `what` for anything but a well-formed
// manifest: bad JSON, a wrong format or version, a name that is not a plain file name, sizes and
// checksums that are not integers in range, a file listed twice or a required file missing.
inline std::vector<manifest_entry> parse_manifest(const std::string& text, const std::string& what) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) throw checkpoint_error(what + ": not JSON");
    if (feedline::json_format_of(j) != detail::manifest_format) throw checkpoint_error(what + ": not a feedline-train checkpoint manifest");
    try {
        const feedline::json_fields f(j, what);
        if (f.u64("version") != 1) f.fail("unknown version (expected 1)");
        std::vector<manifest_entry> out;
        for (const auto& e : f.array("files")) {
            if (!e.is_object()) f.fail("files[] is not an object");
            const feedline::json_fields ef(e, what);
            const auto& name = ef.field("name");
            if (!name.is_string()) ef.fail("files[].name is not a string");
            manifest_entry m{name.get<std::string>(), ef.u64("bytes"), ef.u32("crc32")};
            if (m.name.empty() || m.name == "." || m.name == ".." || m.name.find('/') != std::string::npos ||
                m.name.find('\0') != std::string::npos)
                ef.fail("files[].name '" + m.name + "' is not a plain file name");
            if (std::any_of(out.begin(), out.end(), [&](const manifest_entry& o) { return o.name == m.name; }))
                ef.fail("files[] lists " + m.name + " twice");
            out.push_back(std::move(m));
        }
        for (const char* required : {"trainer.json", "tensors.bin"})
            if (std::none_of(out.begin(), out.end(), [&](const manifest_entry& m) { return m.name == required; }))
                f.fail(std::string("files[] does not list ") + required);
        return out;
    } catch (const feedline::format_error& e) {
        throw checkpoint_error(e.what());
    }
}

// Reads a checkpoint's files after checking each against the manifest: name -> bytes.
inline std::vector<std::pair<std::string, std::string>> read_verified(const std::filesystem::path& dir) {
    const auto manifest_path = dir / "manifest.json";
    const auto entries = parse_manifest(detail::read_file(manifest_path), manifest_path.string());
    std::vector<std::pair<std::string, std::string>> files;
    for (const auto& e : entries) {
        const auto path = dir / e.name;
        std::string bytes = detail::read_file(path);
        if (bytes.size() != e.bytes)
            throw checkpoint_error(path.string() + ": " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                                   std::to_string(e.bytes));
        if (const auto crc = detail::crc32_of(bytes); crc != e.crc32)
            throw checkpoint_error(path.string() + ": CRC-32 " + std::to_string(crc) + " differs from the manifest's " +
                                   std::to_string(e.crc32) + " (the file is corrupt)");
        files.emplace_back(e.name, std::move(bytes));
    }
    return files;
}

// Parses trainer.json and tensors.bin (already verified against the manifest, but still checked:
// the manifest vouches for bytes, not for what they mean). Throws checkpoint_error.
inline checkpoint parse_checkpoint(const std::string& json_text, const std::string& tensors, const std::string& json_path,
                                   const std::string& tensors_path) {
    checkpoint c;
    const auto j = nlohmann::json::parse(json_text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw checkpoint_error(json_path + ": not a JSON object");
    try {
        const feedline::json_fields f(j, json_path);
        const auto& format = f.field("format");
        if (!format.is_string() || format.get<std::string>() != "feedline-train checkpoint" || f.u64("version") != 1)
            f.fail("not a version 1 feedline-train checkpoint");
        c.step = f.u64("step");
        c.tokens = f.u64("tokens");
        const feedline::json_fields m(f.field("model"), json_path + " model");
        const std::uint64_t limit = std::uint64_t(1) << 31;  // no dimension of the sample model comes near
        auto dim = [&](const char* name) { return static_cast<std::uint32_t>(m.whole(m.field(name), name, limit)); };
        c.model = {dim("vocab"), dim("context"), dim("embed"), dim("hidden")};
        c.global_batch = f.u64("global_batch");
        c.seq_len = f.u64("seq_len");
        c.grad_accum = f.whole(f.field("grad_accum"), "grad_accum", UINT32_MAX);
        if (c.grad_accum == 0) f.fail("grad_accum is 0");
        c.seed = f.u64("seed");
        const auto& mode = f.field("mode");
        if (!mode.is_string() || (mode.get<std::string>() != "windows" && mode.get<std::string>() != "packed"))
            f.fail("mode is not \"windows\" or \"packed\"");
        c.mode = mode.get<std::string>();
        c.pipeline_state = f.field("pipeline_state").dump();
        if (j.contains("pipeline_options")) {
            c.pipeline_options = f.field("pipeline_options");
            try {
                feedline::pipeline_config check;
                feedline::options_from_json(check, c.pipeline_options, "pipeline_options");
            } catch (const feedline::config_error& e) {
                f.fail(e.what());
            }
        }
        if (j.contains("generation")) {
            c.generation = f.u64("generation");
            for (auto [name, out] : {std::pair{"id", &c.id}, std::pair{"parent", &c.parent}}) {
                const auto& v = f.field(name);
                if (!v.is_string() || !detail::is_lineage_id(v.get<std::string>(), std::string(name) == "parent"))
                    f.fail(std::string(name) + " is not a checkpoint id");
                *out = v.get<std::string>();
            }
        }
    } catch (const feedline::format_error& e) {
        throw checkpoint_error(e.what());
    }
    // The two steps must agree: the pipeline takes one batch per optimizer step (all its micro-batches),
    // or, in checkpoints of an earlier feedline-train, one per micro-batch: grad_accum per step (a last
    // step cut short by the end of the data took fewer).
    try {
        const auto state = feedline::pipeline_state_from_json(c.pipeline_state);
        const std::uint64_t first = c.step * c.grad_accum;
        const bool per_step = state.global_batch == c.global_batch && state.step == c.step;
        if (!per_step && c.grad_accum != 0 && (first / c.grad_accum != c.step || state.step < first || state.step - first >= c.grad_accum))
            throw checkpoint_error(json_path + ": the trainer is at step " + std::to_string(c.step) + " (" + std::to_string(c.grad_accum) +
                                   " micro-batches each) but the pipeline's state is at batch " + std::to_string(state.step));
    } catch (const feedline::error& e) {
        throw checkpoint_error(json_path + ": pipeline_state: " + e.what());
    }
    const std::uint64_t n = c.model.parameter_count();
    const std::uint64_t header = sizeof detail::tensors_magic + sizeof(std::uint64_t);
    if (tensors.size() < header || std::memcmp(tensors.data(), detail::tensors_magic, sizeof detail::tensors_magic) != 0)
        throw checkpoint_error(tensors_path + " @ byte 0: missing or bad header");
    std::uint64_t stored = 0;
    std::memcpy(&stored, tensors.data() + sizeof detail::tensors_magic, sizeof stored);
    if (stored != n)
        throw checkpoint_error(tensors_path + " @ byte 8: holds " + std::to_string(stored) + " parameters, the model in trainer.json has " +
                               std::to_string(n));
    if (tensors.size() != header + 3 * n * sizeof(float))
        throw checkpoint_error(tensors_path + " @ byte " +
                               std::to_string(std::min<std::uint64_t>(tensors.size(), header + 3 * n * sizeof(float))) + ": " +
                               std::to_string(tensors.size()) + " bytes, expected " + std::to_string(header + 3 * n * sizeof(float)) +
                               (tensors.size() < header + 3 * n * sizeof(float) ? " (truncated)" : " (trailing bytes)"));
    std::uint64_t offset = header;
    for (auto* v : {&c.params, &c.m, &c.v}) {
        v->resize(n);
        std::memcpy(v->data(), tensors.data() + offset, n * sizeof(float));
        for (std::uint64_t i = 0; i < n; ++i)
            if (!std::isfinite((*v)[i]) || (v == &c.v && (*v)[i] < 0))
                throw checkpoint_error(
                    tensors_path + " @ byte " + std::to_string(offset + i * sizeof(float)) + ": " +
                    (std::isfinite((*v)[i]) ? "a negative second moment" : "a value that is not finite (NaN or infinity)"));
        offset += n * sizeof(float);
    }
    return c;
}

// Loads one checkpoint directory, verified. Throws checkpoint_error naming the file at fault.
inline checkpoint load_checkpoint(const std::filesystem::path& dir) {
    if (!std::filesystem::exists(dir / "manifest.json"))
        throw checkpoint_error((dir / "manifest.json").string() +
                               ": missing (not a checkpoint, an interrupted save, or one from a feedline-train without manifests)");
    const auto files = read_verified(dir);
    auto find = [&](const char* name) -> const std::string& {
        return std::find_if(files.begin(), files.end(), [&](const auto& f) { return f.first == name; })->second;
    };
    return parse_checkpoint(find("trainer.json"), find("tensors.bin"), (dir / "trainer.json").string(), (dir / "tensors.bin").string());
}

// Where a published checkpoint stands in its root's lineages, read from its trainer.json alone (the
// rest is verified when it is loaded).
struct lineage {
    std::uint64_t step = 0, generation = 0;  // generation 0: saved before lineages were recorded
    std::string id, parent;
};

// Throws checkpoint_error when trainer.json cannot be read or parsed.
inline lineage lineage_of(const std::filesystem::path& dir) {
    const auto path = dir / "trainer.json";
    const auto j = nlohmann::json::parse(detail::read_file(path), nullptr, false);
    if (!j.is_object()) throw checkpoint_error(path.string() + ": not a JSON object");
    lineage l;
    try {
        const feedline::json_fields f(j, path.string());
        l.step = f.u64("step");
        if (j.contains("generation")) {
            l.generation = f.u64("generation");
            const auto& id = f.field("id");
            const auto& parent = f.field("parent");
            if (!id.is_string() || !parent.is_string() || !detail::is_lineage_id(id.get<std::string>(), false) ||
                !detail::is_lineage_id(parent.get<std::string>(), true))
                f.fail("id or parent is not a checkpoint id");
            l.id = id.get<std::string>();
            l.parent = parent.get<std::string>();
        }
    } catch (const feedline::format_error& e) {
        throw checkpoint_error(e.what());
    }
    return l;
}

// The step-* directories directly under a root, unordered.
inline std::vector<std::filesystem::path> step_directories(const std::filesystem::path& root) {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.size() == std::strlen(detail::step_prefix) + 12 && name.rfind(detail::step_prefix, 0) == 0 &&
            std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
            out.push_back(it->path());
    }
    return out;
}

// The checkpoints under a root, newest first: in the order they were written (generation), not by
// step, so after a run went back to an earlier checkpoint its new ones come before the abandoned
// run's later steps. Checkpoints from before lineages follow, highest step first, then any whose
// trainer.json cannot be read (`unreadable`, when given, gets them with the reason).
inline std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& root,
                                                         std::vector<std::pair<std::filesystem::path, std::string>>* unreadable = nullptr) {
    std::vector<std::pair<lineage, std::filesystem::path>> known;
    std::vector<std::filesystem::path> damaged;
    for (const auto& dir : step_directories(root)) {
        try {
            known.emplace_back(lineage_of(dir), dir);
        } catch (const checkpoint_error& e) {
            damaged.push_back(dir);
            if (unreadable) unreadable->emplace_back(dir, e.what());
        }
    }
    std::sort(known.begin(), known.end(), [](const auto& a, const auto& b) {
        return std::tie(a.first.generation, a.first.step, a.second) > std::tie(b.first.generation, b.first.step, b.second);
    });
    std::sort(damaged.rbegin(), damaged.rend());
    std::vector<std::filesystem::path> out;
    for (const auto& k : known) out.push_back(k.second);
    out.insert(out.end(), damaged.begin(), damaged.end());
    return out;
}

// `--resume PATH`: a checkpoint directory (loaded as it is) or a root of them (the newest that
// verifies, in write order; `warn` is told what was wrong with each newer one and with any that cannot
// be read at all). Throws checkpoint_error when none does.
inline checkpoint resume_from(const std::filesystem::path& path, const std::function<void(const std::string&)>& warn) {
    if (std::filesystem::exists(path / "manifest.json")) return load_checkpoint(path);
    std::vector<std::pair<std::filesystem::path, std::string>> unreadable;
    const auto found = checkpoints_in(path, &unreadable);
    if (found.empty()) throw checkpoint_error(path.string() + ": no checkpoint here (neither manifest.json nor step-* directories)");
    std::string why;
    for (const auto& [dir, reason] : unreadable) warn(std::string("warning: skipping checkpoint ") + dir.string() + ": " + reason);
    for (const auto& dir : found) {
        if (std::any_of(unreadable.begin(), unreadable.end(), [&](const auto& u) { return u.first == dir; })) {
            why += "\n  " + std::find_if(unreadable.begin(), unreadable.end(), [&](const auto& u) { return u.first == dir; })->second;
            continue;
        }
        try {
            return load_checkpoint(dir);
        } catch (const checkpoint_error& e) {
            warn(std::string("warning: skipping checkpoint ") + dir.string() + ": " + e.what());
            why += std::string("\n  ") + e.what();
        }
    }
    throw checkpoint_error(path.string() + ": no intact checkpoint:" + why);
}

// Makes sure checkpoints can be saved under `root` before a run spends hours training: creates it and
// a directory in it (removed again). Throws checkpoint_error naming the root and the reason.
inline void check_checkpoint_root(const std::filesystem::path& root) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) throw checkpoint_error(root.string() + ": cannot create the checkpoint directory (" + ec.message() + ")");
    const auto probe = root / (".partial-probe-" + feedline::unpredictable_suffix());
    if (::mkdir(probe.c_str(), 0755) != 0)
        throw checkpoint_error(root.string() + ": checkpoints cannot be written here (" + std::strerror(errno) + ")");
    ::rmdir(probe.c_str());
}

// What save_checkpoint published.
struct saved_checkpoint {
    std::filesystem::path dir;
    std::string id, parent;
    std::uint64_t generation = 0;
    std::vector<std::filesystem::path> removed;  // older checkpoints of this lineage beyond `keep`
};

// Saves `c` under root/step-<N> as the newest checkpoint of its lineage (`c.parent`: the id of the
// checkpoint the run went on from) and keeps the newest `keep` checkpoints of that lineage (0: all).
// Checkpoints of other lineages (an abandoned run that this one went back before, another run in the
// same root) are never removed. See the top of the file for the durability argument. Throws
// checkpoint_error (or std::filesystem_error for the root).
inline saved_checkpoint save_checkpoint(const std::filesystem::path& root, const checkpoint& c, std::size_t keep = 2) {
    namespace fs = std::filesystem;
    fs::create_directories(root);
    const fs::path final_dir = root / detail::step_name(c.step);
    saved_checkpoint saved{final_dir, feedline::unpredictable_suffix(), c.parent, 1, {}};
    std::vector<std::pair<lineage, fs::path>> existing;
    for (const auto& dir : step_directories(root)) {
        try {
            existing.emplace_back(lineage_of(dir), dir);
            saved.generation = std::max(saved.generation, existing.back().first.generation + 1);
        } catch (const checkpoint_error&) {  // unreadable: neither an ancestor nor removed
        }
    }
    // Saving the step of the checkpoint this one goes on from again (a periodic save, then the last
    // one at the same step) replaces it: the new one takes its place in the lineage.
    for (const auto& [l, dir] : existing)
        if (dir == final_dir && !l.id.empty() && l.id == saved.parent) saved.parent = l.parent;
    // Fresh and private: mkdir fails if the name exists, so nothing planted there is written through.
    const fs::path work = root / (".partial-" + detail::step_name(c.step) + "-" + feedline::unpredictable_suffix());
    if (::mkdir(work.c_str(), 0755) != 0) throw checkpoint_error(work.string() + ": cannot create (" + std::strerror(errno) + ")");
    try {
        nlohmann::json j = {{"format", "feedline-train checkpoint"},
                            {"version", 1},
                            {"step", c.step},
                            {"tokens", c.tokens},
                            {"model", to_json(c.model)},
                            {"global_batch", c.global_batch},
                            {"seq_len", c.seq_len},
                            {"grad_accum", c.grad_accum},
                            {"seed", c.seed},
                            {"mode", c.mode},
                            {"generation", saved.generation},
                            {"id", saved.id},
                            {"parent", saved.parent},
                            {"pipeline_state", nlohmann::json::parse(c.pipeline_state)}};
        if (!c.pipeline_options.is_null()) j["pipeline_options"] = c.pipeline_options;
        const std::string json_text = j.dump(2) + "\n";
        std::string tensors(sizeof detail::tensors_magic, '\0');
        std::memcpy(tensors.data(), detail::tensors_magic, sizeof detail::tensors_magic);
        const std::uint64_t n = c.params.size();
        tensors.append(reinterpret_cast<const char*>(&n), sizeof n);
        for (const auto* t : {&c.params, &c.m, &c.v}) tensors.append(reinterpret_cast<const char*>(t->data()), n * sizeof(float));
        nlohmann::json files = nlohmann::json::array();
        for (const auto& [name, bytes] :
             {std::pair<const char*, const std::string&>{"trainer.json", json_text}, {"tensors.bin", tensors}}) {
            detail::write_synced(work / name, bytes);
            files.push_back({{"name", name}, {"bytes", bytes.size()}, {"crc32", detail::crc32_of(bytes)}});
        }
        detail::write_synced(work / "manifest.json",
                             nlohmann::json{{"format", detail::manifest_format}, {"version", 1}, {"files", files}}.dump(2) + "\n");
        detail::sync_directory(work);
        // A checkpoint of this step saved before (the last periodic save, again at the end) is swapped
        // with the new one in one atomic exchange, so there is never a moment without either.
        if (::renameat2(AT_FDCWD, work.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
            if (errno != EEXIST || ::renameat2(AT_FDCWD, work.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
                throw checkpoint_error(final_dir.string() + ": cannot publish (" + std::strerror(errno) + ")");
            detail::sync_directory(root);
            fs::remove_all(work);  // now the older checkpoint of this step
        }
        detail::sync_directory(root);
    } catch (...) {
        std::error_code ignored;
        fs::remove_all(work, ignored);
        throw;
    }
    // This lineage, newest first: the new checkpoint, then its parent, its parent's parent, ... as
    // far as they are here. Only those beyond `keep` go.
    std::vector<fs::path> chain{final_dir};
    for (std::string next = saved.parent; !next.empty() && chain.size() <= existing.size();) {
        const auto it =
            std::find_if(existing.begin(), existing.end(), [&](const auto& e) { return e.first.id == next && e.second != final_dir; });
        if (it == existing.end()) break;
        chain.push_back(it->second);
        next = it->first.parent;
    }
    for (std::size_t i = keep; keep != 0 && i < chain.size(); ++i) {
        fs::remove_all(chain[i]);
        saved.removed.push_back(chain[i]);
    }
    if (keep != 0 && chain.size() > keep) detail::sync_directory(root);
    // Partial saves a killed run left (never a published one).
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
        if (it->path().filename().string().rfind(".partial-", 0) == 0 && it->path() != work) fs::remove_all(it->path(), ec);
    return saved;
}

}  // namespace trainer
