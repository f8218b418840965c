// feedline-make-corpus: writes a synthetic English-like corpus as JSONL, deterministic for a seed.
// The text comes from a small stochastic grammar (subjects, verbs, objects, clauses), so it has real
// structure a language model can learn: the demo's loss falls well below the unigram entropy.
#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

using words = std::vector<std::string>;
const words determiners = {"the", "a", "every", "this", "that", "one", "some", "no"};
const words adjectives = {"small", "old",    "quiet",  "bright", "heavy", "curious", "patient", "red",   "distant", "careful",
                          "young", "broken", "gentle", "sharp",  "warm",  "cold",    "busy",    "tired", "clever",  "strange"};
const words nouns = {"farmer",   "river",  "engine", "teacher", "garden",  "machine", "child", "city",    "bird",   "letter",
                     "mountain", "doctor", "window", "market",  "student", "forest",  "ship",  "painter", "lamp",   "road",
                     "village",  "storm",  "clock",  "baker",   "bridge",  "library", "horse", "train",   "island", "singer"};
const words verbs = {"sees",    "builds", "follows",   "finds",  "carries", "watches", "repairs", "visits", "paints", "hears",
                     "crosses", "opens",  "remembers", "counts", "feeds",   "reads",   "writes",  "leaves", "greets", "moves"};
const words adverbs = {"slowly", "quickly", "often", "never", "always", "carefully", "quietly", "again", "today", "early"};
const words places = {"near the river",    "in the old city",    "behind the market", "under the bridge", "at the station",
                      "across the valley", "inside the library", "by the sea",        "on the hill",      "beyond the forest"};
const words connectives = {"because", "while", "although", "after", "before", "when", "until", "since"};

template <class R>
const std::string& pick(R& rng, const words& w) {
    // Zipf-like: earlier words are more frequent, as in natural text.
    std::uniform_real_distribution<double> u(0.0, 1.0);
    double x = u(rng);
    auto i = static_cast<std::size_t>(static_cast<double>(w.size()) * x * x);
    return w[std::min(i, w.size() - 1)];
}

template <class R>
std::string noun_phrase(R& rng) {
    std::string s = pick(rng, determiners);
    if (rng() % 2) s += " " + pick(rng, adjectives);
    return s + " " + pick(rng, nouns);
}

template <class R>
std::string clause(R& rng) {
    std::string s = noun_phrase(rng);
    if (rng() % 3 == 0) s += " " + pick(rng, adverbs);
    s += " " + pick(rng, verbs) + " " + noun_phrase(rng);
    if (rng() % 3 == 0) s += " " + pick(rng, places);
    return s;
}

template <class R>
std::string sentence(R& rng) {
    std::string s = clause(rng);
    if (rng() % 3 == 0) s += " " + pick(rng, connectives) + " " + clause(rng);
    s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return s + ".";
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Write a synthetic English-like corpus as JSONL ({\"text\": ...} per line)"};
    std::string output;
    std::uint64_t documents = 20000, seed = 1;
    app.add_option("--output", output, "JSONL file to write")->required();
    app.add_option("--documents", documents, "number of documents")->capture_default_str();
    app.add_option("--seed", seed, "random seed (same seed, same corpus)")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    std::mt19937_64 rng(seed);
    std::ofstream out(output);
    if (!out) {
        fmt::print(stderr, "error: cannot create {}\n", output);
        return 1;
    }
    std::uint64_t bytes = 0;
    for (std::uint64_t d = 0; d < documents; ++d) {
        std::string text;
        auto n = 2 + rng() % 10;
        for (std::uint64_t i = 0; i < n; ++i) text += (i ? " " : "") + sentence(rng);
        std::string line = nlohmann::json{{"text", text}}.dump() + "\n";
        out << line;
        bytes += line.size();
    }
    out.close();
    if (!out) {
        fmt::print(stderr, "error: writing {} failed\n", output);
        return 1;
    }
    fmt::print("wrote {} documents ({:.1f} MB) to {}\n", documents, static_cast<double>(bytes) / 1e6, output);
    return 0;
}
