// feedline/pipeline/config.hpp: everything a pipeline is told, as one aggregate for designated
// initializers. The top-level fields apply to every kind of data; `shards` and `text` hold what only
// token shards or only JSONL/text corpora use, and setting one for data that has none of that kind is
// a config_error naming the field. Choices are enums (io_backend, device_choice); every option is
// declared once in pipeline/options.hpp, from which strings of a command line, JSON or Python are
// parsed, with errors that list the choices. Checked before any thread starts: a config that cannot work throws
// config_error naming the field and the numbers.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>

#include <feedline/device/make_ring.hpp>
#include <feedline/format/text.hpp>
#include <feedline/sampling/sampler.hpp>
#include <feedline/storage/reader.hpp>

namespace feedline {

// Options only token shards (Megatron, llm.c) use.
struct shard_options {
    io_backend backend = io_backend::automatic;  // auto | io_uring | mmap | pread (storage/reader.hpp)
    // Shards in remote storage: steps whose ranges are fetched ahead of the workers from the sampler's
    // plan (pipeline/detail/fetch_ahead_thread.hpp). -1: as many as the measured latency and the
    // trainer's rate call for, within the memory budget; 0: none; N: N steps.
    int fetch_ahead = -1;
    friend bool operator==(const shard_options&, const shard_options&) = default;
};

// Options only JSONL / text corpora use: they are tokenized on the fly by the workers.
struct text_config {
    std::string tokenizer;                 // the tokenizer model (required for text; kind picked by make_tokenizer)
    std::string tokenizer_kind = "auto";   // a registered kind ("sentencepiece", "feedline"), or auto: recognized from the model
    bool add_bos = false, add_eos = true;  // the model's BOS before / EOS after every document
    text_options documents;                // what a document is: JSONL field, plain-text split, skip_invalid
    // Where the corpus's token-length index is kept between runs (one tokenizing pass on first open):
    // "" = $FEEDLINE_CACHE_DIR, else $XDG_CACHE_HOME/feedline, else ~/.cache/feedline; "none" = memory only.
    std::string cache_dir;
    friend bool operator==(const text_config&, const text_config&) = default;
};

struct pipeline_config {
    std::uint64_t batch_size = 8;  // samples per step on this rank (global batch = batch_size x world size)
    std::uint64_t seq_len = 1024;  // tokens per sample (inputs and targets are [batch_size, seq_len])
    std::uint64_t seed = 1234;
    sample_mode mode = sample_mode::windows;
    shuffle_mode shuffle = shuffle_mode::global;
    tail_policy tail = tail_policy::drop;  // one dataset's last incomplete batch of an epoch (blends have no epoch end)
    unsigned workers = 0;                  // 0: from the machine (recommend_workers), autotuned while running; N: exactly N
    unsigned max_workers = 0;              // workers = 0: the most the autotuner may run (0: from the machine)
    std::size_t prefetch = 0;              // batches staged ahead of the trainer (ring slots); 0: 2 per worker to start,
                                           // autotuned up to twice that (at least 4 more) within the memory budget
    std::uint64_t memory_budget = 0;       // bytes for slots, scratch and indexes; 0: a quarter of what is available
    device_choice device;                  // auto | cpu | cuda:N (parse_device for strings)
    int rank = -1, world_size = -1;        // -1: from torchrun / Open MPI's environment
    int ignore_index = -1;                 // the target where there is no next token (packed: a piece's end, padding)
    std::uint64_t max_steps = 0;           // 0: run until the trainer stops; else the iteration ends after this step
    std::uint64_t epochs = 0;              // one dataset: the iteration also ends after this many passes (0: no end)
    std::string stats_jsonl;               // append a stats() snapshot as a JSON line here every stats_every batches and at the end
    std::uint64_t stats_every = 100;
    bool avoid_trainer_cpu = true;  // keep the threads filling the ring off a busy trainer's CPU when there is one
                                    // to spare (exec/trainer_cpu.hpp); false leaves placement to the kernel
    shard_options shards;           // token shards only
    text_config text;               // JSONL / text only
    // Options set explicitly (by set_option: a command line, JSON, Python), one bit per declaration in
    // pipeline/options.hpp; a config written in C++ leaves it empty and counts as set what differs
    // from the default.
    std::bitset<64> set_by_user;
    friend bool operator==(const pipeline_config&, const pipeline_config&) = default;
};

// How the budget is spent. Slots are the big item; the rest is per worker or fixed.
struct memory_plan {
    std::uint64_t budget = 0;
    std::size_t slots = 0, slot_bytes = 0;
    std::size_t depth = 0;           // prefetch depth to start with (<= slots; the autotuner may raise it to slots)
    std::uint64_t worker_bytes = 0;  // scratch per worker (raw tokens of one batch, a tokenizer, ...)
    std::uint64_t index_bytes = 0;   // the sampler's epoch layouts and the sources' indexes and caches
    unsigned workers = 0;
    std::uint64_t fetch_ahead_bytes = 0;  // remote data: ranges fetched ahead of the workers (storage/fetch_ahead.hpp)
    std::uint64_t total() const noexcept { return slots * slot_bytes + workers * worker_bytes + index_bytes + fetch_ahead_bytes; }
};

}  // namespace feedline
