// Rank slices of the whole pipeline with real processes, for both sources. Under mpirun each rank
// (rank and world size from Open MPI's environment) runs the pipeline over token shards and over the
// same documents as JSONL tokenized on the fly, in windows and packed mode, and writes its batches to
// DIR/<case>.rank<R>.txt. With --check WORLD a single process runs each case with the whole global
// batch and compares step by step: the ranks' slices, joined in rank order, equal the one-rank batch.
// --prepare DIR writes the corpus, trains its sentencepiece model and packs the shards first.
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <feedline/pipeline.hpp>

namespace {

const std::uint64_t global_batch = 6, steps = 30;

void prepare(const std::string& dir) {
    const char* words[] = {"amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet", "juniper"};
    std::mt19937 rng(7);
    std::ofstream lines(dir + "/docs.txt"), jsonl(dir + "/docs.jsonl");
    std::vector<std::string> docs;
    for (int d = 0; d < 200; ++d) {
        std::string t;
        for (std::uint32_t w = 0, n = 1 + rng() % (d % 9 == 0 ? 120 : 25); w < n; ++w) t += std::string(w ? " " : "") + words[rng() % 10];
        lines << t << "\n";
        jsonl << "{\"text\": \"" << t << "\"}\n";
        docs.push_back(t);
    }
    lines.close();
    jsonl.close();
    auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + dir + "/docs.txt --model_prefix=" + dir +
                                                         "/m --vocab_size=120 --hard_vocab_limit=false --minloglevel=2 --num_threads=1");
    if (!st.ok()) throw std::runtime_error(st.ToString());
    sentencepiece::SentencePieceProcessor spm;
    if (!spm.Load(dir + "/m.model").ok()) throw std::runtime_error("cannot load the model");
    feedline::megatron_writer w(dir + "/shards", feedline::token_dtype::uint16);
    for (const auto& t : docs) {
        std::vector<int> ids;
        if (!spm.Encode(t, &ids).ok()) throw std::runtime_error("cannot encode");
        ids.push_back(spm.eos_id());
        w.add_document(std::vector<std::uint32_t>(ids.begin(), ids.end()));
    }
    w.finish();
}

struct run_case {
    std::string name, spec;
    feedline::sample_mode mode;
};

std::vector<run_case> cases(const std::string& dir) {
    return {{"shards_windows", dir + "/shards", feedline::sample_mode::windows},
            {"shards_packed", dir + "/shards", feedline::sample_mode::packed},
            {"text_windows", dir + "/docs.jsonl", feedline::sample_mode::windows},
            {"text_packed", dir + "/docs.jsonl", feedline::sample_mode::packed}};
}

// Every row of every batch as one line: inputs, targets and, packed, positions.
std::vector<std::string> rows_of(const std::string& dir, const run_case& c, std::uint64_t batch, int rank, int world) {
    feedline::pipeline_config cfg{.batch_size = batch,
                                  .seq_len = 24,
                                  .seed = 5,
                                  .mode = c.mode,
                                  .workers = 2,
                                  .memory_budget = 64 << 20,
                                  .device = feedline::device_kind::cpu,
                                  .rank = rank,
                                  .world_size = world,
                                  .max_steps = steps};
    if (c.name.rfind("text", 0) == 0) cfg.text = {.tokenizer = dir + "/m.model", .cache_dir = dir + "/cache"};
    feedline::pipeline p(c.spec, cfg);
    std::vector<std::string> rows;
    for (auto& b : p)
        for (std::uint64_t r = 0; r < b.size(); ++r) {
            std::string line;
            auto add = [&](std::span<const std::int32_t> s, std::uint64_t n) {
                for (std::uint64_t j = r * n; j < (r + 1) * n; ++j) line += std::to_string(s[j]) + " ";
                line += "| ";
            };
            add(b.host_inputs(), b.seq_len());
            add(b.host_targets(), b.seq_len());
            if (b.packed()) add(b.host_position_ids(), b.seq_len());
            rows.push_back(line);
        }
    return rows;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 2 && args[0] == "--prepare") {
        prepare(args[1]);
        return 0;
    }
    if (args.size() == 3 && args[0] == "--check") {
        const std::string dir = args[1];
        const int world = std::stoi(args[2]);
        const std::uint64_t local = global_batch / static_cast<std::uint64_t>(world);
        for (const auto& c : cases(dir)) {
            const auto whole = rows_of(dir, c, global_batch, 0, 1);
            std::vector<std::vector<std::string>> ranks(static_cast<std::size_t>(world));
            for (int r = 0; r < world; ++r) {
                std::ifstream in(dir + "/" + c.name + ".rank" + std::to_string(r) + ".txt");
                for (std::string l; std::getline(in, l);) ranks[static_cast<std::size_t>(r)].push_back(l);
            }
            for (std::uint64_t step = 0; step < steps; ++step)
                for (int r = 0; r < world; ++r)
                    for (std::uint64_t i = 0; i < local; ++i) {
                        const std::uint64_t row = step * local + i, at = step * global_batch + static_cast<std::uint64_t>(r) * local + i;
                        if (row >= ranks[static_cast<std::size_t>(r)].size() || ranks[static_cast<std::size_t>(r)][row] != whole.at(at)) {
                            std::cerr << c.name << ": step " << step << ", rank " << r << ", row " << i
                                      << " differs from the one-process batch\n";
                            return 1;
                        }
                    }
            std::cout << c.name << ": " << world << " ranks join to the one-process batches, slices disjoint\n";
        }
        return 0;
    }
    if (args.size() != 1) {
        std::cerr << "usage: pipeline_ranks --prepare DIR | pipeline_ranks DIR (under mpirun) | pipeline_ranks --check DIR WORLD\n";
        return 2;
    }
    const feedline::launch_info env = feedline::launch_from_environment();
    for (const auto& c : cases(args[0])) {
        std::ofstream out(args[0] + "/" + c.name + ".rank" + std::to_string(env.rank) + ".txt");
        for (const auto& row : rows_of(args[0], c, global_batch / static_cast<std::uint64_t>(env.world_size), -1, -1)) out << row << "\n";
        if (!out) return 1;
    }
    return 0;
} catch (const std::exception& e) {
    std::cerr << "pipeline_ranks: " << e.what() << "\n";
    return 1;
}
