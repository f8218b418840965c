// feedline/sampling/mixture_schedule.hpp: mixture weights as a function of the training step. Stages
// switch the weights at given steps; a stage may ramp, moving linearly from the weights before it to
// its own over its first steps. Each domain's target after n samples (the integral of its share over
// the first n samples, a sample taking the share of its step) is computed exactly, in integers, so
// the mixer (sampling/mixer.hpp) can keep every domain within one sample of it on any machine and
// any build: shares are whole multiples of 1/quantum summing to exactly 1 at every step, ramps
// included, and no floating point enters the targets. Fed by a mixture file
// (sampling/mixture_file.hpp) or the API; feeds the mixer, stats and feedline-inspect.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <feedline/detail/scratch_arena.hpp>
#include <feedline/error.hpp>

namespace feedline {

__extension__ typedef unsigned __int128 mixture_uint128;  // __extension__: -Wpedantic knows no __int128

// One stage as declared: from `at_step` on, `weights` (one per domain, any positive scale; 0 leaves a
// domain out of the stage). With ramp_steps > 0, the stage's first ramp_steps steps move linearly
// from the weights in force just before it to its own. `where` names the declaration in errors (a
// mixture file's "file:line", or empty from the API).
struct mixture_stage {
    std::uint64_t at_step = 0;
    std::vector<double> weights;
    std::uint64_t ramp_steps = 0;
    std::string where;
};

class mixture_schedule {
public:
    // Shares are whole multiples of 1/quantum (2^24: a domain's share is exact to 6e-8).
    static constexpr std::uint64_t quantum = std::uint64_t{1} << 24;
    // Limits that keep every target's numerator within 128 bits (see target()).
    static constexpr std::uint64_t max_samples = std::uint64_t{1} << 48;
    static constexpr std::uint64_t max_ramp_steps = std::uint64_t{1} << 40;
    // Stages x domains: each stage holds a weight per domain (a 10,000-domain mixture may have 1,600).
    static constexpr std::uint64_t max_stage_cells = std::uint64_t{1} << 24;

    // Throws config_error naming the field (and the stage's `where`) for: no domains, a duplicate or
    // empty domain name, no stages, a first stage not at step 0, steps that do not increase, a count
    // of weights that is not one per domain, a weight that is negative or not finite, a stage whose
    // weights are all 0, a weight too small beside the stage's largest to get a share, a ramp longer
    // than its stage.
    mixture_schedule(std::vector<std::string> domains, std::vector<mixture_stage> stages) : names_(std::move(domains)) {
        if (names_.empty()) throw config_error("domains", "a mixture needs at least one domain");
        if (names_.size() > std::numeric_limits<std::uint32_t>::max()) throw config_error("domains", "too many domains");
        // Views of names_, in an arena of their own: a copy of each name on the heap, freed here, left
        // holes between the domains opened next (detail/scratch_arena.hpp).
        detail::scratch_arena scratch;
        std::unordered_set<std::string_view, std::hash<std::string_view>, std::equal_to<std::string_view>,
                           detail::scratch_allocator<std::string_view>>
            seen;
        seen.reserve(names_.size());
        for (const auto& n : names_) {
            if (n.empty()) throw config_error("domains", "a domain without a name");
            if (!seen.insert(n).second) throw config_error("domains", "the domain name '" + n + "' appears twice");
        }
        if (stages.empty()) throw config_error("stages", "a mixture needs at least one stage");
        if (stages.size() > max_stage_cells / names_.size())
            throw config_error("stages", std::to_string(stages.size()) + " stages of " + std::to_string(names_.size()) +
                                             " domains: more than 2^24 weights in all");
        for (std::size_t k = 0; k < stages.size(); ++k) {
            const mixture_stage& st = stages[k];
            const std::string field = "stages[" + std::to_string(k) + "]";
            auto fail = [&](const std::string& sub, const std::string& why) {
                throw config_error(field + sub, (st.where.empty() ? "" : st.where + ": ") + why);
            };
            if (k == 0 && st.at_step != 0) fail(".at_step", "the first stage must start at step 0, not " + std::to_string(st.at_step));
            if (st.at_step >= max_samples)  // no run reaches it (a sample per step at least), and steps stay far from wrapping
                fail(".at_step", "step " + std::to_string(st.at_step) + " is past what a run can reach (2^48)");
            if (k > 0 && st.at_step <= stages[k - 1].at_step)
                fail(".at_step", "step " + std::to_string(st.at_step) + " does not come after the previous stage's step " +
                                     std::to_string(stages[k - 1].at_step) + " (stages go forward)");
            if (st.weights.size() != names_.size())
                fail(".weights", std::to_string(st.weights.size()) + " weights for " + std::to_string(names_.size()) + " domains");
            if (k == 0 && st.ramp_steps > 0) fail(".ramp_steps", "the first stage has no weights before it to ramp from");
            if (st.ramp_steps >= max_ramp_steps) fail(".ramp_steps", "a ramp of at most 2^40 steps");
            if (k + 1 < stages.size() && st.ramp_steps > stages[k + 1].at_step - st.at_step)
                fail(".ramp_steps", std::to_string(st.ramp_steps) + " steps run past the next stage, " +
                                        std::to_string(stages[k + 1].at_step - st.at_step) + " steps later");
            double largest = 0;
            for (std::size_t d = 0; d < st.weights.size(); ++d) {
                const double w = st.weights[d];
                if (!std::isfinite(w) || w < 0)
                    fail(".weights." + names_[d], "a weight must be a finite number, at least 0 (got " + std::to_string(w) + ")");
                largest = std::max(largest, w);
            }
            if (!(largest > 0)) fail(".weights", "every weight is 0: the stage would draw nothing");
            quotas_.push_back(to_quotas(st.weights, largest, [&](std::size_t d) {
                fail(".weights." + names_[d], "its share rounds to 0 beside the stage's largest weight; give it 0 to leave it out");
            }));
        }
        // Segments: each stage's ramp (if any), then its constant part.
        for (std::size_t k = 0; k < stages.size(); ++k) {
            const std::uint64_t end = k + 1 < stages.size() ? stages[k + 1].at_step : never;
            if (stages[k].ramp_steps > 0)
                segments_.push_back({stages[k].at_step, stages[k].at_step + stages[k].ramp_steps, static_cast<std::uint32_t>(k - 1),
                                     static_cast<std::uint32_t>(k)});
            const std::uint64_t from = stages[k].at_step + stages[k].ramp_steps;
            if (from < end) segments_.push_back({from, end, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k)});
        }
        for (auto& st : stages) declared_.push_back({st.at_step, st.ramp_steps, std::move(st.where)});
    }

    // The same schedule from `step` on, renumbered so that `step` is step 0: the stage in force there
    // first (its quotas exactly), then the later stages. For a run that goes on with a schedule from a
    // step (targets counted from there). Throws config_error when `step` falls inside a ramp (start
    // the new schedule at or after its ramps).
    mixture_schedule from_step(std::uint64_t step) const {
        if (step == 0) return *this;
        const std::size_t k = segment_index(step);
        if (segments_[k].from != segments_[k].to && step != segments_[k].begin)
            throw config_error("mixture", "step " + std::to_string(step) + " falls inside the ramp of steps " +
                                              std::to_string(segments_[k].begin) + " to " + std::to_string(segments_[k].end) +
                                              ": go on with the schedule at or after its ramps");
        mixture_schedule r;
        r.names_ = names_;
        std::vector<std::size_t> index(quotas_.size(), npos);
        auto take = [&](std::uint32_t q) {
            if (index[q] == npos) {
                index[q] = r.quotas_.size();
                r.quotas_.push_back(quotas_[q]);
            }
            return static_cast<std::uint32_t>(index[q]);
        };
        for (std::size_t j = k; j < segments_.size(); ++j) {
            segment g = segments_[j];
            g.begin = j == k ? 0 : g.begin - step;
            if (g.end != never) g.end -= step;
            g.from = take(g.from);
            g.to = take(g.to);
            // Declared stages: a ramp opens one; a constant segment opens one unless a ramp just did.
            if (g.from != g.to)
                r.declared_.push_back({g.begin, g.end - g.begin, ""});
            else if (r.segments_.empty() || r.segments_.back().from == r.segments_.back().to)
                r.declared_.push_back({g.begin, 0, ""});
            r.segments_.push_back(g);
        }
        return r;
    }

    // A 64-bit fingerprint of what decides the stream: the number of domains, each segment's steps and
    // each stage's quotas (not the names or where stages were declared). Saved in sampler states, so a
    // run restored with another schedule is noticed.
    std::uint64_t fingerprint() const noexcept {
        std::uint64_t h = 0xcbf29ce484222325ull;
        auto mix = [&](std::uint64_t v) {
            for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
        };
        mix(names_.size());
        mix(segments_.size());
        for (const segment& g : segments_) {
            mix(g.begin);
            mix(g.end);
            for (std::uint32_t q : quotas_[g.from]) mix(q);
            if (g.to != g.from)
                for (std::uint32_t q : quotas_[g.to]) mix(q);
        }
        return h;
    }

    std::size_t domains() const noexcept { return names_.size(); }
    const std::vector<std::string>& names() const noexcept { return names_; }
    std::size_t stages() const noexcept { return declared_.size(); }
    std::uint64_t stage_step(std::size_t k) const { return declared_.at(k).at_step; }
    std::uint64_t stage_ramp(std::size_t k) const { return declared_.at(k).ramp_steps; }
    // Stage k's own shares (what it ramps to), as numbers.
    std::vector<double> stage_shares(std::size_t k) const {
        const std::size_t j = segment_index(declared_.at(k).at_step + declared_.at(k).ramp_steps - (declared_.at(k).ramp_steps ? 1 : 0));
        const std::vector<std::uint32_t>& q = quotas_[segments_[j].to];
        std::vector<double> r(q.size());
        for (std::size_t d = 0; d < q.size(); ++d) r[d] = static_cast<double>(q[d]) / static_cast<double>(quantum);
        return r;
    }

    // Domain d's share at `step`, as a number (for stats and display; the mixer uses target()).
    double share(std::size_t d, std::uint64_t step) const {
        const segment& s = segment_at(step);
        const double a = static_cast<double>(quotas_[s.from][d]), b = static_cast<double>(quotas_[s.to][d]);
        if (s.from == s.to) return a / static_cast<double>(quantum);
        const double t = static_cast<double>(step - s.begin), L = static_cast<double>(s.end - s.begin);
        return (a * (L - t) + b * t) / L / static_cast<double>(quantum);
    }
    std::vector<double> shares(std::uint64_t step) const {
        std::vector<double> r(domains());
        for (std::size_t d = 0; d < r.size(); ++d) r[d] = share(d, step);
        return r;
    }

private:
    friend class mixture_targets;
    static constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();
    static constexpr std::size_t npos = ~std::size_t{0};
    mixture_schedule() = default;
    struct segment {
        std::uint64_t begin, end;  // steps [begin, end); end = never for the last
        std::uint32_t from, to;    // stage quotas at begin and (ramps) at end; equal: constant
    };
    std::size_t segment_index(std::uint64_t step) const {
        auto it = std::upper_bound(segments_.begin(), segments_.end(), step, [](std::uint64_t s, const segment& g) { return s < g.begin; });
        return static_cast<std::size_t>(it - segments_.begin()) - 1;
    }
    const segment& segment_at(std::uint64_t step) const { return segments_[segment_index(step)]; }
    struct declaration {
        std::uint64_t at_step, ramp_steps;
        std::string where;
    };

    // Weights as quotas summing to exactly `quantum`: each rounded down, the rest handed out one by
    // one by largest remainder (ties to the lower index). Deterministic: divisions and floors only.
    template <class TooSmall>
    static std::vector<std::uint32_t> to_quotas(const std::vector<double>& w, double largest, TooSmall&& too_small) {
        double total = 0;
        for (double x : w) total += x / largest;  // scaled by the largest first: no overflow
        std::vector<std::uint32_t> q(w.size());
        std::vector<double> rest(w.size());
        std::uint64_t given = 0;
        for (std::size_t d = 0; d < w.size(); ++d) {
            const double exact = w[d] / largest / total * static_cast<double>(quantum);
            const double whole = std::floor(exact);
            q[d] = static_cast<std::uint32_t>(whole);
            rest[d] = exact - whole;
            given += q[d];
        }
        std::vector<std::size_t> order(w.size());
        for (std::size_t d = 0; d < order.size(); ++d) order[d] = d;
        std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return rest[x] > rest[y]; });
        for (std::size_t i = 0; given < quantum; ++i, ++given) ++q[order[i % order.size()]];
        while (given > quantum) {  // rounding gave more than the whole (never seen; kept exact anyway)
            for (std::size_t i = order.size(); i-- > 0 && given > quantum;)
                if (q[order[i]] > 1) --q[order[i]], --given;
        }
        for (std::size_t d = 0; d < w.size(); ++d)
            if (w[d] > 0 && q[d] == 0) too_small(d);
        return q;
    }

    std::vector<std::string> names_;
    std::vector<std::vector<std::uint32_t>> quotas_;  // per stage, per domain; each sums to quantum
    std::vector<segment> segments_;
    std::vector<declaration> declared_;
};

// A schedule's exact targets for one global batch (samples per step). Holds each domain's target at
// each segment's start after the first: (segments - 1) x domains x 16 bytes, built once.
class mixture_targets {
public:
    static constexpr std::uint64_t quantum = mixture_schedule::quantum, max_samples = mixture_schedule::max_samples;
    mixture_targets(std::shared_ptr<const mixture_schedule> schedule, std::uint64_t global_batch)
            : S_(std::move(schedule)), B_(global_batch) {
        if (B_ == 0 || B_ >= max_samples) throw config_error("global_batch", "must be at least 1 and below 2^48");
        const std::size_t D = S_->domains(), K = S_->segments_.size();
        // Domain d's target at the start of segment k, in 1 / (2 quantum): a constant segment of L
        // steps adds 2 B L a; a ramp adds B (a (L + 1) + b (L - 1)) (the sum of its steps' shares).
        // The first segment's are all 0 and not kept (prefix()): a one-stage mixture keeps none.
        prefix_.assign((K - 1) * D, 0);
        const mixture_uint128 B = B_;
        for (std::size_t j = 1; j < K; ++j) {
            const auto& s = S_->segments_[j - 1];
            const mixture_uint128 L = s.end - s.begin;
            for (std::size_t x = 0; x < D; ++x) {
                const mixture_uint128 a = S_->quotas_[s.from][x], b = S_->quotas_[s.to][x];
                const mixture_uint128 add = s.from == s.to ? 2 * B * L * a : B * (a * (L + 1) + b * (L - 1));
                prefix_[(j - 1) * D + x] = (j > 1 ? prefix_[(j - 2) * D + x] : 0) + add;
            }
        }
    }

    const mixture_schedule& schedule() const noexcept { return *S_; }
    std::uint64_t global_batch() const noexcept { return B_; }

    // Domain d's target after the first n samples: the sum of its share over those samples, exactly,
    // as num / den. Sample i has the share of step i / global_batch; in a ramp of L steps from quotas a to b, step begin + t has (a (L - t) + b t)
    // / (quantum L). Throws config_error past max_samples.
    struct fraction {
        mixture_uint128 num = 0, den = 1;
    };
    fraction target(std::size_t d, std::uint64_t n) const {
        check_samples(n);
        const std::uint64_t step = n / B_, r = n % B_;
        const std::size_t k = S_->segment_index(step);
        const mixture_schedule::segment& s = S_->segments_[k];
        const mixture_uint128 P = prefix(d, k);  // in 1 / (2 quantum)
        const mixture_uint128 t = step - s.begin, B = B_, a = S_->quotas_[s.from][d];
        if (s.from == s.to) return {P + 2 * (t * B + r) * a, 2 * mixture_uint128{quantum}};
        // In 1 / (2 quantum L): bounded by 2^116 for n < 2^48 samples and L < 2^40 steps.
        const mixture_uint128 L = s.end - s.begin, b = S_->quotas_[s.to][d];
        const mixture_uint128 tri = t * (t - (t > 0 ? 1 : 0)) / 2;  // t (t - 1) / 2
        const mixture_uint128 whole = B * (a * (t * L - tri) + b * tri), part = mixture_uint128{r} * (a * (L - t) + b * t);
        return {P * L + 2 * (whole + part), 2 * mixture_uint128{quantum} * L};
    }
    // The target as a number (display, inspect's expected counts).
    double expected(std::size_t d, std::uint64_t n) const {
        const fraction f = target(d, n);
        return static_cast<double>(f.num / f.den) + static_cast<double>(f.num % f.den) / static_cast<double>(f.den);
    }

    // The first n >= from at which domain d's target reaches x (strictly: passes it), or nothing if it
    // never does (before max_samples). Targets never decrease, so: when `from` is in a segment before
    // the last, first the estimate there (below); then `from` itself, or a binary search over the
    // segments from the one holding `from`, then within one: closed form in the last segment, the
    // estimate and a search over its samples otherwise. The mixer asks from the current sample: the
    // segments before it are skipped, and in the last one (most of a run) that leaves one target and
    // the closed form, where a search from 0 took a target per segment halved, each in another
    // segment's cache lines.
    //
    // In a segment before the last, the search starts from an estimate (the share's integral solved
    // in floating point), which is mostly right or a sample off: checked with two targets (it
    // reaches, the sample before does not), where bisecting the segment took ~20 (a mixer's draw in a
    // stage before the last cost 300 ns at 10,000 domains, 45 in the last). Only the estimate is
    // inexact; the answer is always the search's.
    std::optional<std::uint64_t> first_reaching(std::size_t d, std::uint64_t x, bool strictly, std::uint64_t from = 0) const {
        auto reached = [&](std::uint64_t n) {
            const fraction f = target(d, n);
            const mixture_uint128 want = mixture_uint128{x} * f.den;
            return strictly ? f.num > want : f.num >= want;
        };
        if (from >= max_samples) return std::nullopt;
        // Mostly the answer is in from's own segment, near the estimate: no search over the segments.
        if (const std::size_t k = S_->segment_index(from / B_); k + 1 < S_->segments_.size()) {
            const std::uint64_t end = samples_at(S_->segments_[k].end);
            const std::uint64_t guess = std::clamp(estimate_reaching(d, x, k), from, end);
            if (reached(guess)) return guess == from || !reached(guess - 1) ? guess : first_below(from, guess - 1, reached);
            if (guess == end)
                from = end + 1;  // past this segment: the search below, from the next
            else if (reached(guess + 1))
                return guess + 1;
            else
                from = guess + 2;  // neither reaches: nor does anything before (targets never decrease)
            if (from >= max_samples) return std::nullopt;
        }
        if (reached(from)) return from;
        // The first segment whose end reaches x: none before from's, whose ends are at most from.
        std::size_t lo = S_->segment_index(from / B_), hi = S_->segments_.size() - 1;
        while (lo < hi) {
            const std::size_t mid = (lo + hi) / 2;
            if (reached(samples_at(S_->segments_[mid].end)))
                hi = mid;
            else
                lo = mid + 1;
        }
        const mixture_schedule::segment& s = S_->segments_[lo];
        const std::uint64_t first = samples_at(s.begin);
        if (s.end == mixture_schedule::never) {  // the last segment is constant: closed form, or never
            const mixture_uint128 a = S_->quotas_[s.from][d];
            if (a == 0) return std::nullopt;
            const mixture_uint128 P = prefix(d, lo), goal = 2 * mixture_uint128{quantum} * x;
            // P + 2 m a >= goal (or > goal): m = ceil((goal - P) / 2a), or floor(...) + 1.
            const mixture_uint128 gap = goal > P ? goal - P : 0;
            mixture_uint128 m = strictly ? gap / (2 * a) + 1 : (gap + 2 * a - 1) / (2 * a);
            if (!strictly && goal <= P) m = 0;
            const mixture_uint128 n = mixture_uint128{first} + m;
            if (n >= max_samples) return std::nullopt;  // beyond any run this schedule can serve
            return static_cast<std::uint64_t>(n);
        }
        std::uint64_t a = std::max(first, from + 1), b = samples_at(s.end);  // reached(b) holds, reached(from) not
        if (a > b) return std::nullopt;                                      // from at the last sample a schedule can serve
        // From the estimate, up to a sample that reaches (galloping), then down to the first.
        const std::uint64_t guess = std::clamp(estimate_reaching(d, x, lo), a, b);
        if (reached(guess)) return first_below(a, guess, reached);
        a = guess + 1;
        for (std::uint64_t step = 1;; step *= 2) {
            const std::uint64_t probe = b - a >= step ? a + step - 1 : b;
            if (reached(probe)) return first_below(a, probe, reached);
            a = probe + 1;
        }
    }

    // Where the mixer steps a domain's deadlines without targets (a constant segment: each sample adds
    // the same quota): the segment holding sample n, whether its shares are constant, the samples its
    // line runs over ([first, end], the target at `end` is still on it) and domain d's quota in it.
    std::size_t segments() const noexcept { return S_->segments_.size(); }
    std::size_t segment_of(std::uint64_t n) const { return S_->segment_index(n / B_); }
    bool constant(std::size_t k) const noexcept { return S_->segments_[k].from == S_->segments_[k].to; }
    std::uint64_t first_sample(std::size_t k) const { return samples_at(S_->segments_[k].begin); }
    std::uint64_t end_sample(std::size_t k) const { return samples_at(S_->segments_[k].end); }
    std::uint32_t quota(std::size_t k, std::size_t d) const { return S_->quotas_[S_->segments_[k].from][d]; }

private:
    // The first n in [lo, hi] that reaches, given that hi does: galloping down from hi (the answer is
    // mostly a few samples below it), then bisecting the bracket that leaves.
    template <class Reached>
    static std::uint64_t first_below(std::uint64_t lo, std::uint64_t hi, Reached&& reached) {
        for (std::uint64_t step = 1; hi - lo >= step; step *= 2) {
            if (!reached(hi - step)) {
                lo = hi - step + 1;
                break;
            }
            hi -= step;
        }
        while (lo < hi) {
            const std::uint64_t mid = lo + (hi - lo) / 2;
            if (reached(mid))
                hi = mid;
            else
                lo = mid + 1;
        }
        return lo;
    }

    // About where domain d's target reaches x in segment k, in floating point. In units of 1 / (2
    // quantum), the target t whole steps into a segment of L steps ramping from quota a to b is
    // P + 2 B a t + (B / L) (b - a) (t^2 - t) (target()'s sum; constant segments have b = a): solved
    // for t (in the form that keeps its precision when b - a is small), then the samples into that
    // step at its share. Exact but for rounding: a continuous ramp instead of one share per step put
    // it a hundred samples off for domains of small shares. A hint for first_reaching's search only.
    std::uint64_t estimate_reaching(std::size_t d, std::uint64_t x, std::size_t k) const {
        const mixture_schedule::segment& s = S_->segments_[k];
        const std::uint64_t first = samples_at(s.begin);
        const mixture_uint128 goal = 2 * mixture_uint128{quantum} * x, P = prefix(d, k);
        if (goal <= P) return first;
        const double gap = static_cast<double>(goal - P), a = S_->quotas_[s.from][d], b = S_->quotas_[s.to][d];
        const double B = static_cast<double>(B_), L = s.from == s.to ? 1.0 : static_cast<double>(s.end - s.begin);
        const double c2 = B * (b - a) / L, c1 = 2 * B * a - c2;
        const double denominator = c1 + std::sqrt(std::max(0.0, c1 * c1 + 4 * c2 * gap));
        if (!(denominator > 0)) return first;
        const double t = std::floor(2 * gap / denominator);
        if (!(t < static_cast<double>(max_samples) / B)) return max_samples;
        const double before = 2 * B * a * t + c2 * (t * t - t),
                     per_sample = 2 * (a + (b - a) * t / L);  // not a (L - t) + b t: that cancels once a t passes 2^53
        const double r = per_sample > 0 ? std::clamp(std::ceil((gap - before) / per_sample), 0.0, B) : B;
        return first + static_cast<std::uint64_t>(t) * B_ + static_cast<std::uint64_t>(r);
    }

    static void check_samples(std::uint64_t n) {
        if (n >= mixture_schedule::max_samples)
            throw config_error("mixture", "more than 2^48 samples: beyond what the schedule's exact targets hold");
    }
    std::uint64_t samples_at(std::uint64_t step) const {
        if (step == mixture_schedule::never || step > (mixture_schedule::max_samples - 1) / B_) return mixture_schedule::max_samples - 1;
        return step * B_;
    }

    mixture_uint128 prefix(std::size_t d, std::size_t k) const { return k == 0 ? 0 : prefix_[(k - 1) * S_->domains() + d]; }

    std::shared_ptr<const mixture_schedule> S_;
    std::uint64_t B_;
    std::vector<mixture_uint128> prefix_;
};

}  // namespace feedline
