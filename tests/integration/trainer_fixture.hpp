// A small corpus packed with a sentencepiece model trained on it (train and held-out splits), and a
// way to run feedline-train on it and read its JSON lines. Shared by the trainer's tests.
#pragma once

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "run_command.hpp"

namespace feedline::test {

struct trainer_corpus {
    std::string bin = FEEDLINE_BIN_DIR;
    scratch_dir dir;
    std::string train = dir / "train", eval = dir / "val", model = dir / "train.model";

    trainer_corpus() {
        auto r = run(bin + "/feedline-make-corpus --output " + (dir / "train.jsonl") + " --documents 400 --seed 3", dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        r = run(bin + "/feedline-make-corpus --output " + (dir / "val.jsonl") + " --documents 40 --seed 4", dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        r = run(bin + "/feedline-pack --quiet --append-eos --input " + (dir / "train.jsonl") + " --train-model 300 --output " + train, dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        r = run(bin + "/feedline-pack --quiet --append-eos --input " + (dir / "val.jsonl") + " --model " + model + " --output " + eval,
                dir);
        REQUIRE_MESSAGE(r.code == 0, r.err);
    }

    // A small, fast model; `extra` flags come last and override these.
    std::string train_command(const std::string& extra) const {
        return bin + "/feedline-train --data " + train + " --tokenizer " + model +
               " --json --log-every 1 --eval-every 0 --embed 16 --hidden 32 --batch-size 4 --seq-len 32 --workers 1 " + extra;
    }
};

// The progress lines (those with a "loss") of feedline-train --json output.
inline std::vector<nlohmann::json> progress_lines(const std::string& out) {
    std::vector<nlohmann::json> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
        if (!line.empty() && line[0] == '{') {
            auto j = nlohmann::json::parse(line);
            if (j.contains("loss")) lines.push_back(std::move(j));
        }
    return lines;
}

inline nlohmann::json summary_line(const std::string& out) {
    std::istringstream in(out);
    nlohmann::json last;
    for (std::string line; std::getline(in, line);)
        if (!line.empty() && line[0] == '{') {
            auto j = nlohmann::json::parse(line);
            if (j.contains("summary")) last = std::move(j);
        }
    return last;
}

}  // namespace feedline::test
