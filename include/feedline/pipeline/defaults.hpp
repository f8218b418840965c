// feedline/pipeline/defaults.hpp: every default and tuning constant of the pipeline in one place, with
// what each is for and where it was measured (docs/tuning.md, docs/benchmarks.md). The static_asserts
// below state what must hold between them; change a value here, not in the code that uses it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace feedline {

struct defaults {
    // --- Workers (pipeline_config::workers = 0) ---
    // The most workers started from the machine's cores (recommend_workers); the autotuner parks the
    // ones not needed. Past 8, one trainer's data side is never short on the machines measured.
    static constexpr unsigned max_auto_workers = 8;

    // --- Memory (pipeline_config::memory_budget = 0: MemAvailable / budget_divisor) ---
    static constexpr std::uint64_t budget_divisor = 4;
    // Prefetch = 0: start this many batches deep per worker, with room for the autotuner to double that
    // and at least `min_depth_headroom` more (gradient accumulation's bursts with a single worker).
    static constexpr std::size_t start_depth_per_worker = 2;
    static constexpr std::size_t min_depth_headroom = 4;
    // Batches come in step order, so one late batch holds up every worker once the others have run
    // `depth` steps past it: the slack is depth / workers batches of each worker's time. Small batches
    // need more of them to cover the same hiccup (a page fault, a preempted worker), and cost little:
    // while the slots stay within `deep_ring_bytes`, the autotuner may deepen to this many per worker.
    // On 16 CPUs with 8-16 workers behind a fast consumer, 8 per worker instead of 4 took feedline
    // from 0.46-0.65 to 0.65-1.0 of the naive gather (docs/benchmarks.md).
    static constexpr std::size_t max_depth_per_worker = 8;
    static constexpr std::uint64_t deep_ring_bytes = 64u << 20;
    // Scratch per shard worker beyond one batch of raw tokens (read requests, mapped pieces).
    static constexpr std::uint64_t shard_scratch_extra_bytes = 64u << 10;
    // Per text worker: its tokenizer (feedline's encoders: a word cache of at most 8 MiB, in practice
    // 2 MiB of slots and 1-2 MiB of words, and buffers of ~12-25 bytes per byte of the longest piece of
    // text given at once, a few MB for ordinary documents; sentencepiece: a few MB for an 8k model), one
    // document's text and ids, the JSONL parser's buffers.
    static constexpr std::uint64_t text_worker_bytes = 12u << 20;
    // Tokens of documents several text workers need (longer than a sample, or at a batch's edge): a
    // document spanning many batches is tokenized once, not once per batch (pipeline/detail/document_cache.hpp).
    static constexpr std::uint64_t document_cache_bytes = 64u << 20;

    // --- Planning ---
    // Largest epoch index copied into every worker so each plans its steps itself (sampler::plan_at);
    // above it the workers share one sampler behind a lock. Megatron: 12-16 bytes per document, so up
    // to ~260 000-350 000 documents.
    static constexpr std::uint64_t own_planner_max_bytes = 4u << 20;
    // How long a worker that finds the shared planner busy tries it before sleeping on it
    // (detail/spin_then_lock.hpp): a few plans' length (a step of a 10,000-domain mixture plans in
    // ~10 us on the 2-vCPU VM), far below a scheduler's time slice.
    static constexpr std::chrono::microseconds planner_spin{20};

    // --- Reading ---
    // Software prefetch while converting mapped windows: the next pieces' cache lines up to this many
    // bytes ahead, and each piece's first this many bytes (two uint16 windows at T = 1024).
    static constexpr std::uint64_t prefetch_bytes = 4096;
    static constexpr std::uint64_t cache_line = 64;

    // --- Remote data (s3://): fetching ahead of the workers (pipeline/detail/fetch_ahead_thread.hpp) ---
    // At most this many steps' ranges held, and at most this share of what the budget has left after
    // the ring's two slots, the workers' scratch and the indexes. Less than two steps: none.
    static constexpr std::uint64_t fetch_ahead_max_steps = 64;
    static constexpr std::uint64_t fetch_ahead_budget_divisor = 2;

    // --- Staging ring ---
    // A sleeping trainer is woken once half the prefetch depth is ready, or after this long
    // (device/staging_ring.hpp: coalesced wake-ups).
    static constexpr std::chrono::microseconds coalesce_wakeups{1000};

    // --- Autotuner (pipeline/detail/autotuner.hpp) ---
    static constexpr std::uint64_t autotune_every = 16;  // batches per judged interval
    // Deepen the ring: the trainer waited more than this share of the interval ...
    static constexpr double deepen_when_stalled = 0.01;
    // ... while each producer also waited for room more than this share (bursts outrun the ring).
    static constexpr double deepen_when_producers_wait = 0.10;
    // One more worker: the trainer waited more than this share and the producers were busy.
    static constexpr double add_worker_when_stalled = 0.05;
    // Park a worker: the trainer waited less than this share ...
    static constexpr double park_when_stalled_below = 0.005;
    // ... and each producer waited for room more than this share.
    static constexpr double park_when_producers_wait = 0.50;

    // --- A trainer waiting in next() (device/staging_ring.hpp: set_consumer_spins) ---
    // With a worker on every CPU the process may use, a trainer that spins for its batch holds a CPU
    // the late batch's worker needs, and it stops spinning (sleeps at once) on hosts with at least
    // this many CPUs. On a 16-CPU H200 host that took 16 workers from a median 0.67 of the naive
    // gather to 0.78; on the 2-vCPU VM, where each wake-up of a sleeping trainer is a VM exit, two workers
    // gained nothing (0.86-0.94 against 0.82-1.06), so small machines keep spinning. 4 lies between the
    // two sizes measured (docs/benchmarks.md).
    static constexpr unsigned min_cpus_for_sleeping_trainer = 4;
    // While the workers leave the trainer a CPU, its next() polls this long for the batch before it
    // sleeps: a batch published meanwhile wakes nobody. On the 2-vCPU VM each futex wake-up of a
    // sleeping trainer cost one worker about a tenth of its time (perf); a batch of 32 x 1024 tokens
    // takes a worker about 25 us there. A slower pipeline costs the spare CPU this much a batch.
    static constexpr std::chrono::microseconds trainer_poll_with_a_spare_cpu{100};

    // --- Keeping workers off a busy trainer's CPU (exec/trainer_cpu.hpp) ---
    // The trainer counts as busy when its time outside next() is at least this share of its time
    // inside, averaged over about `placement_average_batches` batches.
    static constexpr double busy_trainer_ratio = 0.25;
    static constexpr int placement_average_batches = 8;
};

static_assert(defaults::max_auto_workers >= 1);
static_assert(defaults::budget_divisor >= 1);
static_assert(defaults::start_depth_per_worker >= 2, "a worker needs one slot being filled while the trainer holds another");
static_assert(defaults::max_depth_per_worker >= 2 * defaults::start_depth_per_worker, "room for the autotuner to deepen");
static_assert(defaults::prefetch_bytes % defaults::cache_line == 0, "prefetch whole cache lines");
static_assert(defaults::autotune_every >= 2, "the first interval (start-up) is not judged; intervals must hold batches");
static_assert(defaults::park_when_stalled_below < defaults::add_worker_when_stalled,
              "parking and adding need a gap between them, or the tuner flips a worker every interval");
static_assert(defaults::deepen_when_stalled <= defaults::add_worker_when_stalled,
              "a stall from bursts (producers idle) is judged before a stall from short workers");
static_assert(defaults::deepen_when_producers_wait < defaults::park_when_producers_wait,
              "producers that wait a little are bursty; only ones that wait most of the time are parked");
static_assert(defaults::busy_trainer_ratio > 0 && defaults::busy_trainer_ratio < 1);
static_assert(defaults::coalesce_wakeups.count() > 0, "the pipeline relies on coalesced wake-ups");

}  // namespace feedline
