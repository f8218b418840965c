// feedline/sampling/mixer.hpp: which domain each sample of a mixture comes from, so that after any n
// samples every domain's count is within one sample of its target (the integral of its scheduled
// share over the first n samples; sampling/mixture_schedule.hpp), whatever the schedule: stages,
// ramps, zero weights, domains that start mid-run.
//
// How: earliest deadline first over unit jobs. Domain d's k-th sample may be drawn at slot n (the
// n-th sample, from 0) once its target after n + 1 samples passes k - 1, and must be drawn by the slot
// where that target reaches k. Each slot draws, among the domains whose next sample may be drawn, the
// one with the earliest deadline (ties: the lower domain). Shares sum to exactly 1 at every step, so
// in any run of slots the samples whose windows lie inside it number at most its length; on one
// machine with unit jobs EDF then meets every deadline and some domain is always ready. Both bounds
// hold strictly: target - 1 < count < target + 1 (tests/unit/test_mixture.cpp checks it sample by
// sample over random schedules). Megatron's largest-deficit rule gives the same bound for fixed weights
// only.
//
// The state is the number of samples drawn and each domain's count: the next sample depends on
// nothing else, so a mixer rebuilt from them goes on with the same stream (resume), and the stream
// does not depend on ranks (elastic). O(domains) memory; per sample a few list operations (a heap's
// O(log domains) only for jobs a wheel or more away) and the next window: a step from the last one
// where shares are constant (schedule_next), a search from an estimate in a ramp.
//
// The waiting jobs sit on a timing wheel: one list per slot for the next slots (about two per domain),
// and a heap only for those further off. A job waits for a slot near the current one (a domain's next
// sample is about 1 / share slots away), so at 10,000 domains each sample costs a list push and a
// list walk instead of a heap's pop and push over cold levels. The ready jobs sit on a second wheel,
// by deadline: the earliest deadline is the first marked slot from a lower bound of them (a bit per
// slot), where a heap of all 10,000 ready jobs took seven levels of cold cache lines per pop (half the
// draw's time under perf). A slot's list is sorted by domain when its deadline comes first (sort_due).
// Deadlines further off go to a heap. Which jobs are released at a slot does not depend on the order
// they were filed in, and both keep the order (deadline, domain), so the stream is the same as with
// one heap for each.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <feedline/detail/prefetch.hpp>
#include <feedline/detail/quaternary_heap.hpp>
#include <feedline/error.hpp>
#include <feedline/sampling/mixture_schedule.hpp>

namespace feedline {

class mixer {
public:
    // From the start, or from a state: `drawn` samples so far and each domain's count of them. Throws
    // config_error for counts that are not one per domain or do not add up to `drawn`, or that lie
    // outside the bound (not a state this schedule and batch produce).
    mixer(std::shared_ptr<const mixture_schedule> schedule, std::uint64_t global_batch, std::uint64_t drawn = 0,
          std::vector<std::uint64_t> taken = {})
            : targets_(std::move(schedule), global_batch), drawn_(drawn) {
        const std::size_t D = targets_.schedule().domains();
        if (taken.empty() && drawn_ == 0) taken.assign(D, 0);
        if (drawn_ >= mixture_schedule::max_samples)
            throw config_error("mixture.drawn", std::to_string(drawn_) + " samples: past what a schedule's targets hold (2^48)");
        if (taken.size() != D)
            throw config_error("mixture.taken", std::to_string(taken.size()) + " counts for " + std::to_string(D) + " domains");
        std::uint64_t sum = 0;
        for (std::uint64_t t : taken) {
            if (t > drawn_) throw config_error("mixture.taken", "a domain's count is more than the samples drawn");
            sum += t;  // each at most drawn (< 2^48 for targets to be asked): no wrap before the check below
            if (sum > drawn_) break;
        }
        if (sum != drawn_)
            throw config_error("mixture.taken", "the domains' counts add up to " + std::to_string(sum) + ", not the " +
                                                    std::to_string(drawn_) + " samples drawn");
        domains_.resize(D);
        for (std::size_t k = 0; k < targets_.segments(); ++k) line_end_.push_back(targets_.constant(k) ? targets_.end_sample(k) : 0);
        for (std::size_t d = 0; d < D; ++d) domains_[d] = {taken[d], none, no_domain, no_excess, 0, 0};
        // A wheel of at least two slots per domain: equal shares wait D slots, and the few jobs further
        // off go to the heap (it grows only as far as they need).
        slots_.assign(std::clamp<std::size_t>(std::bit_ceil(2 * D), 64, max_wheel_slots), {no_domain, no_domain});
        due_bits_.assign(slots_.size() / 64, 0);
        due_unsorted_.assign(slots_.size() / 64, 0);
        due_drawn_.assign(slots_.size() / 64, 0);
        for (std::uint32_t d = 0; d < D; ++d) {
            if (!within_bound(d))
                throw config_error("mixture.taken", "domain '" + targets_.schedule().names()[d] + "' has " +
                                                        std::to_string(domains_[d].taken) + " samples after " + std::to_string(drawn_) +
                                                        ", more than one from its target: not a state of this schedule");
            schedule_next(d);
        }
    }

    // The domain of sample drawn(); advances past it. Throws std::bad_alloc (a heap or sort_due's scratch grows) or
    // std::logic_error (no domain may draw: past 2^48 samples); after a throw, rebuild the mixer from
    // drawn() and taken(), which change only once the sample is drawn.
    std::uint32_t next() {
        // A deadline the slot just passed could be on the due wheel only from a state this schedule
        // does not reach drawing in order (an edited one: the constructor checks the bound, not that
        // every deadline can still be met). Its jobs go to ready_, where they sort first, as in one heap.
        if (const std::size_t past = (drawn_ - 1) & (slots_.size() - 1); drawn_ > 0 && (due_bits_[past / 64] >> past % 64 & 1)) {
            for (std::uint32_t d = std::exchange(slots_[past].due, no_domain); d != no_domain;) {
                const std::uint32_t after = domains_[d].next_waiting;
                ready_.make_room_for_one();
                ready_.push({deadline_of(d), d});
                d = after;
            }
            clear_due(past);
            if (finger& f = fingers_[past % fingers_.size()]; f.slot == drawn_ - 1) f.domain = no_domain;
        }
        // This slot's list (every job on it waits for this slot: one filed for slot k + wheel size
        // went on the list only after slot k's walk), then the far jobs whose slot came.
        std::uint32_t& head = slots_[drawn_ & (slots_.size() - 1)].waiting;
        for (std::uint32_t d = std::exchange(head, no_domain); d != no_domain;) {
            const std::uint32_t after = domains_[d].next_waiting;  // make_ready files d on another list
            make_ready(d);
            d = after;
        }
        while (!far_.empty() && far_.top().key <= drawn_) {
            const std::uint32_t d = far_.top().id;
            far_.pop();
            make_ready(d);
        }
        // The earliest deadline: the first marked slot of the due wheel from this one, or ready_'s top
        // if that is earlier (ties: the lower domain).
        std::uint32_t d = no_domain;
        const std::size_t slot = first_due();
        if (slot != no_slot) {
            if (const std::uint64_t bit = std::uint64_t{1} << slot % 64; !(due_drawn_[slot / 64] & bit)) {
                if (due_unsorted_[slot / 64] & bit) {
                    sort_due(slot);  // the finger: the list's last
                } else if (finger& f = fingers_[slot % fingers_.size()]; f.slot == due_low_) {
                    f.domain = no_domain;  // it may name a domain of an earlier list at this deadline, drained since
                }
                due_drawn_[slot / 64] |= bit;
            }
            d = slots_[slot].due;
        }
        if (!ready_.empty() &&
            (d == no_domain || ready_.top().key < deadline_of(d) || (ready_.top().key == deadline_of(d) && ready_.top().id < d))) {
            d = ready_.top().id;
            ready_.pop();
        } else if (d != no_domain) {
            if ((slots_[slot].due = domains_[d].next_waiting) == no_domain) {
                clear_due(slot);
            }
            if (finger& f = fingers_[slot % fingers_.size()]; f.domain == d) f.domain = no_domain;  // off the list now
        } else {  // impossible while shares sum to 1 (see above); kept as an error, not UB
            throw std::logic_error("mixer: no domain may draw sample " + std::to_string(drawn_));
        }
        far_.make_room_for_one();  // the push schedule_next may make
        ++domains_[d].taken;
        ++drawn_;
        schedule_next(d);
        prefetch_ahead();
        return d;
    }

    std::uint64_t drawn() const noexcept { return drawn_; }
    std::uint64_t taken(std::uint32_t d) const noexcept { return domains_[d].taken; }
    std::vector<std::uint64_t> taken() const {
        std::vector<std::uint64_t> r(domains_.size());
        for (std::size_t d = 0; d < r.size(); ++d) r[d] = domains_[d].taken;
        return r;
    }
    const mixture_targets& targets() const noexcept { return targets_; }

    // Whether domain d's count is within one sample of its target now: |taken - target| < 1.
    bool within_bound(std::uint32_t d) const {
        const auto f = targets_.target(d, drawn_);
        const mixture_uint128 c = mixture_uint128{domains_[d].taken} * f.den;
        return c < f.num + f.den && f.num < c + f.den;
    }

private:
    static constexpr std::uint64_t none = ~std::uint64_t{0};
    // Domain d's pending sample must be drawn by this slot (none: never must).
    std::uint64_t deadline_of(std::uint32_t d) const noexcept {
        const std::uint64_t reached = domains_[d].reached;
        return reached == none ? none : reached - 1;
    }

    // Domain d's pending sample may be drawn from now on: onto the due wheel at its deadline's slot
    // (in domain order once that list has been drawn from) if that is less than a wheel ahead, else into ready_. No
    // deadline is before the current slot: EDF meets them all. Inlined, as schedule_next's line: at
    // 10,000 domains the two calls were a tenth of a draw's time (a mixer-alone loop, 47 to 42 ns).
    [[gnu::always_inline]] void make_ready(std::uint32_t d) {
        const std::uint64_t deadline = deadline_of(d);
        if (deadline < drawn_ || deadline - drawn_ >= slots_.size()) {  // none (never due) too
            ready_.make_room_for_one();
            ready_.push({deadline, d});
            return;
        }
        const std::size_t slot = deadline & (slots_.size() - 1);
        const std::uint64_t bit = std::uint64_t{1} << slot % 64;
        due_bits_[slot / 64] |= bit;
        due_low_ = std::min(due_low_, deadline);
        if (!(due_drawn_[slot / 64] & bit)) {  // not drawn from yet: onto the head, sorted when it comes first if need be
            std::uint32_t& head = slots_[slot].due;
            if (head < d) due_unsorted_[slot / 64] |= bit;  // no_domain (an empty list) is above every domain
            domains_[d].next_waiting = head;
            head = d;
            return;
        }
        // The list being drawn from: in order. Jobs that come to it in rising order (far_'s releases,
        // domains of one share drawn one after another) go on from the last one filed, not the head.
        std::uint32_t* at = &slots_[slot].due;
        finger& f = fingers_[slot % fingers_.size()];
        if (f.slot == deadline && f.domain != no_domain && f.domain < d) at = &domains_[f.domain].next_waiting;
        while (*at != no_domain && *at < d) at = &domains_[*at].next_waiting;
        domains_[d].next_waiting = *at;
        *at = d;
        if (f.slot != deadline || f.domain == no_domain || f.domain < d) f = {deadline, d};  // the list's last filed
    }
    // The due slot's list is gone (drawn, or moved to ready_).
    void clear_due(std::size_t slot) noexcept {
        const std::uint64_t keep = ~(std::uint64_t{1} << slot % 64);
        due_bits_[slot / 64] &= keep;
        due_unsorted_[slot / 64] &= keep;
        due_drawn_[slot / 64] &= keep;
    }
    // The due list at `slot` in domain order, once, when its deadline comes first: each job is sorted
    // once, where filing each in order cost a walk past the others. Many domains can share a deadline
    // (those of one share, which keep the same deadlines, and others wherever their targets meet a
    // whole number together): at 10,000 domains of 100 distinct weights the walks averaged 35 records
    // a draw, and lists held over a thousand.
    void sort_due(std::size_t slot) {
        auto& v = sort_scratch_;
        v.clear();
        for (std::uint32_t d = slots_[slot].due; d != no_domain; d = domains_[d].next_waiting) v.push_back(d);
        std::sort(v.begin(), v.end());
        for (std::size_t i = 0; i + 1 < v.size(); ++i) domains_[v[i]].next_waiting = v[i + 1];
        domains_[v.back()].next_waiting = no_domain;
        slots_[slot].due = v.front();
        due_unsorted_[slot / 64] &= ~(std::uint64_t{1} << slot % 64);
        // The finger: the last of the list, for later jobs of this deadline that come in rising order.
        fingers_[slot % fingers_.size()] = {drawn_ + ((slot - drawn_) & (slots_.size() - 1)), v.back()};
    }
    // At 10,000 domains a draw's time went to three cache misses, each on the path of the next: the
    // record of the domain waking at the slot, the due list its deadline files it on, and the record
    // of the domain drawn. Each is requested here, from what is known one or two draws before (a
    // miss that turns out wasted, a job filed meanwhile before the one requested, costs nothing).
    void prefetch_ahead() noexcept {
        const std::size_t mask = slots_.size() - 1;
        if (const std::uint32_t w = slots_[(drawn_ + 1) & mask].waiting; w != no_domain) detail::prefetch(&domains_[w]);
        if (const std::uint32_t w = slots_[drawn_ & mask].waiting; w != no_domain) {
            const std::uint64_t deadline = deadline_of(w);  // its record: requested a draw ago
            if (deadline - drawn_ < slots_.size()) detail::prefetch(&slots_[deadline & (slots_.size() - 1)].due);
        }
        if (const std::size_t slot = first_due(); slot != no_slot) detail::prefetch(&domains_[slots_[slot].due]);
    }
    // The due wheel's first slot holding a list, from the current slot on (no_slot: none). Its jobs'
    // deadline is that slot: every deadline filed there is at least the current slot and less than a
    // wheel ahead. The scan starts at due_low_, no later than any deadline on the wheel: the earliest
    // is mostly thousands of slots ahead (a domain's deadline trails its ideal slot by 1 / share), and
    // walking the marks there from the current slot at every draw took half of next()'s time.
    std::size_t first_due() noexcept {
        const std::size_t mask = slots_.size() - 1, words = due_bits_.size(), from = std::max(due_low_, drawn_) & mask;
        std::size_t w = from / 64;
        std::uint64_t bits = due_bits_[w] & (~std::uint64_t{0} << from % 64);
        for (std::size_t i = 0; i <= words; ++i) {  // the last word again: its bits before `from`
            if (bits != 0) {
                const std::size_t slot = w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
                due_low_ = drawn_ + ((slot - drawn_) & mask);  // its deadline: within a wheel from drawn_
                return slot;
            }
            w = w + 1 == words ? 0 : w + 1;
            bits = due_bits_[w];
        }
        due_low_ = drawn_;
        return no_slot;
    }

    // Domain d's next sample, the (taken + 1)-th: may be drawn at the slot n where the target after
    // n + 1 samples first passes taken; must be by the slot where it first reaches taken + 1 (none: its
    // target stops short of that, so it never must). A domain whose target never passes its count
    // again is done.
    //
    // Both searches start at the current sample, not at 0: the slot is max(may, drawn + 1) - 1, so a
    // may before drawn + 1 need not be found exactly; and the bound (target < count + 1 at every
    // sample) puts the deadline's must past drawn. Starting there keeps each search in the current
    // segment (first_reaching), the same answers for fewer targets.
    //
    // In a segment of constant shares (every stage's part after its ramp, the last one most of a run)
    // the target grows by the same 2 quota / (2 quantum) every sample, so each window follows from the
    // one before and how far past the count the target stood at its deadline (excess): a 32-bit
    // division and the domain's own record, where the general path took two targets in 128 bits, a
    // search over the segments and two more cache lines (the quota's and the prefix's). Bresenham's
    // line, with the same answers, while the line lasts: to the segment's end.
    [[gnu::always_inline]] void schedule_next(std::uint32_t d) {
        domain& m = domains_[d];
        if (m.excess != no_excess) [[likely]] {
            // target(reached) = taken + excess / (2 quantum), 0 <= excess < 2 quota: the target
            // passes taken at reached unless it lands on it, and reaches taken + 1 `steps` later.
            const std::uint32_t two_a = 2 * m.quota, need = 2 * quantum - m.excess;
            const std::uint32_t steps = (need + two_a - 1) / two_a;
            const std::uint64_t may = std::max(m.reached + (m.excess == 0 ? 1 : 0), drawn_ + 1), must = m.reached + steps;
            if (must < line_end_[m.segment]) {  // the end of a segment before the last; 2^48 - 1 for the last
                m.excess = steps * two_a - need;
                m.reached = must;
                file_waiting(d, may - 1);
                return;
            }
            m.excess = no_excess;  // past the line: the general path from here (never, past what a schedule serves)
        }
        schedule_by_targets(d);
    }
    // schedule_next's general path (a ramp, a segment's first deadline): the targets themselves.
    // Out of line: the line above is most draws.
    [[gnu::noinline]] void schedule_by_targets(std::uint32_t d) {
        domain& m = domains_[d];
        // Where the target passes the count is usually where it reached it (the previous sample's
        // deadline, kept): one target instead of a search, unless it landed exactly on the count.
        std::optional<std::uint64_t> may;
        if (const std::uint64_t reached = m.reached; reached != none) {
            const auto f = targets_.target(d, reached);
            if (f.num > mixture_uint128{m.taken} * f.den) may = std::max(reached, drawn_ + 1);
        }
        if (!may) may = targets_.first_reaching(d, m.taken, true, drawn_ + 1);
        if (!may) return;
        auto must = targets_.first_reaching(d, m.taken + 1, false, drawn_);
        if (must == drawn_) must = targets_.first_reaching(d, m.taken + 1, false);  // past the bound: an edited state
        m.reached = must ? *must : none;                                            // deadline_of(d) follows from it
        // A deadline past the first sample of a segment of constant shares (so the sample before it
        // is in the segment too, short of taken + 1) where the domain has a share: from here on, the
        // path above, until its line ends.
        if (must) {
            const std::size_t k = targets_.segment_of(*must);
            const std::uint32_t quota = targets_.constant(k) ? targets_.quota(k, d) : 0;
            if (quota > 0 && *must > targets_.first_sample(k)) {
                const auto f = targets_.target(d, *must);
                const mixture_uint128 goal = mixture_uint128{m.taken + 1} * f.den;
                if (f.den == 2 * quantum && f.num >= goal && f.num - goal < 2 * quota) {
                    m.excess = static_cast<std::uint32_t>(f.num - goal);
                    m.quota = quota;
                    m.segment = static_cast<std::uint32_t>(k);
                }
            }
        }
        file_waiting(d, *may - 1);  // at least drawn
    }
    // Domain d's pending sample waits for `slot`: on the wheel's list for it, or in far_.
    void file_waiting(std::uint32_t d, std::uint64_t slot) {
        domain& m = domains_[d];
        if (slot - drawn_ < slots_.size()) {
            std::uint32_t& head = slots_[slot & (slots_.size() - 1)].waiting;
            m.next_waiting = head;
            head = d;
        } else {
            far_.push({slot, d});
        }
    }

    static constexpr std::uint32_t no_domain = ~std::uint32_t{0}, no_excess = ~std::uint32_t{0};
    static constexpr std::uint32_t quantum = mixture_schedule::quantum;
    static constexpr std::size_t no_slot = ~std::size_t{0};
    static constexpr std::size_t max_wheel_slots = std::size_t{1} << 17;  // 1 MiB of list heads (both wheels) at most

    mixture_targets targets_;
    std::uint64_t drawn_;
    // Per segment, the sample schedule_next steps a deadline up to (not onto) without targets: a
    // constant segment's end sample (2^48 - 1 for the last), 0 for a ramp (never stepped in).
    std::vector<std::uint64_t> line_end_;
    // Per domain, together (one cache miss, not two, when a sample of one of 10,000 domains is drawn):
    // its count, where its target reached that count (none: not known), and the next domain on the
    // list its pending sample is on: its wheel slot's while it waits, its due slot's once ready.
    // In a segment of constant shares also the excess schedule_next steps from (no_excess: not known,
    // in a ramp or before its first deadline in the segment), its quota there and the segment: 32
    // bytes, aligned so one line holds it.
    struct alignas(32) domain {
        std::uint64_t taken, reached;
        std::uint32_t next_waiting, excess, quota, segment;
    };
    static_assert(sizeof(domain) == 32);
    std::vector<domain> domains_;
    // Each domain's pending sample is in one place. Waiting, by the first slot it may take: on the
    // wheel (a list per slot, modulo its size, for slots less than a wheel ahead) or in far_. Ready
    // (that slot passed), by its deadline (deadline_of): on the due wheel (a list per deadline slot,
    // in domain order once drawn from, and a bit per slot that has one) for deadlines less than a wheel ahead, else
    // in ready_, keyed by deadline; ties go to the lower domain.
    // Slot by slot, the two wheels' list heads side by side: a domain drawn from the due list at its
    // deadline's slot is filed next on the waiting list of that slot or the one after (its next
    // sample may be drawn where its target passed the count, which is where it reached the last one:
    // schedule_next), so the filing writes the line the draw just read. Two arrays apart it was a
    // second miss a draw (a mixer-alone loop that streams a batch's windows between draws, 10,000
    // domains: 174 to 164 cycles a draw, medians of seven).
    struct slot_lists {
        std::uint32_t waiting, due;
    };
    std::vector<slot_lists> slots_;
    // Per due slot, a bit each: it holds a list; the list is out of domain order (filed onto its head
    // in any order); it has been drawn from (kept in order from then on).
    std::vector<std::uint64_t> due_bits_, due_unsorted_, due_drawn_;
    std::vector<std::uint32_t> sort_scratch_;  // sort_due's
    std::uint64_t due_low_ = 0;                // no deadline on the due wheel is before it (first_due's scan starts there)
    // Per due slot modulo 256: the highest domain sorted or filed into that deadline's list since it
    // was sorted, while it is on the list (no_domain once drawn or moved). 4 KiB, whatever the number
    // of domains.
    struct finger {
        std::uint64_t slot = none;
        std::uint32_t domain = no_domain;
    };
    std::array<finger, 256> fingers_{};
    detail::quaternary_heap far_, ready_;
};

}  // namespace feedline
