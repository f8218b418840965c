// bench_mixture: a mixture of many domains against a blend of two, the same data in all.
//
// The same total of tokens (--tokens, uint16, page cache warm) split into D domains of --shards shards
// each (default 1; a window may run on into a domain's next shard): llm.c shards, or with --format
// megatron Megatron pairs (.bin and .idx, documents of 1-1,000 tokens), for every D of
// --domains (default 2,100,1000,10000), each with a mixture file of random
// weights over two stages (a switch at a third of the run, with a ramp). Each D runs in a child process
// of its own (memory and descriptors are per process), rounds alternated over the Ds; per D:
//   open_s          the pipeline's constructor (opening every domain, the schedule, the sampler)
//   first_batch_s   from there to the first batch
//   anon_bytes_per_domain  anonymous memory after the first batch, beyond the process before it opened
//                   anything, per domain (mapped file pages are the page cache's, not counted)
//   anon_end_bytes_per_domain  the same after the last batch: what the run grew as it met the
//                   domains (each worker's writers, the descriptor pool's list)
//   marginal_bytes_per_domain  (in the summary, for each D past the smallest measured) the anonymous
//                   memory after the first batch that D domains took beyond the smallest D's, per domain
//                   more: what a domain costs, without what a pipeline holds whatever its domains (the
//                   ring's slots, each worker's scratch: about 1.1 MB, 110 bytes a domain at 10,000)
//   descriptors     file descriptors open after the first batch
//   tokens_per_s    from the first batch to the last of --batches
//   vs_blend2       tokens_per_s against a plain blend of the 2-domain case's two shards (fixed
//                   weights, Megatron's rule) in the same round: the baseline
//   late_tokens_per_s, late_vs_blend2  the same over the second half of the batches: the stream once
//                   it has met most files (a run's first half maps each of 10,000 domains' files as it
//                   comes to it, a few microseconds each, which a longer run spreads thinner)
//   plan_ns_per_sample  the same datasets and schedule planned alone on one thread (a sampler of its
//                   own, --batches steps): drawing each sample's domain and position, and its segments
//   draw_ns_per_sample  of that, the drawing alone (sampler::next_drawn): the serial part, which the
//                   workers wait for behind one lock (they plan the segments beside each other)
//   worst_draw_step_us  the slowest step of as many steps drawn after those, each timed: how long the
//                   other workers can be held up at once
//   draw_ns_part0, 1, 2  drawing alone again, from step 0, over each part of the schedule: the first
//                   stage, the ramp, the last stage (for as many steps as the first); the figures above
//                   start a tenth of the way in and draw mostly in the last stage
//   plan_us_per_batch, slot_wait_us_per_batch  the pipeline's own stats over the run, microseconds a
//                   batch summed over the workers: planning (the wait for the shared planner's lock
//                   included) and waiting for a free slot (the consumer behind)
//   late_workers_cpu, late_consumer_cpu  CPUs kept busy over the second half by the workers (spinning
//                   included) and by the consumer (this thread): a rate below the workers' CPU says waits
//   unmapped_files  files read with pread at the end, for want of a mapping (--max-mappings)
// and, once per D, whether it runs under `ulimit -n 256` (RLIMIT_NOFILE 256 in the child). With
// --max-mappings N every run may map at most N files (detail/mapping_budget.hpp: what vm.max_map_count
// allows a process), and the rest are read with pread: the cost of a mixture past the kernel's limit.
// Last line: one JSON object with every D's medians.
//
//   build/release/bin/bench_mixture --dir /tmp/mixbench --tokens 40000000
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <feedline/exec/host_memory.hpp>
#include <feedline/pipeline.hpp>

#include "bench_common.hpp"

using namespace feedline;
using namespace feedline::bench;
namespace fs = std::filesystem;

namespace {

// D domains of `shards` shards each (llm.c shards, or Megatron pairs: `megatron`), tokens / D tokens
// a domain, and mix.json: random weights 1-100, then at a third of `steps` a ramp of steps / 10 to
// other random weights (a tenth of them 0). The shards are kept for later runs (mix.json, written
// after them, says they are whole); mix.json is written again for every run, its stages placed for
// this run's steps (the weights are the same).
std::string make_mixture(const std::string& root, std::uint64_t domains, std::uint64_t shards, std::uint64_t tokens, std::uint64_t steps,
                         bool megatron) {
    const std::string dir =
        root + "/d" + std::to_string(domains) + (shards > 1 ? "s" + std::to_string(shards) : "") + (megatron ? "m" : "");
    const std::string mix = dir + "/mix.json";
    const bool have_data = fs::exists(mix);
    fs::create_directories(dir);
    std::mt19937_64 rng(domains), weights(domains + 0x9e3779b97f4a7c15ull);
    const std::uint64_t per = tokens / domains / shards;
    nlohmann::json doms = nlohmann::json::array(), first = nlohmann::json::object(), second = nlohmann::json::object();
    std::vector<std::uint16_t> body(per);
    for (std::uint64_t d = 0; d < domains; ++d) {
        const std::string name = "d" + std::to_string(d);
        for (std::uint64_t k = 0; k < shards && !have_data; ++k) {
            const std::string file = shards > 1 ? name + "_" + std::to_string(k) + ".bin" : name + ".bin";
            for (auto& t : body) t = static_cast<std::uint16_t>(rng() % 50000);
            if (megatron) {  // documents of 1-1,000 tokens: a 256-token window crosses one or two
                megatron_writer w(dir + "/" + file.substr(0, file.size() - 4), token_dtype::uint16);
                for (std::uint64_t at = 0; at < per;) {
                    const std::uint64_t n = std::min<std::uint64_t>(per - at, 1 + rng() % 1000);
                    w.add_document(std::span<const std::uint16_t>(body.data() + at, n));
                    at += n;
                }
                w.finish();
                continue;
            }
            std::int32_t header[256] = {20240520, 1, static_cast<std::int32_t>(per)};
            std::ofstream out(dir + "/" + file, std::ios::binary);
            out.write(reinterpret_cast<const char*>(header), sizeof header);
            out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size() * 2));
            if (!out) throw io_error(dir + "/" + file, errno, "cannot write");
        }
        nlohmann::json data = shards > 1 ? name + "_*.bin" : name + ".bin";  // a glob: its shards in order
        if (megatron) {                                                       // prefixes
            data = nlohmann::json::array();
            for (std::uint64_t k = 0; k < shards; ++k) data.push_back(shards > 1 ? name + "_" + std::to_string(k) : name);
            if (shards == 1) data = data[0];
        }
        doms.push_back({{"name", name}, {"data", data}});
        first[name] = 1 + weights() % 100;
        second[name] = weights() % 10 == 0 ? 0 : 1 + weights() % 100;
    }
    if (domains > 1) second["d0"] = 1;  // never all 0
    const nlohmann::json j{
        {"domains", doms},
        {"stages", {{{"at_step", 0}, {"weights", first}}, {{"at_step", steps / 3}, {"ramp_steps", steps / 10}, {"weights", second}}}}};
    std::ofstream(mix + ".new") << j.dump();
    fs::rename(mix + ".new", mix);
    return mix;
}

std::uint64_t open_descriptors_now() {
    std::uint64_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
}

// Planning alone, on one thread, step after step, as the pipeline's shared planner does it: ns per
// sample, over the same datasets and schedule as the pipeline `p` (its sources, the mixture file `spec`
// names). `plan`: whole steps (next); `draw`: their sequential half alone (next_drawn), the part of a
// blend's or mixture's run that does not spread over the workers.
struct planning_ns {
    double plan = 0, draw = 0, worst_draw_step_us = 0;
    std::vector<double> draw_by_part;  // a mixture's: each stage's ramp and constant part, the last for steps / 3
};
planning_ns planning_ns_per_sample(const pipeline& p, const std::string& spec, std::uint64_t steps) {
    const pipeline_config& c = p.config();
    std::vector<sampler_dataset> datasets;
    std::vector<double> weights;
    const auto sampling = [&] {
        datasets.clear();
        for (const auto& s : p.sources()) datasets.push_back(s.source->sampling(source_context::of(c)));
    };
    sampling();
    for (const auto& s : p.sources()) weights.push_back(s.weight);
    const sampler_config sc{.seq_len = c.seq_len,
                            .global_batch = c.batch_size,
                            .seed = c.seed,
                            .mode = c.mode,
                            .shuffle = c.shuffle,
                            .tail = c.tail,
                            .rank = 0,
                            .world_size = 1};
    const auto mixture = read_mixture_spec(parse_data_spec(spec), c.batch_size * c.seq_len);
    sampler planner = mixture ? sampler(std::move(datasets), mixture->schedule, sc) : sampler(std::move(datasets), weights, sc);
    batch_plan b;
    sampler_step_delta delta;
    for (std::uint64_t k = 0; k < steps / 10; ++k) planner.next(b);  // warm: every domain's first epoch laid out
    const double samples = static_cast<double>(steps * c.batch_size);
    auto t0 = clock_type::now();
    for (std::uint64_t k = 0; k < steps; ++k) planner.next(b);
    planning_ns r{.plan = seconds_since(t0) * 1e9 / samples};
    t0 = clock_type::now();
    for (std::uint64_t k = 0; k < steps; ++k) planner.next_drawn(b, delta);
    r.draw = seconds_since(t0) * 1e9 / samples;
    // The slowest step drawn over as many steps again, each timed: a stall here holds every worker.
    for (std::uint64_t k = 0; k < steps; ++k) {
        const auto t = clock_type::now();
        planner.next_drawn(b, delta);
        r.worst_draw_step_us = std::max(r.worst_draw_step_us, seconds_since(t) * 1e6);
    }
    // Drawing alone again from step 0 on a sampler of its own, timed over each part of the schedule: a
    // stage's ramp, its constant part (the last as long as a third of the run). The figures above
    // start a tenth of the way in and draw mostly in the last stage.
    if (mixture) {
        const mixture_schedule& S = *mixture->schedule;
        std::vector<std::uint64_t> cuts{0};
        for (std::size_t k = 1; k < S.stages(); ++k) {
            cuts.push_back(S.stage_step(k));
            if (S.stage_ramp(k) > 0) cuts.push_back(S.stage_step(k) + S.stage_ramp(k));
        }
        cuts.push_back(cuts.back() + std::max<std::uint64_t>(steps / 3, 1));
        sampling();
        sampler drawer(std::move(datasets), mixture->schedule, sc);
        for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
            const auto t = clock_type::now();
            for (std::uint64_t k = cuts[i]; k < cuts[i + 1]; ++k) drawer.next_drawn(b, delta);
            r.draw_by_part.push_back(seconds_since(t) * 1e9 / static_cast<double>((cuts[i + 1] - cuts[i]) * c.batch_size));
        }
    }
    return r;
}

// One measurement in this process: prints one JSON line.
int measure(const std::string& mix, std::uint64_t batch, std::uint64_t seq_len, std::uint64_t batches, unsigned workers,
            std::uint64_t max_mappings) {
    if (max_mappings) detail::mapping_budget::instance().set_limit(detail::mapping_budget::instance().held() + max_mappings);
    const auto before = read_process_memory().rss_anon.value_or(0);
    const auto t0 = clock_type::now();
    pipeline p(mix,
               {.batch_size = batch, .seq_len = seq_len, .seed = 1, .workers = workers, .device = device_kind::cpu, .max_steps = batches});
    const double open_s = seconds_since(t0);
    const auto t1 = clock_type::now();
    std::uint64_t n = 0, sink = 0;
    clock_type::time_point first;
    clock_type::time_point half;
    std::uint64_t anon = 0, fds = 0;
    const std::uint64_t half_at = std::max<std::uint64_t>(batches / 2, 1);
    // CPU seconds of the process and of this thread (the consumer): over the second half, the
    // workers' CPU per second of it says whether they ran the whole time or waited.
    const auto cpu_now = [] {
        timespec proc{}, self{};
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &proc);
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &self);
        return std::pair<double, double>{proc.tv_sec + proc.tv_nsec * 1e-9, self.tv_sec + self.tv_nsec * 1e-9};
    };
    std::pair<double, double> half_cpu{};
    for (auto& b : p) {
        if (n == 0) {
            first = clock_type::now();
            anon = read_process_memory().rss_anon.value_or(0);
            fds = open_descriptors_now();
        }
        if (n == half_at) {
            half = clock_type::now();
            half_cpu = cpu_now();
        }
        ++n;
        sink += static_cast<std::uint64_t>(b.host_inputs()[0]);
    }
    const auto end_cpu = cpu_now();
    const double late_s = n > half_at + 1 ? seconds_since(half) : 0;  // no second half: the CPU figures say 0
    const std::uint64_t unmapped = detail::mapping_budget::instance().unmapped();
    const double late_consumer_cpu = late_s > 0 ? (end_cpu.second - half_cpu.second) / late_s : 0,
                 late_workers_cpu = late_s > 0 ? (end_cpu.first - half_cpu.first) / late_s - late_consumer_cpu : 0;
    const auto anon_end = read_process_memory().rss_anon.value_or(0);
    // Where the workers' time went, per batch (summed over workers): planning (with the wait for the
    // shared planner) and waiting for a free slot; a run whose tokens/s trails its CPU time waits.
    const pipeline_stats st = p.stats();
    const double per_batch_us = 1e6 / static_cast<double>(std::max<std::uint64_t>(st.batches, 1));
    const double first_s = std::chrono::duration<double>(first - t1).count();
    const double rate = static_cast<double>((n - 1) * batch * seq_len) / seconds_since(first);
    const double late_rate = n > half_at + 1 ? static_cast<double>((n - 1 - half_at) * batch * seq_len) / seconds_since(half) : rate;
    const auto domains = p.sources().size();
    const planning_ns planning = planning_ns_per_sample(p, mix, batches);
    std::printf(
        "{\"open_s\": %.6f, \"first_batch_s\": %.6f, \"anon_bytes_per_domain\": %.1f, \"anon_end_bytes_per_domain\": %.1f, "
        "\"descriptors\": %llu, \"tokens_per_s\": %.0f, \"late_tokens_per_s\": %.0f, \"plan_ns_per_sample\": %.1f, \"draw_ns_per_sample\": "
        "%.1f, \"worst_draw_step_us\": %.1f, \"plan_us_per_batch\": %.2f, \"slot_wait_us_per_batch\": %.2f, "
        "\"late_workers_cpu\": %.2f, \"late_consumer_cpu\": %.2f, \"domains\": %zu, \"draw_ns_by_part\": %s, "
        "\"unmapped_files\": %llu, \"anon_bytes\": %.0f, \"sink\": %llu}\n",
        open_s, first_s, (static_cast<double>(anon) - static_cast<double>(before)) / static_cast<double>(domains),
        (static_cast<double>(anon_end) - static_cast<double>(before)) / static_cast<double>(domains), static_cast<unsigned long long>(fds),
        rate, late_rate, planning.plan, planning.draw, planning.worst_draw_step_us, st.plan_s * per_batch_us, st.slot_wait_s * per_batch_us,
        late_workers_cpu, late_consumer_cpu, domains, nlohmann::json(planning.draw_by_part).dump().c_str(),
        static_cast<unsigned long long>(unmapped), static_cast<double>(anon) - static_cast<double>(before),
        static_cast<unsigned long long>(sink));
    return 0;
}

// Runs this program with --one in a child (RLIMIT_NOFILE `nofile` when given) and returns its JSON
// line, or the error it printed.
nlohmann::json child(const std::string& self, const std::vector<std::string>& args, rlim_t nofile) {
    int pipefd[2];
    if (::pipe(pipefd) != 0) throw io_error("pipe", errno, "cannot create");
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(pipefd[1], 1);
        ::dup2(pipefd[1], 2);
        ::close(pipefd[0]);
        if (nofile) {
            rlimit r{nofile, nofile};
            ::setrlimit(RLIMIT_NOFILE, &r);
        }
        std::vector<char*> argv{const_cast<char*>(self.c_str())};
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(self.c_str(), argv.data());
        ::_exit(127);
    }
    ::close(pipefd[1]);
    std::string out;
    char buf[4096];
    for (ssize_t k; (k = ::read(pipefd[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(k));
    ::close(pipefd[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const auto line = out.rfind('{');
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && line != std::string::npos) return nlohmann::json::parse(out.substr(line));
    return {{"error", out.empty() ? "exit status " + std::to_string(status) : out.substr(0, out.find('\n'))}};
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"A mixture of many domains against a blend of two, the same data in all"};
    std::string dir = "/tmp/feedline-bench-mixture", one, format = "llmc";
    std::vector<std::uint64_t> domains{2, 100, 1000, 10000};
    std::uint64_t tokens = 40'000'000, batch = 32, seq_len = 256, batches = 3000, shards = 1, max_mappings = 0;
    unsigned workers = 2;
    int rounds = 3;
    app.add_option("--dir", dir, "where the domains' shards are written (kept: later runs reuse them)");
    app.add_option("--domains", domains, "domain counts to measure (and always the 2-domain data as a plain blend, the baseline)")
        ->delimiter(',');
    app.add_option("--tokens", tokens, "tokens in all, split evenly over the domains");
    app.add_option("--batch", batch, "samples per batch");
    app.add_option("--seq-len", seq_len, "tokens per sample");
    app.add_option("--batches", batches, "batches per measurement");
    app.add_option("--shards", shards, "shards (llm.c files or Megatron pairs) per domain (the blend's two domains keep one each)")->check(CLI::Range(1, 1000));
    app.add_option("--format", format, "the domains' shards: llm.c shards, or Megatron pairs (documents of 1-1,000 tokens)")
        ->check(CLI::IsMember({"llmc", "megatron"}));
    app.add_option("--workers", workers, "worker threads");
    app.add_option("--rounds", rounds, "rounds, alternating the domain counts");
    app.add_option("--max-mappings", max_mappings, "files each run may map (0: what vm.max_map_count allows); the rest are read with pread");
    app.add_option("--one", one, "internal: measure this mixture file in this process and print one JSON line");
    CLI11_PARSE(app, argc, argv);
    if (!one.empty()) {
        try {
            return measure(one, batch, seq_len, batches, workers, max_mappings);
        } catch (const std::exception& e) {
            std::printf("%s\n", e.what());
            return 1;
        }
    }

    const std::string self = fs::canonical("/proc/self/exe").string();
    std::map<std::uint64_t, std::string> files;
    const bool megatron = format == "megatron";
    for (std::uint64_t d : domains) files[d] = make_mixture(dir, d, shards, tokens, batches, megatron);
    // The baseline: the 2-domain data as a plain blend (0 stands for it below), in the same format.
    const std::string two = make_mixture(dir, 2, 1, tokens, batches, megatron);  // two shards, whatever --shards
    const std::string at = fs::path(two).parent_path().string(), ext = megatron ? "" : ".bin";
    const std::string blend2 = "1 " + at + "/d0" + ext + " 1 " + at + "/d1" + ext;
    auto args = [&](std::uint64_t d) {
        return std::vector<std::string>{"--one",     d == 0 ? blend2 : files[d], "--batch",   std::to_string(batch),
                                        "--seq-len", std::to_string(seq_len),    "--batches", std::to_string(batches),
                                        "--workers", std::to_string(workers),    "--max-mappings", std::to_string(max_mappings)};
    };
    domains.insert(domains.begin(), 0);
    // Warm the page cache: one untimed run of each.
    for (std::uint64_t d : domains) (void)child(self, args(d), 0);
    std::map<std::uint64_t, std::map<std::string, std::vector<double>>> samples;
    for (int r = 0; r < rounds; ++r) {
        double base = 0, late_base = 0;
        for (std::uint64_t d : domains) {
            const nlohmann::json j = child(self, args(d), 0);
            if (j.contains("error")) {
                std::printf("%s: %s\n", d == 0 ? "blend2" : (std::to_string(d) + " domains").c_str(),
                            j["error"].get<std::string>().c_str());
                continue;
            }
            for (const char* k : {"open_s", "first_batch_s", "anon_bytes_per_domain", "anon_end_bytes_per_domain", "descriptors",
                                  "tokens_per_s", "late_tokens_per_s", "plan_ns_per_sample", "draw_ns_per_sample", "worst_draw_step_us",
                                  "plan_us_per_batch", "slot_wait_us_per_batch", "late_workers_cpu", "late_consumer_cpu", "unmapped_files", "anon_bytes"})
                samples[d][k].push_back(j[k].get<double>());
            for (std::size_t i = 0; i < j["draw_ns_by_part"].size(); ++i)
                samples[d]["draw_ns_part" + std::to_string(i)].push_back(j["draw_ns_by_part"][i].get<double>());
            if (d == 0) base = j["tokens_per_s"].get<double>(), late_base = j["late_tokens_per_s"].get<double>();
            if (base > 0) samples[d]["vs_blend2"].push_back(j["tokens_per_s"].get<double>() / base);
            if (late_base > 0) samples[d]["late_vs_blend2"].push_back(j["late_tokens_per_s"].get<double>() / late_base);
        }
    }
    nlohmann::json out = nlohmann::json::object();
    std::printf("%8s %10s %14s %16s %14s %12s %14s %10s %14s %10s %14s %14s %12s  %s\n", "domains", "open_s", "first_batch_s",
                "anon B/domain", "at end", "descriptors", "tokens/s", "vs blend2", "late tokens/s", "late vs", "plan ns/sample",
                "draw ns/sample", "worst step", "ulimit -n 256");
    for (std::uint64_t d : domains) {
        const nlohmann::json limited = child(self, args(d), 256);
        const bool ok = !limited.contains("error");
        nlohmann::json row{{"runs_under_ulimit_256", ok}};
        if (!ok) row["ulimit_256_error"] = limited["error"];
        for (auto& [k, v] : samples[d]) row[k] = summarise(v).median;
        auto get = [&](const char* k) { return row.contains(k) ? row[k].get<double>() : 0.0; };
        std::printf("%8s %10.3f %14.4f %16.0f %14.0f %12.0f %14.4g %10.3f %14.4g %10.3f %14.0f %14.0f %9.0f us  %s\n",
                    (d == 0 ? std::string("blend2") : std::to_string(d)).c_str(), get("open_s"), get("first_batch_s"),
                    get("anon_bytes_per_domain"), get("anon_end_bytes_per_domain"), get("descriptors"), get("tokens_per_s"),
                    get("vs_blend2"), get("late_tokens_per_s"), get("late_vs_blend2"), get("plan_ns_per_sample"), get("draw_ns_per_sample"),
                    get("worst_draw_step_us"), ok ? "runs" : row["ulimit_256_error"].get<std::string>().c_str());
        out[d == 0 ? std::string("blend2") : std::to_string(d)] = row;
    }
    // What each domain past the smallest count costs: the fixed part (ring, scratch) cancels.
    std::uint64_t smallest = 0;
    for (std::uint64_t d : domains)
        if (d != 0 && samples[d].count("anon_bytes") && (smallest == 0 || d < smallest)) smallest = d;
    if (smallest != 0) {
        std::printf("marginal anonymous memory per domain, beyond %llu domains':", static_cast<unsigned long long>(smallest));
        for (std::uint64_t d : domains) {
            if (d <= smallest || !samples[d].count("anon_bytes")) continue;
            auto& row = out[std::to_string(d)];
            const double marginal = (row["anon_bytes"].get<double>() - out[std::to_string(smallest)]["anon_bytes"].get<double>()) /
                                    static_cast<double>(d - smallest);
            row["marginal_bytes_per_domain"] = marginal;
            std::printf("  %llu domains %.0f B", static_cast<unsigned long long>(d), marginal);
        }
        std::printf("\n");
    }
    std::printf("draw ns/sample by part of the schedule (first stage, ramp, last stage):");
    for (std::uint64_t d : domains) {
        if (d == 0) continue;
        std::printf("  %llu domains:", static_cast<unsigned long long>(d));
        const auto& row = out[std::to_string(d)];
        for (int i = 0; row.contains("draw_ns_part" + std::to_string(i)); ++i)
            std::printf(" %.0f", row["draw_ns_part" + std::to_string(i)].get<double>());
    }
    std::printf("\n");
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
