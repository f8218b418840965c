// feedline-inspect: validates a token dataset of any supported format and summarises it.
// --json prints the summary as one JSON object; --dump-tokens writes every token of every document,
// in dataset order, as little-endian uint32 to stdout, so any two readers can be compared byte for byte.
// Exit code 1 with the error (file and byte offset) on bad input.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <limits>
#include <unistd.h>

#include <feedline/pipeline.hpp>

int main(int argc, char** argv) {
    CLI::App app{"Validate and summarise a feedline token dataset (Megatron .bin/.idx or llm.c shards)"};
    std::vector<std::string> paths;
    bool json = false, dump = false, deep = false;
    std::string backend = "auto";
    std::int64_t delimiter = -1;
    app.add_option("paths", paths, "Megatron prefixes, llm.c shards, directories or globs")->required();
    app.add_flag("--json", json, "print the summary as one JSON object");
    app.add_flag("--dump-tokens", dump, "write every token as little-endian uint32 to stdout (no summary)");
    app.add_flag("--deep", deep, "also read every token through the storage backend");
    app.add_option("--backend", backend, "storage backend for reading tokens: auto, io_uring, mmap, pread")->capture_default_str();
    app.add_option("--delimiter", delimiter, "llm.c document delimiter token (default: from the shard header)");
    CLI11_PARSE(app, argc, argv);

    try {
        feedline::token_dataset ds(paths);
        if (delimiter >= 0) ds.set_delimiter(static_cast<std::uint32_t>(delimiter));
        const std::uint64_t docs = ds.document_count();
        std::uint64_t smallest = docs ? std::numeric_limits<std::uint64_t>::max() : 0, largest = 0;
        for (std::uint64_t d = 0; d < docs; ++d) {
            auto len = ds.document(d).length;
            smallest = std::min(smallest, len);
            largest = std::max(largest, len);
        }
        if (dump || deep) {
            auto reader = feedline::make_reader({.backend = feedline::parse_io_backend(backend),
                                                 .pattern = feedline::access_pattern::sequential});
            std::vector<std::uint32_t> tokens;
            for (std::uint64_t d = 0; d < docs; ++d) {
                auto span = ds.document(d);
                // Large documents are read in pieces so memory stays bounded.
                for (std::uint64_t first = 0; first < span.length; first += 1u << 20) {
                    std::uint64_t n = std::min<std::uint64_t>(1u << 20, span.length - first);
                    tokens.resize(n);
                    ds.read_tokens(reader, span, first, n, tokens.data());
                    if (dump && std::fwrite(tokens.data(), 4, n, stdout) != n) {
                        fmt::print(stderr, "error: writing tokens to stdout failed\n");
                        return 1;
                    }
                }
            }
            if (dump) return std::fflush(stdout) == 0 ? 0 : 1;
        }
        nlohmann::json shards = nlohmann::json::array();
        for (std::size_t s = 0; s < ds.shard_count(); ++s)
            shards.push_back({{"path", ds.shard(s).path}, {"tokens", ds.shard(s).tokens}, {"documents", ds.shard(s).documents}});
        nlohmann::json summary = {
            {"format", std::string(feedline::to_string(ds.format()))},
            {"dtype", std::string(feedline::to_string(ds.dtype()))},
            {"shards", ds.shard_count()},
            {"documents", docs},
            {"tokens", ds.total_tokens()},
            {"smallest_document", smallest},
            {"largest_document", largest},
            {"valid", true},
            {"shard_list", shards},
        };
        if (ds.format() == feedline::dataset_format::llmc) summary["delimiter"] = ds.delimiter();
        if (json) {
            fmt::print("{}\n", summary.dump());
        } else {
            fmt::print("format     {}\ndtype      {}\nshards     {}\ndocuments  {}\ntokens     {}\n"
                       "documents  smallest {} / largest {} tokens\n",
                       summary["format"].get<std::string>(), summary["dtype"].get<std::string>(), ds.shard_count(), docs,
                       ds.total_tokens(), smallest, largest);
            if (ds.format() == feedline::dataset_format::llmc) fmt::print("delimiter  {}\n", ds.delimiter());
            fmt::print("valid      yes{}\n", deep ? " (every token read)" : "");
        }
        return 0;
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: {}\n", e.what());
        return 1;
    }
}
