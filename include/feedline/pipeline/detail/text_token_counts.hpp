// feedline/pipeline/detail/text_token_counts.hpp: every document's token count of a text corpus, which
// the sampler lays epochs out from (pipeline/text_source.hpp). Counted once with the corpus's tokenizer
// on all usable cores (transform/tokenize_in_order.hpp: a reader, the tokenizers, this thread keeping
// the counts) and kept in a cache file (format/token_lengths.hpp) under a key that names everything
// the counts depend on: the tokenizer's identity (its kind, the model's checksum, BOS/EOS), the
// document options and each text file's identity. Later opens read 4 bytes per document instead.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <boost/crc.hpp>

#include <feedline/error.hpp>
#include <feedline/exec/topology.hpp>
#include <feedline/format/text_corpus.hpp>
#include <feedline/format/token_lengths.hpp>
#include <feedline/transform/tokenize_in_order.hpp>
#include <feedline/transform/tokenizers.hpp>

namespace feedline::detail {

// A corpus's token counts and where they came from (read from a cache file, or computed, and cached or
// why not).
struct text_token_counts {
    std::vector<std::uint32_t> lengths;
    std::string origin;
};

// What the counts are valid for (format/token_lengths.hpp's key).
inline std::string token_counts_key(const text_corpus& corpus, const tokenizer& tok) {
    std::string key = "feedline.token_lengths 2\ntokenizer " + tok.identity() + "\n";
    // A local file by its canonical path (the same corpus named another way shares the cache), an
    // object by its URL; either with its version (byte_source::version).
    auto identity = [](const byte_source& source) {
        std::string where = source.name();
        if (source.local_file() != nullptr) {
            std::error_code ec;
            const auto canonical = std::filesystem::weakly_canonical(where, ec);
            if (!ec) where = canonical.string();
        }
        return where + " " + source.version();
    };
    const text_options& o = corpus.options();
    key += "field " + o.field + " split " + std::to_string(static_cast<int>(o.split)) + " skip_invalid " + std::to_string(o.skip_invalid) +
           " max_line_bytes " + std::to_string(o.max_line_bytes) + "\n";
    for (std::size_t f = 0; f < corpus.file_count(); ++f) key += "file " + identity(corpus.file_at(f)) + "\n";
    key += "documents " + std::to_string(corpus.document_count()) + "\n";
    return key;
}

// Every document's token count, on `threads` tokenizers (0: the cores this process may use). A
// document the tokenizer refuses is a format_error naming its file and offset.
inline std::vector<std::uint32_t> count_tokens(const text_corpus& corpus, const tokenizer_options& options, unsigned& threads) {
    const std::uint64_t n = corpus.document_count();
    if (threads == 0) threads = static_cast<unsigned>(std::max(1.0, read_topology().usable_cores()));
    threads = static_cast<unsigned>(std::clamp<std::uint64_t>(n / 64, 1, threads));
    std::vector<std::uint32_t> lengths;
    lengths.reserve(n);
    std::uint64_t next = 0;
    text_corpus::scratch scratch;
    std::string text;
    auto where = [&](std::uint64_t d) {
        const auto& ref = corpus.document(d);
        return std::pair{corpus.file_of(ref).name(), ref.offset};
    };
    try {
        tokenize_in_order(
            options, threads,
            [&](std::vector<std::string>& docs) {  // chunks of up to 256 documents or 4 MiB of text
                std::uint64_t bytes = 0;
                for (; next < n && docs.size() < 256 && bytes < (4u << 20); ++next) {
                    corpus.document_text(next, scratch, text);
                    bytes += text.size();
                    docs.push_back(std::move(text));
                }
                return next < n;
            },
            [&](const std::vector<std::string>&, const std::vector<std::vector<std::int32_t>>& ids) {
                for (const auto& v : ids) {
                    if (v.size() > UINT32_MAX) {
                        const auto [file, offset] = where(lengths.size());
                        throw format_error(file, offset, "a document of more than 2^32 tokens");
                    }
                    lengths.push_back(static_cast<std::uint32_t>(v.size()));
                }
            });
    } catch (const encode_error& e) {
        const auto [file, offset] = where(e.document());
        throw format_error(file, offset, "the tokenizer could not encode this document: " + e.problem());
    }
    return lengths;
}

// The counts from the cache file for this corpus and tokenizer, else counted and cached (a cache that
// cannot be read or written costs a count, never the run).
inline text_token_counts load_or_count_tokens(const text_corpus& corpus, const tokenizer_options& options, const tokenizer& tok,
                                              const std::string& cache_dir, unsigned threads) {
    text_token_counts out;
    const std::string key = token_counts_key(corpus, tok);
    const std::string dir = cache_directory(cache_dir);
    std::string path;
    if (!dir.empty()) {
        boost::crc_32_type crc;
        crc.process_bytes(key.data(), key.size());
        char name[32];
        std::snprintf(name, sizeof name, "tokens-%08x.lengths", static_cast<unsigned>(crc.checksum()));
        path = (std::filesystem::path(dir) / name).string();
        try {
            if (auto cached = token_lengths::read(path, key); cached && cached->size() == corpus.document_count()) {
                out.lengths = std::move(*cached);
                out.origin = "read from " + path;
                return out;
            }
        } catch (const error& e) {  // damaged or unreadable: counted again and rewritten below
            out.origin = std::string("cache unusable (") + e.what() + "); ";
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    out.lengths = count_tokens(corpus, options, threads);
    out.origin += "computed by " + std::to_string(threads) + " thread(s) in " +
                  std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s";
    if (path.empty()) {
        out.origin += ", not cached (cache_dir none)";
        return out;
    }
    try {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        token_lengths{key, out.lengths}.write(path);
        out.origin += ", cached in " + path;
    } catch (const error& e) {  // a read-only home, a full disk: the run goes on, the next open counts again
        out.origin += std::string(", not cached: ") + e.what();
    }
    return out;
}

}  // namespace feedline::detail
