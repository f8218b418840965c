// bench_end_to_end: is the whole pipeline fast enough to cost a trainer nothing on the CPU side?
//
// Same shards (llm.c uint16, page cache warm), same batch shape (random windows, int32 inputs and
// targets), host ring, in one run with interleaved rounds (medians), for two shapes: B=32 x T=1024
// and the small windows B=256 x T=128 (the same tokens per batch, 8x the windows), and for each worker
// count of --workers (default 1,2; --workers 1,2,4,8,16 is the scaling sweep, capped at the CPUs):
//   naive_gather_Nt   N threads, each gathering its share of the batches' windows from mmap'd shards
//                     into one reused buffer (uint16 -> int32), the baseline the targets are set against
//   gather_prefetch_Nt the same loop with feedline's software prefetch of the next windows: what is
//                     left of the library's cost once both use the same technique
//   gather_handoff_Nt the naive loop writing batch b into buffer b % S of a pool the threads share (S =
//                     the pipeline's slots for N workers), as workers write into a ring's slots: what
//                     handing batches between threads costs in the caches, without the library
//   gather_prefetch_handoff_Nt both: prefetching and writing into shared slots, as feedline's workers do;
//                     the closest a hand-written loop comes to the pipeline's work
//   feedline_Nw       feedline::pipeline with N workers; the consumer takes every batch
// Rates are steady state: a pipeline's clock starts at its first batch (the start-up, from the
// constructor to the first batch, is reported on its own as first_batch_ms), and each case moves
// --batches x N batches, so a case lasts about as long at 16 threads as at 1.
// Then a paced consumer (a synthetic step of 2x one worker's batch time, 1 worker): p50/p99 of next().
// With --buffers 2,4,8,...: only the prefetching gather on one thread into that many rotating batch
// buffers (a ring's footprint: past the core's L2, each store first fetches its line).
// With --peers it runs benchmarks/compare_python.py (PyTorch DataLoader, nanoGPT get_batch, numpy)
// under /usr/bin/python3 on the same shards and reports feedline's ratio to the best of them. With
// --text (and --tokenizer): JSONL parsing with and without simdjson, and on-the-fly tokenization.
// Last line: one JSON object with tokens_per_s, vs_naive_gather, vs_best_peer, p99_wait_us, ...
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <feedline/pipeline.hpp>

#include "bench_common.hpp"

using namespace feedline;
using namespace feedline::bench;

namespace {

// A batch's shape: B windows of T tokens.
struct shape {
    std::uint64_t B, T;
    std::string name() const { return std::to_string(B) + "x" + std::to_string(T); }
};

struct mapped_shards {
    std::vector<std::pair<const std::uint16_t*, std::uint64_t>> shards;  // tokens, count
    explicit mapped_shards(const token_dataset& d) {
        for (std::size_t i = 0; i < d.shard_count(); ++i) {
            const auto& s = d.shard(i);
            void* p = ::mmap(nullptr, s.bin->size(), PROT_READ, MAP_SHARED, s.bin->local_file()->use().fd(), 0);
            if (p == MAP_FAILED) throw io_error(s.bin->name(), errno, "mmap");
            shards.emplace_back(reinterpret_cast<const std::uint16_t*>(static_cast<const std::byte*>(p) + 1024), s.tokens);
        }
    }
};

// `threads` threads gather `batches` batches of random windows into per-thread reused buffers. With
// `prefetch`, the loop does what feedline's workers do with a batch's plan: draws all of the batch's
// windows first and requests each window's cache lines two windows before converting it.
// With `handoff_slots` > 0, batch b is written into buffer b % handoff_slots of a pool shared by the
// threads, as the pipeline's workers write into its ring's slots, instead of a buffer of the thread's own.
double naive_gather(const mapped_shards& m, shape S, unsigned threads, std::uint64_t batches, bool prefetch = false,
                    std::size_t handoff_slots = 0) {
    const std::uint64_t B = S.B, T = S.T;
    std::vector<std::thread> pool;
    std::atomic<std::uint64_t> sink{0};
    std::vector<std::vector<std::int32_t>> shared(2 * handoff_slots, std::vector<std::int32_t>(B * T, 1));
    auto t0 = clock_type::now();
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            std::vector<std::int32_t> own_inputs(handoff_slots ? 0 : B * T), own_targets(handoff_slots ? 0 : B * T);
            std::int32_t* inputs = own_inputs.data();
            std::int32_t* targets = own_targets.data();
            std::vector<const std::uint16_t*> windows(B);
            auto fetch = [T](const std::uint16_t* w) {
                for (std::uint64_t j = 0; j < T + 1; j += 32) __builtin_prefetch(w + j, 0, 3);
                __builtin_prefetch(w + T, 0, 3);
            };
            std::mt19937_64 rng(t + 1);
            std::uint64_t local = 0;
            for (std::uint64_t b = t; b < batches; b += threads) {
                if (handoff_slots) {
                    inputs = shared[2 * (b % handoff_slots)].data();
                    targets = shared[2 * (b % handoff_slots) + 1].data();
                }
                if (!prefetch) {
                    for (std::uint64_t i = 0; i < B; ++i) {
                        const auto& [tok, n] = m.shards[rng() % m.shards.size()];
                        const std::uint16_t* w = tok + rng() % (n - T - 1);
                        for (std::uint64_t j = 0; j < T; ++j) inputs[i * T + j] = w[j];
                        for (std::uint64_t j = 0; j < T; ++j) targets[i * T + j] = w[j + 1];
                    }
                } else {
                    for (auto& w : windows) {
                        const auto& [tok, n] = m.shards[rng() % m.shards.size()];
                        w = tok + rng() % (n - T - 1);
                    }
                    fetch(windows[0]), fetch(windows[1]);
                    for (std::uint64_t i = 0; i < B; ++i) {
                        const std::uint16_t* w = windows[i];
                        if (i + 2 < B) fetch(windows[i + 2]);
                        for (std::uint64_t j = 0; j < T; ++j) inputs[i * T + j] = w[j];
                        for (std::uint64_t j = 0; j < T; ++j) targets[i * T + j] = w[j + 1];
                    }
                }
                local += static_cast<std::uint64_t>(inputs[b % (B * T)]);
            }
            sink += local;
        });
    for (auto& th : pool) th.join();
    return static_cast<double>(batches * B * T) / seconds_since(t0);
}

bool avoid_trainer_cpu = true;  // --leave-placement-to-kernel turns it off, for A/B runs
std::size_t prefetch = 0;       // --prefetch: the ring's slots (0: the pipeline's default)
bool breakdown = false;         // --breakdown: print where each pipeline's batch time went

pipeline_config config(shape S, unsigned workers, std::uint64_t batches) {
    return {.batch_size = S.B,
            .seq_len = S.T,
            .seed = 1,
            .workers = workers,
            .prefetch = prefetch,
            .device = device_kind::cpu,
            .rank = 0,
            .world_size = 1,
            .max_steps = batches,
            .avoid_trainer_cpu = avoid_trainer_cpu,
            .shards = {.backend = io_backend::mmap}};
}

// Steady-state tokens/s from the first batch to the last; the start-up (constructor to first batch,
// in ms) goes to `first_batch_ms`.
double feedline_rate(std::shared_ptr<const token_dataset> data, shape S, unsigned workers, std::uint64_t batches,
                     std::vector<double>& first_batch_ms) {
    const auto t0 = clock_type::now();
    pipeline p(std::move(data), config(S, workers, batches));
    std::uint64_t sink = 0, n = 0;
    clock_type::time_point first;
    for (auto& b : p) {
        if (n++ == 0) first = clock_type::now();
        sink += static_cast<std::uint64_t>(b.host_inputs()[b.step() % (S.B * S.T)]);
    }
    double rate = static_cast<double>((batches - 1) * S.B * S.T) / seconds_since(first);
    first_batch_ms.push_back(std::chrono::duration<double, std::milli>(first - t0).count());
    if (breakdown) {  // where a batch's time went, from the pipeline's own counters (summed over workers)
        const pipeline_stats st = p.stats();
        const double per = 1e6 / static_cast<double>(batches), w = workers;
        const double convert_s = st.read_s + st.assemble_s;  // reading and converting the windows into the slot
        const double worker_us = st.seconds * per * w, rest = worker_us - (convert_s + st.plan_s + st.slot_wait_s) * per;
        std::printf(
            "  %s %uw, per batch of one worker: converting %.1f us, planning %.1f us, waiting for a slot %.1f us, the rest %.1f us, "
            "in all %.1f us (%.2f us per window converting)\n",
            S.name().c_str(), workers, convert_s * per, st.plan_s * per, st.slot_wait_s * per, rest, worker_us,
            convert_s * per / static_cast<double>(S.B));
    }
    if (sink == 1) std::printf(" ");
    return rate;
}

void warm(const token_dataset& d) {
    std::vector<char> buf(1 << 20);
    for (std::size_t i = 0; i < d.shard_count(); ++i) {
        std::ifstream in(d.shard_path(i), std::ios::binary);
        while (in.read(buf.data(), static_cast<std::streamsize>(buf.size()))) {
        }
    }
}

// JSONL parsing, the part of reading a document before tokenizing it: every line of `path` through
// jsonl_field_parser's fast path (simdjson when built in) and through nlohmann_json alone, in MB/s of
// lines. Nothing when the file is not JSONL.
struct jsonl_rates {
    double fast = 0, reference = 0;
};
std::optional<jsonl_rates> measure_jsonl(const std::string& path) {
    if (!path.ends_with(".jsonl")) return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    std::vector<std::string> lines;
    std::uint64_t bytes = 0;
    for (std::string line; std::getline(in, line);) bytes += line.size(), lines.push_back(std::move(line));
    auto rate = [&](jsonl_field_parser::engine e) {
        jsonl_field_parser parser(e);
        std::string text;
        auto t0 = clock_type::now();
        for (std::string& line : lines)
            if (parser.extract(line, "text", text) != jsonl_field_status::ok)
                throw format_error(path, 0, "a line without a \"text\" string");
        return static_cast<double>(bytes) / seconds_since(t0) / 1e6;
    };
    interleaved cases;
    cases.add("JSONL field, fast path (MB/s)", [&] { return rate(jsonl_field_parser::engine::fastest); });
    cases.add("JSONL field, nlohmann_json alone (MB/s)", [&] { return rate(jsonl_field_parser::engine::nlohmann); });
    auto r = cases.run(5, "MB/s");
    return jsonl_rates{r["JSONL field, fast path (MB/s)"].median, r["JSONL field, nlohmann_json alone (MB/s)"].median};
}

#if FEEDLINE_HAS_SENTENCEPIECE
// On-the-fly tokenization: sentencepiece alone on one thread (every document of the corpus encoded
// once, from memory) vs the pipeline delivering windows of text with 1 and 2 workers, in tokens/s. Also
// sentencepiece alone on 2 threads (half the documents each, a processor each): how far Encode
// itself scales on this machine, the ceiling for the pipeline's 2-workers-vs-1 ratio.
struct tokenize_rates {
    double spm = 0, spm2 = 0, w1 = 0, w2 = 0, w1_library = 0, text_mb_per_s_spm = 0;
    std::string encoder;
};
tokenize_rates measure_tokenization(const std::string& text, const std::string& model) {
    text_corpus corpus({text});
    std::vector<std::string> docs(corpus.document_count());
    text_corpus::scratch scratch;
    for (std::uint64_t i = 0; i < docs.size(); ++i) corpus.document_text(i, scratch, docs[i]);
    sentencepiece::SentencePieceProcessor spm;
    if (!spm.Load(model).ok()) throw config_error("--tokenizer", model + ": cannot load");
    std::uint64_t corpus_tokens = 0, corpus_bytes = 0;
    for (const auto& d : docs) corpus_bytes += d.size();
    interleaved cases;
    cases.add("sentencepiece alone, 1 thread (tokens/s)", [&] {
        std::vector<int> ids;
        std::uint64_t n = 0;
        auto t0 = clock_type::now();
        for (const auto& d : docs) {
            spm.Encode(d, &ids);
            n += ids.size() + 1;  // + EOS, as the pipeline adds
        }
        corpus_tokens = n;
        return static_cast<double>(n) / seconds_since(t0);
    });
    cases.add("sentencepiece alone, 2 threads (tokens/s)", [&] {
        std::atomic<std::uint64_t> n{0};
        auto half = [&](std::size_t first) {
            sentencepiece::SentencePieceProcessor own;
            if (!own.Load(model).ok()) return;
            std::vector<int> ids;
            std::uint64_t local = 0;
            for (std::size_t i = first; i < docs.size(); i += 2) {
                own.Encode(docs[i], &ids);
                local += ids.size() + 1;
            }
            n += local;
        };
        auto t0 = clock_type::now();
        std::thread other(half, 1);
        half(0);
        other.join();
        return static_cast<double>(n.load()) / seconds_since(t0);
    });
    // The text source opened once, as a trainer's training and evaluation pipelines share it: its
    // token-length pass (or cache read) is start-up, not tokenization throughput.
    // The default encoder (kind auto: feedline's own where it reproduces the model), and the library's
    // as the "before".
    auto source = std::make_shared<text_source>(std::vector<std::string>{text}, text_config{.tokenizer = model, .cache_dir = "none"});
    auto library_source = std::make_shared<text_source>(
        std::vector<std::string>{text}, text_config{.tokenizer = model, .tokenizer_kind = "sentencepiece", .cache_dir = "none"});
    std::printf("tokenization: token lengths %s; encoder %s\n", source->lengths_origin().c_str(), source->tokenizer_description().c_str());
    auto pipeline_rate = [&](unsigned workers, const std::shared_ptr<text_source>& from) {
        // About one pass over the corpus per measurement.
        const std::uint64_t steps = std::max<std::uint64_t>(10, corpus_tokens / (8 * 256));
        pipeline p(from, {.batch_size = 8, .seq_len = 256, .seed = 1, .workers = workers, .device = device_kind::cpu, .max_steps = steps});
        auto t0 = clock_type::now();
        std::uint64_t n = 0;
        for (auto& b : p) n += b.size() * b.seq_len();
        return static_cast<double>(n) / seconds_since(t0);
    };
    cases.add("text source 1 worker (tokens/s)", [&] { return pipeline_rate(1, source); });
    cases.add("text source 2 workers (tokens/s)", [&] { return pipeline_rate(2, source); });
    cases.add("text source 1 worker, libsentencepiece (tokens/s)", [&] { return pipeline_rate(1, library_source); });
    auto r = cases.run(5, "tokens/s");
    tokenize_rates out;
    out.spm = r["sentencepiece alone, 1 thread (tokens/s)"].median;
    out.spm2 = r["sentencepiece alone, 2 threads (tokens/s)"].median;
    out.w1 = r["text source 1 worker (tokens/s)"].median;
    out.w2 = r["text source 2 workers (tokens/s)"].median;
    out.w1_library = r["text source 1 worker, libsentencepiece (tokens/s)"].median;
    out.encoder = source->tokenizer_description();
    out.text_mb_per_s_spm = out.spm * (static_cast<double>(corpus_bytes) / static_cast<double>(corpus_tokens)) / 1e6;
    return out;
}
#endif

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"feedline end to end vs a naive gather loop and Python loaders"};
    std::string spec, make;
    std::uint64_t batches = 5000, make_tokens = 1'000'000'000;
    bool peers = false;
    std::string text, tokenizer;
    app.add_option("--data", spec, "llm.c shard glob (uint16)");
    app.add_option("--text", text, "JSONL/text corpus for the on-the-fly tokenization measurement (with --tokenizer)");
    app.add_option("--tokenizer", tokenizer, "sentencepiece model for --text");
    app.add_option("--make-data", make, "write synthetic llm.c shards with this prefix first (--data is then PREFIX_*.bin)");
    app.add_option("--make-tokens", make_tokens, "tokens to write with --make-data")->capture_default_str();
    app.add_option("--batches", batches, "batches per measurement")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{20}, std::uint64_t{1} << 40));
    app.add_flag("--peers", peers, "also run benchmarks/compare_python.py (needs python3-torch)");
    std::vector<unsigned> workers{1, 2};
    app.add_option("--workers", workers, "worker (and gather thread) counts to measure, e.g. 1,2,4,8,16 (capped at the CPUs)")
        ->delimiter(',')
        ->check(CLI::Range(1u, 1024u));
    shape main_shape{32, 1024}, small_shape{256, 128};
    app.add_option("--seq-len", main_shape.T, "T of the main shape")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{8}, std::uint64_t{1} << 20));
    app.add_option("--batch-size", main_shape.B, "B of the main shape")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 16));
    app.add_option("--small-seq-len", small_shape.T, "T of the small-window shape")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{8}, std::uint64_t{1} << 20));
    app.add_option("--small-batch-size", small_shape.B, "B of the small-window shape")
        ->capture_default_str()
        ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 16));
    std::string only;
    app.add_option("--only", only, "run only the cases whose name contains this (e.g. 'feedline_1w 256x128' under perf); no summary")
        ->excludes("--peers");
    int rounds = 5;
    app.add_option("--rounds", rounds, "interleaved rounds (the medians' sample)")->capture_default_str()->check(CLI::Range(1, 101));
    bool kernel_placement = false;
    app.add_option("--prefetch", prefetch, "batches in flight (the ring's slots; default: the pipeline's own)");
    app.add_flag("--leave-placement-to-kernel", kernel_placement, "pipelines with avoid_trainer_cpu = false (A/B of worker placement)");
    app.add_flag("--breakdown", breakdown, "print, for each pipeline run, where a batch's time went (the pipeline's counters)");
    std::vector<std::size_t> buffers;
    app.add_option("--buffers", buffers,
                   "instead of the cases: the prefetching gather (one thread, the main shape) into this many rotating batch "
                   "buffers each, e.g. 2,4,8,16,32 (what a ring's footprint costs the copy)")
        ->delimiter(',')
        ->check(CLI::Range(std::size_t{1}, std::size_t{4096}));
    CLI11_PARSE(app, argc, argv);
    avoid_trainer_cpu = !kernel_placement;
    if (!make.empty()) {
        llmc_writer w(make, token_dtype::uint16, 50256, 256u << 20);
        std::mt19937 rng(1);
        std::vector<std::uint16_t> doc(4096);
        for (std::uint64_t written = 0; written < make_tokens; written += doc.size()) {
            for (auto& t : doc) t = static_cast<std::uint16_t>(rng() % 50000);
            w.add_document(doc);
        }
        w.finish();
        spec = make + "_*.bin";
    }
    if (spec.empty()) {
        std::fprintf(stderr, "give --data GLOB or --make-data PREFIX\n");
        return 2;
    }
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    std::erase_if(workers, [&](unsigned n) { return n > cpus; });
    if (workers.empty()) workers = {1};
    auto data = std::make_shared<const token_dataset>(spec);
    warm(*data);
    mapped_shards m(*data);
    std::printf("bench_end_to_end: %zu shards, %.2f G tokens (%.1f GB), shapes %s and %s, %llu batches per thread per case, %u CPUs\n",
                data->shard_count(), data->total_tokens() / 1e9, data->total_tokens() * 2 / 1e9, main_shape.name().c_str(),
                small_shape.name().c_str(), static_cast<unsigned long long>(batches), cpus);

    if (!buffers.empty()) {  // the footprint sweep: the same loop, only the number of buffers it rotates through differs
        interleaved sweep;
        for (const std::size_t n : buffers)
            sweep.add("gather_prefetch_1t into " + std::to_string(n) + " buffers " + main_shape.name() + " (tokens/s)",
                      [&, n] { return naive_gather(m, main_shape, 1, batches, true, n); });
        sweep.run(rounds, "tokens/s");
        return 0;
    }
    // Every shape x worker count: the naive gather, the gather with prefetch and the pipeline, one
    // round of all of them at a time.
    const std::vector<shape> shapes{main_shape, small_shape};
    std::map<std::string, std::vector<double>> first_batch_ms;
    interleaved cases;
    auto key = [](const char* what, shape S, unsigned n, const char* unit) {
        return std::string(what) + "_" + std::to_string(n) + (what[0] == 'f' ? "w " : "t ") + S.name() + " (" + unit + ")";
    };
    for (const shape S : shapes)
        for (const unsigned n : workers) {
            const std::uint64_t per_case = batches * n;
            cases.add(key("naive_gather", S, n, "tokens/s"), [&, S, n, per_case] { return naive_gather(m, S, n, per_case); });
            cases.add(key("feedline", S, n, "tokens/s"),
                      [&, S, n, per_case] { return feedline_rate(data, S, n, per_case, first_batch_ms[S.name() + std::to_string(n)]); });
            cases.add(key("gather_prefetch", S, n, "tokens/s"), [&, S, n, per_case] { return naive_gather(m, S, n, per_case, true); });
            cases.add(key("gather_handoff", S, n, "tokens/s"),
                      [&, S, n, per_case] { return naive_gather(m, S, n, per_case, false, 2 * std::max(2u, 2 * n)); });
            cases.add(key("gather_prefetch_handoff", S, n, "tokens/s"),
                      [&, S, n, per_case] { return naive_gather(m, S, n, per_case, true, 2 * std::max(2u, 2 * n)); });
        }
    if (!only.empty()) {
        cases.keep_only(only);
        cases.run(rounds, "tokens/s");
        return 0;
    }
    auto r = cases.run(rounds, "tokens/s");
    nlohmann::json sweep = nlohmann::json::array();
    for (const shape S : shapes)
        for (const unsigned n : workers) {
            const double naive = r[key("naive_gather", S, n, "tokens/s")].median, fed = r[key("feedline", S, n, "tokens/s")].median,
                         pre = r[key("gather_prefetch", S, n, "tokens/s")].median,
                         handoff = r[key("gather_handoff", S, n, "tokens/s")].median,
                         pre_handoff = r[key("gather_prefetch_handoff", S, n, "tokens/s")].median;
            const double first = summarise(first_batch_ms[S.name() + std::to_string(n)]).median;
            std::printf(
                "%s, %u thread(s): feedline / naive gather %.3f, / gather with prefetch %.3f, / gather into shared slots %.3f, / "
                "both %.3f; first batch %.1f ms\n",
                S.name().c_str(), n, fed / naive, fed / pre, fed / handoff, fed / pre_handoff, first);
            sweep.push_back({{"shape", S.name()},
                             {"batch_size", S.B},
                             {"seq_len", S.T},
                             {"threads", n},
                             {"feedline", fed},
                             {"naive_gather", naive},
                             {"gather_prefetch", pre},
                             {"gather_handoff", handoff},
                             {"gather_prefetch_handoff", pre_handoff},
                             {"vs_naive_gather", fed / naive},
                             {"vs_gather_prefetch_handoff", fed / pre_handoff},
                             {"vs_gather_handoff", fed / handoff},
                             {"vs_gather_prefetch", fed / pre},
                             {"first_batch_ms", first}});
        }
    auto rate = [&](const char* what, shape S, unsigned n) {
        const auto it = r.find(key(what, S, n, "tokens/s"));
        return it == r.end() ? std::numeric_limits<double>::quiet_NaN() : it->second.median;
    };
    const shape S = main_shape;
    const double n1 = rate("naive_gather", S, 1), f1 = rate("feedline", S, 1), p1 = rate("gather_prefetch", S, 1);
    const double n2 = rate("naive_gather", S, 2), f2 = rate("feedline", S, 2), p2 = rate("gather_prefetch", S, 2);
    const std::uint64_t B = S.B, T = S.T;

    // Paced consumer: a synthetic step of twice the time one worker takes to produce a batch, with one
    // worker (the consumer's busy step occupies a core of its own). 5x the batches of a case, so the
    // run lasts long enough (~0.5 s here) that start-up and a single hiccup of the host do not decide
    // the p99 or the stall fraction.
    const double step_s = 2.0 * static_cast<double>(B * T) / f1;
    std::vector<double> waits;
    double stall_fraction = 0;
    std::string placement;
    {
        pipeline p(data, config(main_shape, 1, 5 * batches));
        for (auto it = p.begin(); it != p.end();) {
            auto t0 = clock_type::now();
            ++it;  // releases the previous batch, waits for the next
            waits.push_back(seconds_since(t0) * 1e6);
            auto s0 = clock_type::now();
            while (seconds_since(s0) < step_s) {
            }
        }
        stall_fraction = p.stats().stall_fraction;
        placement = p.stats().worker_placement;
    }
    std::vector<double> steady(waits.begin() + 10, waits.end());
    std::sort(steady.begin(), steady.end());
    const double p50 = steady[steady.size() / 2], p99 = steady[steady.size() * 99 / 100];
    std::printf("paced consumer (step %.1f us): next() p50 %.1f us, p99 %.1f us, stall fraction %.4f; worker %s\n", step_s * 1e6, p50, p99,
                stall_fraction, placement.c_str());

    nlohmann::json out = {{"sweep", sweep},
                          {"tokens_per_s", f2},
                          {"tokens_per_s_1w", f1},
                          {"naive_gather_1t", n1},
                          {"naive_gather_2t", n2},
                          {"vs_naive_gather", f2 / n2},
                          {"vs_naive_gather_1t", f1 / n1},
                          {"gather_prefetch_1t", p1},
                          {"gather_prefetch_2t", p2},
                          {"vs_gather_prefetch", f2 / p2},  // the library's own cost, against a loop as smart as its workers
                          {"vs_gather_prefetch_1t", f1 / p1},
                          {"p50_wait_us", p50},
                          {"p99_wait_us", p99},
                          {"paced_stall_fraction", stall_fraction},
                          {"vs_best_peer", nullptr},
                          {"tokenize_1w_vs_spm", nullptr},
                          {"tokenize_2w_vs_1w", nullptr}};
    if (!text.empty())
        if (const auto j = measure_jsonl(text)) {
            std::printf("JSONL parsing: fast path (simdjson %s) %.0f MB/s, nlohmann_json alone %.0f MB/s\n",
                        jsonl_field_parser::has_simdjson ? "built in" : "absent", j->fast, j->reference);
            out["jsonl_simdjson_vs_nlohmann"] = j->fast / j->reference;
        }
    if (!text.empty() && !tokenizer.empty()) {
#if FEEDLINE_HAS_SENTENCEPIECE
        const tokenize_rates t = measure_tokenization(text, tokenizer);
        std::printf(
            "tokenization: sentencepiece alone %.0f tokens/s (%.2f MB/s of text), on 2 threads %.0f; pipeline 1 worker %.0f, 2 workers "
            "%.0f tokens/s (%s); 1 worker with libsentencepiece %.0f tokens/s\n",
            t.spm, t.text_mb_per_s_spm, t.spm2, t.w1, t.w2, t.encoder.c_str(), t.w1_library);
        out["tokenize_spm_tokens_per_s"] = t.spm;
        out["tokenize_spm_2t_tokens_per_s"] = t.spm2;
        out["tokenize_1w_tokens_per_s"] = t.w1;
        out["tokenize_2w_tokens_per_s"] = t.w2;
        out["tokenize_1w_vs_spm"] = t.w1 / t.spm;
        out["tokenize_2w_vs_1w"] = t.w2 / t.w1;
        out["tokenize_spm_2t_vs_1t"] = t.spm2 / t.spm;  // the machine's own scaling of Encode: the ceiling of the line above
        out["tokenize_1w_library_tokens_per_s"] = t.w1_library;
        out["tokenize_1w_vs_library_1w"] = t.w1 / t.w1_library;  // the default encoder against the library's, in the pipeline
        out["tokenize_encoder"] = t.encoder;
#else
        std::printf("tokenization: skipped (built without sentencepiece)\n");
#endif
    }
    if (peers) {
        std::string cmd = "/usr/bin/python3 " FEEDLINE_SOURCE_DIR "/benchmarks/compare_python.py --data '" + spec + "'";
        FILE* py = ::popen(cmd.c_str(), "r");
        std::string text, last;
        char line[4096];
        while (py != nullptr && std::fgets(line, sizeof line, py) != nullptr) {
            std::printf("  python: %s", line);
            last = line;
        }
        if (py != nullptr && ::pclose(py) == 0) {
            auto j = nlohmann::json::parse(last);
            out["peers"] = j["peers"];  // each peer's tokens/s, for plot_end_to_end.py
            out["best_peer"] = j["best_peer"];
            out["best_peer_tokens_per_s"] = j["best_tokens_per_s"];
            out["vs_best_peer"] = f2 / j["best_tokens_per_s"].get<double>();
        }
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
