// feedline/pipeline/text_state.hpp: where a text pipeline is, and its JSON form for checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include <feedline/detail/json_fields.hpp>
#include <feedline/error.hpp>

namespace feedline {

// Where a text pipeline is: the next step, and the next token (document number in this rank's order,
// offset in its tokens). The other fields say what the position means; restore() checks them.
struct text_state {
    std::uint64_t seed = 0, seq_len = 0, batch_size = 0, world_size = 1, rank = 0, packed = 0;
    std::uint64_t step = 0, document = 0, offset = 0;
    friend bool operator==(const text_state&, const text_state&) = default;
};

#if FEEDLINE_HAS_JSON
inline std::string to_json(const text_state& s) {
    const nlohmann::json j = {{"format", "feedline.text_state"}, {"version", 1},          {"seed", s.seed},         {"seq_len", s.seq_len},
                              {"batch_size", s.batch_size},      {"world_size", s.world_size}, {"rank", s.rank}, {"packed", s.packed}, {"step", s.step},
                              {"document", s.document},          {"offset", s.offset}};
    return j.dump();
}

// Throws format_error naming the field for anything but a version 1 text state (a negative, float
// or quoted number included: a hand-edited position must not wrap around or be cast).
inline text_state text_state_from_json(const std::string& text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    const detail::json_fields f(j, "text state (JSON)");
    if (j.is_discarded() || detail::json_format_of(j) != "feedline.text_state") f.fail("not a feedline text pipeline state");
    if (const auto version = f.u32("version"); version != 1) f.fail("unsupported version " + std::to_string(version));
    return {.seed = f.u64("seed"),
            .seq_len = f.u64("seq_len"),
            .batch_size = f.u64("batch_size"),
            .world_size = f.u64("world_size"),
            .rank = f.u64("rank"),
            .packed = f.whole(f.field("packed"), "packed", 1),
            .step = f.u64("step"),
            .document = f.u64("document"),
            .offset = f.u64("offset")};
}
#endif

}  // namespace feedline
