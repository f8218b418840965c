// trainer/checkpoint.hpp: a training checkpoint is a directory with two files: trainer.json (step,
// model and run shape, and the feedline pipeline's sampler state) and tensors.bin (parameters and
// AdamW moments, fp32, behind a small header). It is written to DIR.partial and renamed into place,
// so a crash while saving leaves the previous checkpoint intact. Loading checks sizes and shapes and
// throws naming the file.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model.hpp"

namespace trainer {

struct checkpoint {
    std::uint64_t step = 0;    // optimizer steps done
    std::uint64_t tokens = 0;  // tokens trained on, all ranks
    model_config model;
    std::uint64_t global_batch = 0, seq_len = 0, grad_accum = 1, seed = 0;
    std::string mode;
    std::string pipeline_state;  // feedline::to_json(pipeline.state())
    std::vector<float> params, m, v;
};

inline nlohmann::json to_json(const model_config& c) {
    return {{"vocab", c.vocab}, {"context", c.context}, {"embed", c.embed}, {"hidden", c.hidden}};
}

class checkpoint_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {
constexpr char tensors_magic[8] = {'F', 'L', 'T', 'R', 'N', 'v', '1', '\0'};
}

inline void save_checkpoint(const std::filesystem::path& dir, const checkpoint& c) {
    namespace fs = std::filesystem;
    const fs::path partial = dir.string() + ".partial", old = dir.string() + ".old";
    fs::remove_all(partial);
    fs::create_directories(partial);
    nlohmann::json j = {{"format", "feedline-train checkpoint"},
                        {"version", 1},
                        {"step", c.step},
                        {"tokens", c.tokens},
                        {"model", to_json(c.model)},
                        {"global_batch", c.global_batch},
                        {"seq_len", c.seq_len},
                        {"grad_accum", c.grad_accum},
                        {"seed", c.seed},
                        {"mode", c.mode},
                        {"pipeline_state", nlohmann::json::parse(c.pipeline_state)}};
    {
        std::ofstream out(partial / "trainer.json");
        out << j.dump(2) << "\n";
        if (!out.flush()) throw checkpoint_error("cannot write " + (partial / "trainer.json").string());
    }
    {
        std::ofstream out(partial / "tensors.bin", std::ios::binary);
        const std::uint64_t n = c.params.size();
        out.write(detail::tensors_magic, sizeof detail::tensors_magic);
        out.write(reinterpret_cast<const char*>(&n), sizeof n);
        for (const auto* t : {&c.params, &c.m, &c.v}) out.write(reinterpret_cast<const char*>(t->data()), std::streamsize(n * sizeof(float)));
        if (!out.flush()) throw checkpoint_error("cannot write " + (partial / "tensors.bin").string());
    }
    fs::remove_all(old);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(partial, dir);
    fs::remove_all(old);
}

inline checkpoint load_checkpoint(const std::filesystem::path& dir) {
    const auto json_path = dir / "trainer.json", tensors_path = dir / "tensors.bin";
    std::ifstream in(json_path);
    if (!in) throw checkpoint_error(json_path.string() + ": cannot open (not a feedline-train checkpoint directory?)");
    checkpoint c;
    try {
        const nlohmann::json j = nlohmann::json::parse(in);
        if (j.at("format") != "feedline-train checkpoint" || j.at("version") != 1)
            throw checkpoint_error(json_path.string() + ": not a version 1 feedline-train checkpoint");
        c.step = j.at("step");
        c.tokens = j.at("tokens");
        const auto& m = j.at("model");
        c.model = {m.at("vocab"), m.at("context"), m.at("embed"), m.at("hidden")};
        c.global_batch = j.at("global_batch");
        c.seq_len = j.at("seq_len");
        c.grad_accum = j.at("grad_accum");
        c.seed = j.at("seed");
        c.mode = j.at("mode");
        c.pipeline_state = j.at("pipeline_state").dump();
    } catch (const nlohmann::json::exception& e) {
        throw checkpoint_error(json_path.string() + ": " + e.what());
    }
    std::ifstream t(tensors_path, std::ios::binary);
    char magic[sizeof detail::tensors_magic] = {};
    std::uint64_t n = 0;
    if (!t.read(magic, sizeof magic) || std::memcmp(magic, detail::tensors_magic, sizeof magic) != 0 || !t.read(reinterpret_cast<char*>(&n), sizeof n))
        throw checkpoint_error(tensors_path.string() + ": missing or bad header at offset 0");
    if (n != c.model.parameter_count())
        throw checkpoint_error(tensors_path.string() + ": holds " + std::to_string(n) + " parameters, the model in trainer.json has " +
                               std::to_string(c.model.parameter_count()));
    std::uint64_t offset = sizeof magic + sizeof n;
    for (auto* v : {&c.params, &c.m, &c.v}) {
        v->resize(n);
        if (!t.read(reinterpret_cast<char*>(v->data()), std::streamsize(n * sizeof(float))))
            throw checkpoint_error(tensors_path.string() + ": truncated at offset " + std::to_string(offset + std::uint64_t(t.gcount())) +
                                   " (expected " + std::to_string(sizeof magic + sizeof n + 3 * n * sizeof(float)) + " bytes)");
        offset += n * sizeof(float);
    }
    return c;
}

}  // namespace trainer
