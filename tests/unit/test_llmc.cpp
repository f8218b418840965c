// llm.c shards: round trips in both token widths, documents that continue into the next shard, the
// document index found by delimiter, and every header problem reported with file and offset.
#include <doctest/doctest.h>

#include <feedline/format/dataset.hpp>
#include <feedline/storage/reader.hpp>

#include <array>
#include <cstring>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

const std::vector<std::uint32_t> lengths = {5, 0, 1, 40, 17, 2, 100, 64};

std::vector<std::string> write_shards(const ft::scratch_dir& dir, const std::string& name, token_dtype dt, std::uint32_t delimiter,
                                      std::uint64_t shard_tokens) {
    llmc_writer w(dir / name, dt, delimiter, shard_tokens);
    for (const auto& d : ft::arithmetic_documents(lengths)) w.add_document(d);
    return w.finish();
}

// A shard exactly as llm.c's write_datafile makes it (header[3] left 0).
std::string write_llmc_native(const ft::scratch_dir& dir, const std::string& name, std::int32_t magic, std::int32_t version,
                              const std::vector<std::uint16_t>& tokens, std::int32_t count_in_header) {
    std::array<std::int32_t, 256> header{};
    header[0] = magic;
    header[1] = version;
    header[2] = count_in_header;
    std::vector<std::byte> bytes(1024 + tokens.size() * 2);
    std::memcpy(bytes.data(), header.data(), 1024);
    std::memcpy(bytes.data() + 1024, tokens.data(), tokens.size() * 2);
    std::string path = dir / name;
    ft::write_bytes(path, bytes.data(), bytes.size());
    return path;
}

void expect_format_error(const std::string& path, std::uint64_t offset, const std::string& words) {
    try {
        llmc_shard s(path);
        FAIL("no format_error (expected: " << words << ")");
    } catch (const format_error& e) {
        INFO(e.what());
        CHECK(e.file() == path);
        CHECK(e.offset() == offset);
        CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
}

}  // namespace

TEST_CASE("Llmc.RoundTrip.BothWidthsAndDocumentsAcrossShards") {
    for (auto dt : {token_dtype::uint16, token_dtype::uint32}) {
        for (std::uint64_t shard_tokens : {1000ull, 37ull, 1ull}) {
            CAPTURE(to_string(dt));
            CAPTURE(shard_tokens);
            ft::scratch_dir dir;
            const std::uint32_t delimiter = 60000;
            auto paths = write_shards(dir, "train", dt, delimiter, shard_tokens);
            std::uint64_t total = lengths.size();
            for (auto l : lengths) total += l;
            CHECK(paths.size() == (total + shard_tokens - 1) / shard_tokens);

            token_dataset ds(dir / "train_*.bin");
            CHECK(ds.format() == dataset_format::llmc);
            CHECK(ds.dtype() == dt);
            CHECK(ds.delimiter() == delimiter);  // recorded in header[3] by feedline
            CHECK(ds.total_tokens() == total);
            REQUIRE(ds.document_count() == lengths.size());
            auto expected = ft::arithmetic_documents(lengths);
            auto r = make_reader({.backend = io_backend::mmap});
            for (std::uint64_t d = 0; d < lengths.size(); ++d) {
                auto span = ds.document(d);
                REQUIRE(span.length == lengths[d] + 1);  // the delimiter starts the document
                std::vector<std::uint32_t> got(span.length);
                ds.read_tokens(r, span, 0, span.length, got.data());
                CHECK(got[0] == delimiter);
                CHECK(std::vector<std::uint32_t>(got.begin() + 1, got.end()) == expected[d]);
            }
        }
    }
}

TEST_CASE("Llmc.NativeShard.UsesLlmcDelimiterForItsMagic") {
    ft::scratch_dir dir;
    std::vector<std::uint16_t> tokens = {50256, 1, 2, 3, 50256, 50256, 7};
    auto path = write_llmc_native(dir, "gpt2_val_000000.bin", 20240520, 1, tokens, 7);
    token_dataset ds(dir / "*_val_*.bin");
    CHECK(ds.delimiter() == 50256);
    REQUIRE(ds.document_count() == 3);
    CHECK(ds.document(0).length == 4);
    CHECK(ds.document(1).length == 1);  // an empty document is just its delimiter
    CHECK(ds.document(2).length == 2);
}

TEST_CASE("Llmc.Corrupt.EveryHeaderProblemIsAFormatError") {
    ft::scratch_dir dir;
    std::vector<std::uint16_t> tokens = {50256, 1, 2, 3};
    SUBCASE("empty file") {
        auto p = dir / "empty.bin";
        ft::write_text(p, "");
        expect_format_error(p, 0, "empty file");
    }
    SUBCASE("truncated header") {
        auto p = dir / "short.bin";
        std::vector<std::byte> b(100);
        ft::write_bytes(p, b.data(), b.size());
        expect_format_error(p, 100, "truncated header");
    }
    SUBCASE("wrong magic") { expect_format_error(write_llmc_native(dir, "m.bin", 12345, 1, tokens, 4), 0, "wrong magic 12345"); }
    SUBCASE("version that does not match the magic") {
        expect_format_error(write_llmc_native(dir, "v.bin", 20240520, 7, tokens, 4), 4, "expected version 1");
        expect_format_error(write_llmc_native(dir, "w.bin", 20240801, 1, tokens, 4), 4, "expected version 7");
    }
    SUBCASE("token count larger than the file") {
        expect_format_error(write_llmc_native(dir, "c.bin", 20240520, 1, tokens, 10), 1032, "(truncated)");
    }
    SUBCASE("token count smaller than the file") {
        expect_format_error(write_llmc_native(dir, "d.bin", 20240520, 1, tokens, 2), 1028, "needs a file of 1028 bytes");
    }
    SUBCASE("negative token count") {
        expect_format_error(write_llmc_native(dir, "n.bin", 20240520, 1, tokens, -5), 8, "negative token count");
    }
}

TEST_CASE("Llmc.Writer.RejectsBadSettingsAndTokens") {
    ft::scratch_dir dir;
    CHECK_THROWS_AS(llmc_writer(dir / "a", token_dtype::int32, 1), config_error);
    CHECK_THROWS_AS(llmc_writer(dir / "b", token_dtype::uint16, 70000), config_error);
    llmc_writer w(dir / "c", token_dtype::uint16, 1);
    CHECK_THROWS_AS(w.add_document(std::vector<std::uint32_t>{65536}), config_error);
    CHECK_THROWS_AS(w.add_document(std::vector<std::int32_t>{-1}), config_error);
}
