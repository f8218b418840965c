// feedline/pipeline/state.hpp: where a pipeline is, for checkpoints. Every source is sampled by the
// same sampler, so a pipeline's state is the sampler's (sampling/sampler.hpp: the step and, per
// dataset, the samples drawn and the next sample's epoch and index, plus what they are valid with);
// it restores exactly, mid-document and mid-blend included, with any worker count. JSON here; the
// binary form is sampling/state_io.hpp.
#pragma once

#include <string>

#include <feedline/error.hpp>
#include <feedline/sampling/state_io.hpp>

namespace feedline {

using pipeline_state = sampler_state;

#if FEEDLINE_HAS_JSON
// Throws format_error for anything that is not a sampler state, and config_error for a state written
// by a text pipeline before text was sampled like shards ("feedline.text_state" version 1): it counts
// documents in another order, so no position in it means the same batch today.
inline pipeline_state pipeline_state_from_json(const std::string& text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (json_format_of(j) == "feedline.text_state") {
        const auto version = j.contains("version") ? j["version"].dump() : std::string("?");
        throw config_error("state",
                           "a feedline.text_state version " + version +
                               " (saved by the text pipeline of feedline 0.1, before text was sampled like shards) cannot be restored: "
                               "its document order differs; start the text run afresh or resume it with the release that saved it");
    }
    return sampler_state_from_json(text);
}
#endif

}  // namespace feedline
