// feedline/sampling/state_io.hpp: sampler states as JSON (the saved form) and, internally, as bytes.
// JSON (with nlohmann_json): one flat, versioned object a person can read in a checkpoint directory,
// with a checksum of every field. Binary (detail::to_bytes, detail::sampler_state_from_bytes): magic
// "FLSAMPL1", then little-endian fields in a fixed order (version 2 adds the origin fields after the
// step, version 3 the mixture fields after those and a count per dataset, version 4 then the weights
// set for later steps: their number, then each one's step and weights); it is only the input of that checksum (detail::state_check), not a format to save, but saved
// checksums depend on it, so a new field means a new version. Both round-trip exactly; corrupt input
// is a format_error.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/format/json_fields.hpp>
#include <feedline/sampling/sampler.hpp>

namespace feedline {

static_assert(std::endian::native == std::endian::little, "the state format is little-endian; add byte swaps for this target");

namespace detail {

inline std::vector<std::byte> to_bytes(const sampler_state& s) {
    std::vector<std::byte> out;
    auto put = [&](const void* p, std::size_t n) {
        auto b = static_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n);
    };
    auto u64 = [&](std::uint64_t v) { put(&v, 8); };
    put("FLSAMPL1", 8);
    u64(s.version);
    for (std::uint64_t v : {s.seed, s.seq_len, s.global_batch, std::uint64_t(s.mode), std::uint64_t(s.shuffle),
                            std::uint64_t(s.shuffle_samples), std::uint64_t(s.tail), s.step})
        u64(v);
    if (s.rebased())
        for (std::uint64_t v : {s.origin_step, s.origin_drawn, s.origin_epoch, s.origin_index}) u64(v);
    if (s.mixed())
        for (std::uint64_t v : {std::uint64_t(s.mixture), s.mixture_check, s.mixture_step, s.mixture_drawn}) u64(v);
    const std::size_t n = s.dataset_documents.size();
    if (s.dataset_tokens.size() != n || s.weights.size() != n || s.taken.size() != n || s.epoch.size() != n || s.index.size() != n ||
        (s.mixed() && s.mixture_taken.size() != n))
        throw config_error("state", "per-dataset fields differ in length");
    u64(n);
    for (std::size_t i = 0; i < s.dataset_documents.size(); ++i) {
        u64(s.dataset_documents[i]);
        u64(s.dataset_tokens[i]);
        u64(std::bit_cast<std::uint64_t>(s.weights[i]));
        u64(s.taken[i]);
        u64(s.epoch[i]);
        u64(s.index[i]);
        if (s.mixed()) u64(s.mixture_taken[i]);
    }
    if (s.version == sampler_state::pending_version) {
        u64(s.pending_weights.size());
        for (const auto& p : s.pending_weights) {
            if (p.weights.size() != n) throw config_error("state", "weights set for a later step are not one per dataset");
            u64(p.step);
            for (double w : p.weights) u64(std::bit_cast<std::uint64_t>(w));
        }
    }
    return out;
}

// Throws format_error (file "sampler state", with the offset) on anything malformed.
inline sampler_state sampler_state_from_bytes(std::span<const std::byte> in) {
    std::size_t at = 0;
    auto fail = [&](const std::string& what) -> void { throw format_error("sampler state", at, what); };
    auto u64 = [&]() {
        if (in.size() - at < 8) fail("truncated");
        std::uint64_t v;
        std::memcpy(&v, in.data() + at, 8);
        at += 8;
        return v;
    };
    if (in.size() < 8 || std::memcmp(in.data(), "FLSAMPL1", 8) != 0) fail("wrong magic (expected FLSAMPL1)");
    at = 8;
    sampler_state s;
    std::uint64_t version = u64();
    if (version != sampler_state::current_version && version != sampler_state::rebased_version &&
        version != sampler_state::mixture_version && version != sampler_state::pending_version) {
        at -= 8;
        fail("unsupported version " + std::to_string(version));
    }
    s.version = static_cast<std::uint32_t>(version);
    s.seed = u64();
    s.seq_len = u64();
    s.global_batch = u64();
    s.mode = static_cast<std::uint32_t>(u64());
    s.shuffle = static_cast<std::uint32_t>(u64());
    s.shuffle_samples = static_cast<std::uint32_t>(u64());
    s.tail = static_cast<std::uint32_t>(u64());
    s.step = u64();
    if (s.rebased()) {
        s.origin_step = u64();
        s.origin_drawn = u64();
        s.origin_epoch = u64();
        s.origin_index = u64();
    }
    if (s.mixed()) {
        s.mixture = static_cast<std::uint32_t>(u64());
        s.mixture_check = u64();
        s.mixture_step = u64();
        s.mixture_drawn = u64();
    }
    std::uint64_t n = u64();
    if (n > (in.size() - at) / (s.mixed() ? 56 : 48)) fail("dataset count " + std::to_string(n) + " does not fit the remaining bytes");
    for (std::uint64_t i = 0; i < n; ++i) {
        s.dataset_documents.push_back(u64());
        s.dataset_tokens.push_back(u64());
        s.weights.push_back(std::bit_cast<double>(u64()));
        s.taken.push_back(u64());
        s.epoch.push_back(u64());
        s.index.push_back(u64());
        if (s.mixed()) s.mixture_taken.push_back(u64());
    }
    if (s.version == sampler_state::pending_version) {
        const std::uint64_t changes = u64();
        if (changes == 0) fail("a version-4 state without weights set for later steps");
        if (changes > (in.size() - at) / (8 * (n + 1)))
            fail("weight change count " + std::to_string(changes) + " does not fit the remaining bytes");
        for (std::uint64_t k = 0; k < changes; ++k) {
            mixture_weights_change& p = s.pending_weights.emplace_back();
            p.step = u64();
            for (std::uint64_t i = 0; i < n; ++i) p.weights.push_back(std::bit_cast<double>(u64()));
        }
    }
    if (at != in.size()) fail("trailing bytes");
    return s;
}

// A checksum of every field (FNV-1a, 64 bits, over the binary form), so an edit that keeps the counts'
// sum or the position's shape (one dataset's count raised, another's lowered) is still noticed. Not a
// defence against someone who recomputes it: against corruption and hand edits.
inline std::string state_check(const sampler_state& s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte b : to_bytes(s)) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return hex;
}

}  // namespace detail

#if FEEDLINE_HAS_JSON
inline std::string to_json(const sampler_state& s) {
    nlohmann::json j = {{"format", "feedline.sampler_state"},
                        {"version", s.version},
                        {"seed", s.seed},
                        {"seq_len", s.seq_len},
                        {"global_batch", s.global_batch},
                        {"mode", s.mode},
                        {"shuffle", s.shuffle},
                        {"shuffle_samples", s.shuffle_samples},
                        {"tail", s.tail},
                        {"step", s.step},
                        {"dataset_documents", s.dataset_documents},
                        {"dataset_tokens", s.dataset_tokens},
                        {"weights", s.weights},
                        {"taken", s.taken},
                        {"epoch", s.epoch},
                        {"index", s.index}};
    if (s.rebased()) {
        j["origin_step"] = s.origin_step;
        j["origin_drawn"] = s.origin_drawn;
        j["origin_epoch"] = s.origin_epoch;
        j["origin_index"] = s.origin_index;
    }
    if (s.mixed()) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(s.mixture_check));
        j["mixture"] = s.mixture;
        j["mixture_check"] = hex;  // a string: 64-bit numbers lose digits in some JSON readers
        j["mixture_step"] = s.mixture_step;
        j["mixture_drawn"] = s.mixture_drawn;
        j["mixture_taken"] = s.mixture_taken;
    }
    if (s.version == sampler_state::pending_version) {
        nlohmann::json changes = nlohmann::json::array();
        for (const auto& p : s.pending_weights) changes.push_back({{"step", p.step}, {"weights", p.weights}});
        j["pending_weights"] = std::move(changes);
    }
    j["check"] = detail::state_check(s);
    return j.dump();
}

inline sampler_state sampler_state_from_json(const std::string& text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    const json_fields f(j, "sampler state (JSON)");
    if (j.is_discarded() || json_format_of(j) != "feedline.sampler_state") f.fail("not a feedline sampler state");
    sampler_state s;
    s.version = f.u32("version");
    if (s.version != sampler_state::current_version && s.version != sampler_state::rebased_version &&
        s.version != sampler_state::mixture_version && s.version != sampler_state::pending_version)
        f.fail("unsupported version " + std::to_string(s.version));
    s.seed = f.u64("seed");
    s.seq_len = f.u64("seq_len");
    s.global_batch = f.u64("global_batch");
    s.mode = f.u32("mode");
    s.shuffle = f.u32("shuffle");
    s.shuffle_samples = f.u32("shuffle_samples");
    s.tail = f.u32("tail");
    s.step = f.u64("step");
    s.dataset_documents = f.u64s("dataset_documents");
    s.dataset_tokens = f.u64s("dataset_tokens");
    s.weights = f.numbers("weights");
    s.taken = f.u64s("taken");
    s.epoch = f.u64s("epoch");
    s.index = f.u64s("index");
    if (s.rebased()) {
        s.origin_step = f.u64("origin_step");
        s.origin_drawn = f.u64("origin_drawn");
        s.origin_epoch = f.u64("origin_epoch");
        s.origin_index = f.u64("origin_index");
    }
    if (s.mixed()) {
        s.mixture = f.u32("mixture");
        const auto& check = f.field("mixture_check");
        const std::string hex = check.is_string() ? check.get<std::string>() : std::string();
        if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
            f.fail("mixture_check is not 16 lowercase hexadecimal digits");
        s.mixture_check = std::strtoull(hex.c_str(), nullptr, 16);
        s.mixture_step = f.u64("mixture_step");
        s.mixture_drawn = f.u64("mixture_drawn");
        s.mixture_taken = f.u64s("mixture_taken");
    }
    if (s.version == sampler_state::pending_version) {
        const auto& changes = f.field("pending_weights");
        if (!changes.is_array() || changes.empty()) f.fail("pending_weights is not a non-empty list");
        for (const auto& c : changes) {
            const json_fields one(c, "sampler state (JSON), pending_weights");
            if (!c.is_object()) one.fail("not an object with a step and weights");
            s.pending_weights.push_back({one.u64("step"), one.numbers("weights")});
        }
    }
    const std::size_t n = s.dataset_documents.size();
    if (s.dataset_tokens.size() != n || s.weights.size() != n || s.taken.size() != n || s.epoch.size() != n || s.index.size() != n ||
        (s.mixed() && s.mixture_taken.size() != n))
        f.fail("per-dataset arrays differ in length");
    for (const auto& p : s.pending_weights)
        if (p.weights.size() != n) f.fail("pending_weights: weights for step " + std::to_string(p.step) + " are not one per dataset");
    // States saved before the check existed have none (all of version 1); one that has it must match
    // every field.
    if ((s.rebased() || s.mixed()) && !j.contains("check"))
        f.fail("a version-" + std::to_string(s.version) + " state without its check: it was edited (restore the checkpoint it came from)");
    if (j.contains("check")) {
        const auto& check = f.field("check");
        if (!check.is_string() || check.get<std::string>() != detail::state_check(s))
            f.fail("check does not match the state's fields: it was edited or corrupted (restore the checkpoint it came from)");
    }
    return s;
}
#endif

}  // namespace feedline
