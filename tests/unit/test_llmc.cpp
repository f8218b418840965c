// llm.c shards: round trips in both token widths, documents that continue into the next shard, the
// document index found by delimiter, and every header problem reported with file and offset. Raw
// (headerless) token files as nanoGPT writes them: read by the dtype the spec names, documents ended by
// the delimiter, and every size or naming problem reported.
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

namespace {

// A file as nanoGPT's prepare.py writes it: the tokens and nothing else.
template <class T>
std::string write_raw(const ft::scratch_dir& dir, const std::string& name, const std::vector<T>& tokens) {
    std::string path = dir / name;
    ft::write_bytes(path, tokens.data(), tokens.size() * sizeof(T));
    return path;
}

template <class Error>
std::string refusal(const std::string& spec) {
    try {
        token_dataset ds(spec);
        FAIL("accepted " << spec);
    } catch (const Error& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("Raw.NanoGptFile.ReadWithTheNamedDtypeDocumentsEndAtTheDelimiter") {
    ft::scratch_dir dir;
    // nanoGPT appends <|endoftext|> after every document.
    const std::vector<std::uint16_t> tokens = {5, 6, 7, 50256, 50256, 9, 10, 50256, 11};
    write_raw(dir, "train.bin", tokens);
    token_dataset ds("raw:uint16:" + dir / "train.bin");
    CHECK(ds.format() == dataset_format::raw);
    CHECK(ds.dtype() == token_dtype::uint16);
    CHECK(ds.delimiter() == 50256);
    CHECK(ds.total_tokens() == tokens.size());
    CHECK(ds.token_byte_offset(3) == 6);  // no header
    // Documents keep their own end-of-text: [5 6 7 eot] [eot] [9 10 eot] [11].
    REQUIRE(ds.document_count() == 4);
    const std::vector<std::uint64_t> lengths = {4, 1, 3, 1};
    auto r = make_reader({.backend = io_backend::pread});
    std::vector<std::uint32_t> all;
    for (std::uint64_t d = 0; d < 4; ++d) {
        const auto span = ds.document(d);
        CHECK(span.length == lengths[d]);
        std::vector<std::uint32_t> got(span.length);
        ds.read_tokens(r, span, 0, span.length, got.data());
        CHECK((got.back() == 50256) == (d != 3));
        all.insert(all.end(), got.begin(), got.end());
    }
    CHECK(all == std::vector<std::uint32_t>(tokens.begin(), tokens.end()));

    // The delimiter can be named (a file of another tokenizer's ids): by the API, or in the spec, which
    // every tool, blend and Python take; eot=none reads one stream cut only at row ends.
    token_dataset other("raw:uint16:" + dir / "train.bin");
    other.set_delimiter(9);
    CHECK(other.document_count() == 2);  // [5 6 7 eot eot 9] [10 eot 11]
    CHECK(other.document(1).length == 3);
    token_dataset named("raw:uint16:eot=9:" + dir / "train.bin");
    CHECK(named.delimiter() == 9);
    CHECK(named.document_count() == 2);
    CHECK(named.document(1).length == 3);
    token_dataset none("raw:uint16:eot=none:" + dir / "train.bin");
    CHECK(none.document_count() == 1);
    CHECK(none.document(0).length == tokens.size());
}

TEST_CASE("Raw.ManyFilesAndWidths.OneStreamAcrossFiles") {
    for (auto dt : {token_dtype::uint16, token_dtype::uint32, token_dtype::int32, token_dtype::uint8, token_dtype::int64}) {
        CAPTURE(to_string(dt));
        ft::scratch_dir dir;
        const std::uint32_t n = 1000;
        std::vector<std::uint32_t> expected;
        for (int f = 0; f < 3; ++f) {
            std::vector<std::byte> bytes((n + f) * dtype_size(dt));
            for (std::uint32_t i = 0; i < n + static_cast<std::uint32_t>(f); ++i) {
                const auto v = static_cast<std::uint32_t>((i * 7 + static_cast<std::uint32_t>(f)) % 200);
                REQUIRE(detail::store_token(bytes.data(), dt, i, v));
                expected.push_back(v);
            }
            ft::write_bytes(dir / ("part" + std::to_string(f) + ".bin"), bytes.data(), bytes.size());
        }
        ft::write_text(dir / "meta.txt", "not tokens");  // a directory's other files are passed over
        for (const std::string& where : {dir / "part*.bin", dir.path().string()}) {
            token_dataset ds("raw:" + std::string(to_string(dt)) + ":" + where);
            REQUIRE(ds.shard_count() == 3);
            REQUIRE(ds.total_tokens() == expected.size());
            // A window that runs from the first file through the second into the third.
            // File 0 holds n tokens, file 1 n + 1: its last token, all of file 1, and file 2's first.
            std::vector<std::byte> raw((n + 3) * dtype_size(dt));
            std::vector<read_request> reqs;
            ds.append_stream_requests(0, n - 1, n + 3, raw.data(), reqs);
            CHECK(reqs.size() == 3);
            auto r = make_reader({.backend = io_backend::mmap});
            r.read(reqs);
            std::vector<std::uint32_t> got(n + 3);
            detail::convert_tokens(raw.data(), dt, got.size(), got.data());
            CHECK(std::equal(got.begin(), got.end(), expected.begin() + n - 1));
        }
    }
}

TEST_CASE("Raw.BadFilesAndSpecs.TypedErrorsNamingTheFile") {
    ft::scratch_dir dir;
    const std::string odd = write_raw(dir, "odd.bin", std::vector<std::uint8_t>{1, 0, 2, 0, 3});
    SUBCASE("a partial last token: the offset where it starts") {
        try {
            token_dataset ds("raw:uint16:" + odd);
            FAIL("accepted");
        } catch (const format_error& e) {
            CHECK(e.file() == odd);
            CHECK(e.offset() == 4);
            CHECK(std::string(e.what()).find("not a whole number of uint16 tokens") != std::string::npos);
        }
        CHECK(refusal<format_error>("raw:uint32:" + odd).find("1 byte(s) left over") != std::string::npos);
    }
    SUBCASE("an empty file") {
        const std::string empty = write_raw(dir, "empty.bin", std::vector<std::uint16_t>{});
        CHECK(refusal<format_error>("raw:uint16:" + empty).find("empty file") != std::string::npos);
    }
    SUBCASE("a missing file, an empty glob, a directory with no .bin") {
        CHECK(refusal<io_error>("raw:uint16:" + dir / "nope.bin").find("nope.bin") != std::string::npos);
        CHECK(refusal<io_error>("raw:uint16:" + dir / "x*.bin").find("matches no file") != std::string::npos);
        ft::scratch_dir empty_dir;
        CHECK(refusal<io_error>("raw:uint16:" + empty_dir.path().string()).find("no .bin files") != std::string::npos);
    }
    SUBCASE("a spec without a dtype, with a float or unknown one") {
        for (const std::string& spec :
             {"raw:" + odd, std::string("raw:uint16:"), "raw:float32:" + odd, "raw:u16:" + odd, "raw:uint16:eot=:" + odd,
              "raw:uint16:eot=-1:" + odd, "raw:uint16:eot=2147483648:" + odd, "raw:uint16:eot=99999999999999999999:" + odd,
              std::string("raw:uint16:eot=5"), std::string("raw:uint16:eot=5:")}) {
            CAPTURE(spec);
            CHECK(refusal<config_error>(spec).find("raw:<dtype>:<path>") != std::string::npos);
        }
    }
    SUBCASE("two dtypes, or raw files among llm.c shards, in one dataset") {
        const std::string even = write_raw(dir, "even.bin", std::vector<std::uint16_t>{1, 2, 3, 4});
        try {
            token_dataset ds(std::vector<std::string>{"raw:uint16:" + even, "raw:uint32:" + even});
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(std::string(e.what()).find("one dataset holds one dtype") != std::string::npos);
        }
        try {
            token_dataset ds(std::vector<std::string>{"raw:uint16:eot=3:" + even, "raw:uint16:" + even});
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(std::string(e.what()).find("another eot=") != std::string::npos);
        }
        auto shards = write_shards(dir, "llmc", token_dtype::uint16, 50256, 1000);
        try {
            token_dataset ds(std::vector<std::string>{shards[0], "raw:uint16:" + even});
            FAIL("accepted");
        } catch (const config_error& e) {
            CHECK(std::string(e.what()).find("a headerless token file") != std::string::npos);
        }
    }
}
