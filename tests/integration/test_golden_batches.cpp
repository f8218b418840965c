// Batches of token shards stay bit-identical across refactors: for Megatron and llm.c shards, windows
// and packed modes, every shuffle mode, tail drop and pad, and 1 or 2 ranks, the checksum of every
// batch (inputs, targets and, packed, positions, cu_seqlens and piece counts) equals the one recorded
// in tests/data/golden_batches.txt, and a state saved then (kept there as JSON) restores into a new
// pipeline that continues with the recorded batches. The data was written by the code before the
// one-engine redesign (FEEDLINE_WRITE_GOLDEN=path rewrites it; only do that for an intended change).
#include <doctest/doctest.h>

#include <feedline/pipeline.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Shards of documents 0..149 tokens long (a few empty, some longer than a row), uint16, tokens from
// a fixed generator: std::mt19937's output is fixed by the standard, unlike its distributions.
std::vector<std::vector<std::uint32_t>> golden_documents(int shard) {
    std::mt19937 rng(101 + shard);
    std::vector<std::vector<std::uint32_t>> docs(40);
    for (auto& d : docs) {
        d.resize(rng() % 150);
        for (auto& t : d) t = 1 + rng() % 60000;
    }
    return docs;
}

std::string write_shards(const ft::scratch_dir& dir, const std::string& format) {
    if (format == "megatron") {
        for (int s = 0; s < 3; ++s) {
            megatron_writer w(dir / ("mg_" + std::to_string(s)), token_dtype::uint16);
            for (const auto& d : golden_documents(s)) w.add_document(std::span<const std::uint32_t>(d));
            w.finish();
        }
        return dir / "mg_*.bin";
    }
    llmc_writer w(dir / "lc", token_dtype::uint16, 0, 2500);  // documents run on into the next shard
    for (int s = 0; s < 3; ++s)
        for (const auto& d : golden_documents(s)) w.add_document(std::span<const std::uint32_t>(d));
    w.finish();
    return dir / "lc_*.bin";
}

std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
template <class T>
std::uint64_t fnv1a(std::uint64_t h, std::span<const T> s) {
    return fnv1a(h, s.data(), s.size_bytes());
}

// Checksum of batches until the pipeline ends (max_steps).
std::uint64_t checksum(pipeline& p) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (auto& b : p) {
        const std::uint64_t step = b.step();
        h = fnv1a(h, &step, sizeof step);
        h = fnv1a(h, b.host_inputs());
        h = fnv1a(h, b.host_targets());
        h = fnv1a(h, b.host_position_ids());
        h = fnv1a(h, b.host_cu_seqlens());
        h = fnv1a(h, b.host_pieces());
    }
    return h;
}

struct golden_case {
    std::string format, mode, shuffle, tail;
    int world = 1, rank = 0;
    std::string key() const {
        return format + "/" + mode + "/" + shuffle + "/" + tail + "/w" + std::to_string(world) + "r" + std::to_string(rank);
    }
};

std::vector<golden_case> golden_cases() {
    std::vector<golden_case> out;
    for (const char* format : {"megatron", "llmc"})
        for (const char* mode : {"windows", "packed"})
            for (const char* shuffle : {"global", "shard_blocks", "none"})
                for (const char* tail : {"drop", "pad"})
                    for (int world : {1, 2})
                        for (int rank = 0; rank < world; ++rank) out.push_back({format, mode, shuffle, tail, world, rank});
    return out;
}

constexpr std::uint64_t golden_steps = 160;  // three epochs or more: epoch edges and tails (no case divides evenly) show
constexpr std::uint64_t golden_saved_at = 77;

pipeline_config golden_config(const golden_case& c, std::uint64_t steps) {
    pipeline_config cfg{.batch_size = 5,
                        .seq_len = 37,
                        .seed = 17,
                        .workers = 2,
                        .memory_budget = 64 << 20,
                        .device = device_kind::cpu,
                        .rank = c.rank,
                        .world_size = c.world,
                        .max_steps = steps};
    cfg.mode = c.mode == "packed" ? sample_mode::packed : sample_mode::windows;
    cfg.shuffle = c.shuffle == "global" ? shuffle_mode::global : c.shuffle == "none" ? shuffle_mode::none : shuffle_mode::shard_blocks;
    cfg.tail = c.tail == "pad" ? tail_policy::pad : tail_policy::drop;
    return cfg;
}

std::string hex(std::uint64_t v) {
    std::ostringstream s;
    s << std::hex << v;
    return s.str();
}

struct golden_line {
    std::string all, rest, state;
};

std::map<std::string, golden_line> read_golden(const std::string& path) {
    std::ifstream in(path);
    std::map<std::string, golden_line> out;
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        std::string key;
        golden_line g;
        fields >> key >> g.all >> g.rest >> g.state;
        out[key] = g;
    }
    return out;
}

}  // namespace

TEST_CASE("Golden.Shards.BatchesAndSavedStatesMatchTheRecordedOnes") {
    ft::scratch_dir dir;
    const std::map<std::string, std::string> specs = {{"megatron", write_shards(dir, "megatron")}, {"llmc", write_shards(dir, "llmc")}};
    const char* write_to = std::getenv("FEEDLINE_WRITE_GOLDEN");
    const std::string data = std::string(FEEDLINE_SOURCE_DIR) + "/tests/data/golden_batches.txt";
    const auto golden = write_to ? std::map<std::string, golden_line>{} : read_golden(data);
    if (!write_to) REQUIRE(golden.size() == golden_cases().size());
    std::ostringstream written;
    written << "# case  checksum(batches 0.." << golden_steps - 1 << ")  checksum(batches " << golden_saved_at << "..)  state after batch "
            << golden_saved_at - 1 << " (JSON)\n";
    for (const golden_case& c : golden_cases()) {
        CAPTURE(c.key());
        const std::uint64_t steps = golden_steps / static_cast<std::uint64_t>(c.world);
        pipeline whole(specs.at(c.format), golden_config(c, steps));
        const std::uint64_t all = checksum(whole);
        pipeline first(specs.at(c.format), golden_config(c, golden_saved_at));
        (void)checksum(first);
        const std::string saved = to_json(first.state());
        if (write_to) {
            pipeline rest(specs.at(c.format), golden_config(c, steps));
            rest.restore(pipeline_state_from_json(saved));
            auto recorded = nlohmann::json::parse(saved);  // as the file holds states: without the checksum (read below)
            recorded.erase("check");
            written << c.key() << ' ' << hex(all) << ' ' << hex(checksum(rest)) << ' ' << recorded.dump() << '\n';
            continue;
        }
        const golden_line& g = golden.at(c.key());
        CHECK(hex(all) == g.all);
        // The same state, field for field (the golden states predate the state's checksum).
        auto saved_fields = nlohmann::json::parse(saved);
        CHECK(saved_fields.contains("check"));
        saved_fields.erase("check");
        CHECK(saved_fields == nlohmann::json::parse(g.state));
        // The state recorded before the redesign restores and continues with the recorded batches.
        pipeline rest(specs.at(c.format), golden_config(c, steps));
        rest.restore(pipeline_state_from_json(g.state));
        CHECK(hex(checksum(rest)) == g.rest);
    }
    if (write_to) std::ofstream(write_to) << written.str();
}
