// feedline/pipeline/config.hpp: everything a pipeline is told, as one aggregate for designated
// initializers, and how its one memory budget is split. Checked before any thread starts: a config
// that cannot work throws config_error naming the field and the numbers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <feedline/error.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/storage/reader.hpp>

namespace feedline {

struct pipeline_config {
    std::uint64_t batch_size = 8;      // samples per step on this rank (global batch = batch_size x world size)
    std::uint64_t seq_len = 1024;      // tokens per sample (inputs and targets are [batch_size, seq_len])
    std::uint64_t seed = 1234;
    sample_mode mode = sample_mode::windows;
    shuffle_mode shuffle = shuffle_mode::global;
    tail_policy tail = tail_policy::drop;
    unsigned workers = 0;              // 0: from the machine (cores this process may use, minus the trainer's), autotuned
                                       // while running; N: exactly N, no autotuning
    std::size_t prefetch = 0;          // batches staged ahead of the trainer (ring slots); 0: 2 per worker to start,
                                       // autotuned up to twice that (at least 4 more) within the memory budget
    std::uint64_t memory_budget = 0;   // bytes for slots, scratch and indexes; 0: a quarter of what is available
    std::string io_backend = "auto";   // auto | io_uring | mmap | pread
    std::string device = "auto";       // auto | cpu | cuda | cuda:N
    int rank = -1, world_size = -1;    // -1: from torchrun / Open MPI's environment
    std::uint64_t max_steps = 0;       // 0: run until the trainer stops; else the iteration ends after this step
    std::string stats_jsonl;           // append a stats() snapshot as a JSON line here every stats_every batches and at the end
    std::uint64_t stats_every = 100;
    std::string tokenizer;             // text input (text_pipeline): the sentencepiece model to tokenize with
    bool add_bos = false, add_eos = true;  // text input: the model's BOS before / EOS after every document
    unsigned max_workers = 0;          // workers = 0: the most the autotuner may run (0: from the machine)
    bool avoid_trainer_cpu = true;     // keep the threads filling the ring off a busy trainer's CPU when there is one
                                       // to spare (exec/trainer_cpu.hpp); false leaves placement to the kernel
};

// Memory this process may use: MemAvailable, capped by the cgroup limit.
inline std::uint64_t memory_available_to_process(const topology& t) {
    std::uint64_t avail = memory_available_bytes();
    if (t.cgroup_memory_max) avail = avail == 0 ? *t.cgroup_memory_max : std::min(avail, *t.cgroup_memory_max);
    return avail;
}

// How the budget is spent. Slots are the big item; the rest is per worker or fixed.
struct memory_plan {
    std::uint64_t budget = 0;
    std::size_t slots = 0, slot_bytes = 0;
    std::size_t depth = 0;  // prefetch depth to start with (<= slots; the autotuner may raise it to slots)
    std::uint64_t worker_bytes = 0;  // scratch per worker (raw tokens of one batch + requests)
    std::uint64_t index_bytes = 0;   // the sampler's epoch layout
    unsigned workers = 0;
    std::uint64_t total() const noexcept { return slots * slot_bytes + workers * worker_bytes + index_bytes; }
};

// Picks the number of slots within the budget (the config's prefetch if given). Throws config_error
// when even two slots do not fit.
inline memory_plan plan_memory(const pipeline_config& c, std::uint64_t budget, unsigned workers, std::size_t slot_bytes,
                               std::uint64_t worker_bytes, std::uint64_t index_bytes) {
    memory_plan p{.budget = budget, .slot_bytes = slot_bytes, .worker_bytes = worker_bytes, .index_bytes = index_bytes, .workers = workers};
    const std::uint64_t fixed = workers * worker_bytes + index_bytes;
    // Auto: start 2 batches deep per worker, with room for the autotuner to double that (at least 4 more:
    // enough for gradient accumulation's bursts of a single worker).
    const std::size_t start = std::max<std::size_t>(2, 2 * std::size_t(workers));
    const std::size_t wanted = c.prefetch ? c.prefetch : start + std::max<std::size_t>(4, start);
    if (c.prefetch == 1) throw config_error("prefetch", "needs at least 2 batches (one in use, one being filled)");
    const std::uint64_t fits = budget > fixed ? (budget - fixed) / std::max<std::size_t>(1, slot_bytes) : 0;
    if (fits < 2)
        throw config_error("memory_budget", std::to_string(budget) + " bytes cannot hold 2 batches of " + std::to_string(slot_bytes) +
                                                " bytes plus " + std::to_string(fixed) + " bytes of worker scratch and index (" +
                                                std::to_string(workers) + " workers): raise it or shrink batch_size x seq_len");
    if (c.prefetch && c.prefetch > fits)
        throw config_error("prefetch", std::to_string(c.prefetch) + " batches of " + std::to_string(slot_bytes) + " bytes exceed the memory budget of " +
                                           std::to_string(budget) + " bytes (" + std::to_string(fits) + " fit)");
    p.slots = static_cast<std::size_t>(std::min<std::uint64_t>(wanted, fits));
    p.depth = c.prefetch ? p.slots : std::min(start, p.slots);
    return p;
}

}  // namespace feedline
