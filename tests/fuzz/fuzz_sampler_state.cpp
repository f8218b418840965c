// Fuzz target: a sampler state (JSON, the saved form, also read as a text pipeline's state; or the
// internal binary form its check is computed over) must parse or throw format_error, and a parsed
// position restored into a sampler must either be refused with config_error or plan batches whose
// every segment lies inside its document: a corrupt checkpoint never reads out of bounds.
// Input: byte 0 picks the sampler (low bits) and the encoding (0x80: JSON); the rest is the file.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <feedline/pipeline/state.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/sampling/state_io.hpp>

#include "fuzz_sampler_configs.hpp"

using namespace feedline;

namespace {

// Every segment of every sample must lie inside a document of its dataset.
void check_plan(const batch_plan& plan, unsigned which) {
    for (const sample_plan& s : plan.samples)
        for (const segment& g : s.segments) {
            const fuzzing::lengths& d = fuzzing::dataset(which, s.dataset);
            if (g.document >= d.document_count() || g.offset > d.document_length(g.document) ||
                g.length > d.document_length(g.document) - g.offset)
                __builtin_trap();
        }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const unsigned which = data[0] % fuzzing::sampler_kinds;
    const bool json = (data[0] & 0x80) != 0;
    std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data + 1), size - 1);
    sampler_state s;
    try {
        if (json) {
#if FEEDLINE_HAS_JSON
            const std::string text(reinterpret_cast<const char*>(file.data()), file.size());
            try {  // a checkpoint's pipeline state: a sampler state, or an old text state refused by name
                s = pipeline_state_from_json(text);
            } catch (const config_error& e) {
                if (e.field() != "state") __builtin_trap();
                return 0;
            }
#else
            return 0;
#endif
        } else {
            s = detail::sampler_state_from_bytes(file);
        }
    } catch (const format_error&) {
        return 0;
    }
    // What parses writes back to the same state (bit-exact in binary; in JSON when the weights are
    // numbers JSON can hold).
    try {
        if (detail::to_bytes(detail::sampler_state_from_bytes(detail::to_bytes(s))) != detail::to_bytes(s)) __builtin_trap();
#if FEEDLINE_HAS_JSON
        bool finite = true;
        for (double w : s.weights) finite = finite && std::isfinite(w);
        for (const auto& p : s.pending_weights)
            for (double w : p.weights) finite = finite && std::isfinite(w);
        if (finite && detail::to_bytes(sampler_state_from_json(to_json(s))) != detail::to_bytes(s)) __builtin_trap();
#endif
    } catch (const config_error&) {
        return 0;  // per-dataset fields of different lengths: detail::to_bytes refuses to write them
    }

    // The position fields (step, taken, epoch, index, a version-2 state's origin, a version-3 state's mixture fields) come from the input; the identity fields from
    // the sampler, so restore() gets past them and judges the position itself.
    auto sampler = fuzzing::make_sampler(which);
    sampler_state want = sampler->state();
    want.step = s.step;
    for (std::size_t i = 0; i < want.taken.size(); ++i) {
        if (i < s.taken.size()) want.taken[i] = s.taken[i];
        if (i < s.epoch.size()) want.epoch[i] = s.epoch[i] % 4096;  // an epoch layout costs O(documents) each
        if (i < s.index.size()) want.index[i] = s.index[i];
    }
    if (s.rebased()) {  // a run that went on with another global batch (this sampler's) from the input's origin
        want.version = s.version;
        want.origin_step = s.origin_step;
        want.origin_drawn = s.origin_drawn;
        want.origin_epoch = s.origin_epoch % 4096;
        want.origin_index = s.origin_index;
    }
    if (s.mixed() && want.mixed()) {  // the mixture: where its targets count from, from the input (the check too, or this
                                      // schedule's, so the rest of the validation is reached)
        want.mixture = s.mixture;
        want.mixture_check = s.mixture_check % 2 == 0 ? want.mixture_check : s.mixture_check;
        want.mixture_step = s.mixture_step;
        want.mixture_drawn = s.mixture_drawn;
        if (s.weights.size() == want.weights.size()) want.weights = s.weights;
        for (std::size_t i = 0; i < want.mixture_taken.size() && i < s.mixture_taken.size(); ++i)
            want.mixture_taken[i] = s.mixture_taken[i];
        want.version = s.version;  // a version-4 state's weights set for later steps, too
        want.pending_weights = s.pending_weights;
    }
    try {
        sampler->restore(want);
        batch_plan plan;
        for (int step = 0; step < 3; ++step) {
            sampler->next(plan);
            check_plan(plan, which);
        }
    } catch (const config_error&) {
    }
    return 0;
}
