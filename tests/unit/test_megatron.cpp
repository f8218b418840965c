// Megatron indexed datasets: write -> read round trips for every dtype, and every kind of corrupt
// .idx/.bin fails with a format_error (or io_error for missing files) naming the file and offset.
#include <doctest/doctest.h>

#include <feedline/format/dataset.hpp>
#include <feedline/storage/reader.hpp>

#include <cstring>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {

// Lengths with the edge cases: empty document, 1-token document, long ones.
const std::vector<std::uint32_t> lengths = {5, 0, 1, 300, 17, 2, 1000, 64};

std::string write_dataset(const ft::scratch_dir& dir, const std::string& name, token_dtype dt, std::uint32_t modulo = 0) {
    std::string prefix = dir / name;
    megatron_writer w(prefix, dt);
    for (const auto& d : ft::arithmetic_documents(lengths, modulo)) w.add_document(d);
    w.finish();
    return prefix;
}

template <class F>
void expect_format_error(F&& f, const std::string& file_suffix, std::uint64_t offset, const std::string& words) {
    try {
        f();
        FAIL("no format_error (expected: " << words << ")");
    } catch (const format_error& e) {
        INFO(e.what());
        CHECK(e.file().size() >= file_suffix.size());
        CHECK(e.file().compare(e.file().size() - file_suffix.size(), file_suffix.size(), file_suffix) == 0);
        CHECK(e.offset() == offset);
        CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
}

// Patches `n` bytes at `offset` of a file.
void patch(const std::string& path, std::uint64_t offset, const void* data, std::size_t n) {
    auto bytes = ft::read_bytes(path);
    REQUIRE(offset + n <= bytes.size());
    std::memcpy(bytes.data() + offset, data, n);
    ft::write_bytes(path, bytes.data(), bytes.size());
}

void truncate_to(const std::string& path, std::uint64_t size) {
    auto bytes = ft::read_bytes(path);
    bytes.resize(size);
    ft::write_bytes(path, bytes.data(), bytes.size());
}

}  // namespace

TEST_CASE("Megatron.RoundTrip.EveryDtype") {
    ft::scratch_dir dir;
    for (auto dt : {token_dtype::uint8, token_dtype::int8, token_dtype::int16, token_dtype::int32, token_dtype::int64, token_dtype::float64,
                    token_dtype::float32, token_dtype::uint16}) {
        CAPTURE(to_string(dt));
        // uint8/int8 cannot hold d*1000+i: reduce modulo a value every dtype holds.
        std::uint32_t modulo = dtype_size(dt) == 1 ? 100 : 0;
        auto prefix = write_dataset(dir, std::string(to_string(dt)), dt, modulo);
        token_dataset ds(prefix);
        CHECK(ds.format() == dataset_format::megatron);
        CHECK(ds.dtype() == dt);
        REQUIRE(ds.document_count() == lengths.size());
        auto expected = ft::arithmetic_documents(lengths, modulo);
        pread_reader r;
        std::uint64_t total = 0;
        for (std::uint64_t d = 0; d < lengths.size(); ++d) {
            auto span = ds.document(d);
            REQUIRE(span.length == lengths[d]);
            std::vector<std::uint32_t> got(span.length);
            ds.read_tokens(r, span, 0, span.length, got.data());
            CHECK(got == expected[d]);
            total += span.length;
        }
        CHECK(ds.total_tokens() == total);
    }
}

TEST_CASE("Megatron.Writer.LayoutMatchesMegatronByteForByte") {
    // The exact bytes Megatron-LM's IndexedDatasetBuilder writes for documents [1,2,3] and [] in uint16
    // (taken from megatron-core; tests/integration/megatron_interop.py checks against the library itself).
    ft::scratch_dir dir;
    megatron_writer w(dir / "tiny", token_dtype::uint16);
    w.add_document(std::vector<std::uint16_t>{1, 2, 3});
    w.add_document(std::vector<std::uint16_t>{});
    w.finish();
    auto idx = ft::read_bytes(dir / "tiny.idx");
    const unsigned char expected[] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
                                      1,   0,   0,   0,   0,   0,   0,   0,     // version
                                      8,                                        // dtype code: uint16
                                      2,   0,   0,   0,   0,   0,   0,   0,     // sequences
                                      3,   0,   0,   0,   0,   0,   0,   0,     // document index entries (leading 0 included)
                                      3,   0,   0,   0,   0,   0,   0,   0,     // lengths (int32 x 2)
                                      0,   0,   0,   0,   0,   0,   0,   0, 6, 0, 0, 0, 0, 0, 0, 0,  // pointers (int64 x 2)
                                      0,   0,   0,   0,   0,   0,   0,   0, 1, 0, 0, 0, 0, 0, 0, 0,
                                      2,   0,   0,   0,   0,   0,   0,   0};  // document index
    REQUIRE(idx.size() == sizeof(expected));
    CHECK(std::memcmp(idx.data(), expected, sizeof(expected)) == 0);
    CHECK(ft::read_bytes(dir / "tiny.bin").size() == 6);
}

TEST_CASE("Megatron.Writer.RejectsTokensThatDoNotFit") {
    ft::scratch_dir dir;
    megatron_writer w(dir / "x", token_dtype::uint16);
    CHECK_THROWS_AS(w.add_document(std::vector<std::uint32_t>{70000}), config_error);
    CHECK_THROWS_AS(megatron_writer(dir / "y", token_dtype::uint32), config_error);
}

TEST_CASE("Megatron.Writer.UnfinishedWriterLeavesNoFiles") {
    ft::scratch_dir dir;
    {
        megatron_writer w(dir / "partial", token_dtype::uint16);
        w.add_document(std::vector<std::uint16_t>{1, 2});
    }
    CHECK(std::filesystem::is_empty(dir.path()));
}

TEST_CASE("Megatron.Corrupt.EveryCaseIsATypedError") {
    ft::scratch_dir dir;
    const std::uint64_t S = lengths.size(), D = lengths.size() + 1;
    const std::uint64_t lengths_at = 34, pointers_at = 34 + 4 * S, docs_at = 34 + 12 * S;
    auto fresh = [&](const std::string& name) { return write_dataset(dir, name, token_dtype::uint16); };

    SUBCASE("empty .idx") {
        auto p = fresh("empty");
        truncate_to(p + ".idx", 0);
        expect_format_error([&] { token_dataset ds(p); }, "empty.idx", 0, "truncated index");
    }
    SUBCASE("truncated header") {
        auto p = fresh("hdr");
        truncate_to(p + ".idx", 20);
        expect_format_error([&] { token_dataset ds(p); }, "hdr.idx", 20, "truncated index");
    }
    SUBCASE("truncated arrays") {
        auto p = fresh("arr");
        truncate_to(p + ".idx", docs_at + 5);
        expect_format_error([&] { token_dataset ds(p); }, "arr.idx", docs_at + 5, "sizes do not add up");
    }
    SUBCASE("wrong magic") {
        auto p = fresh("magic");
        patch(p + ".idx", 0, "XXIDIDX", 7);
        expect_format_error([&] { token_dataset ds(p); }, "magic.idx", 0, "wrong magic");
    }
    SUBCASE("unknown version") {
        auto p = fresh("version");
        std::uint64_t v = 2;
        patch(p + ".idx", 9, &v, 8);
        expect_format_error([&] { token_dataset ds(p); }, "version.idx", 9, "unknown version 2");
    }
    SUBCASE("unknown dtype code") {
        auto p = fresh("dtype");
        std::uint8_t code = 9;
        patch(p + ".idx", 17, &code, 1);
        expect_format_error([&] { token_dataset ds(p); }, "dtype.idx", 17, "unknown dtype code 9");
    }
    SUBCASE("sequence count that does not add up") {
        auto p = fresh("count");
        std::uint64_t s = S + 1;
        patch(p + ".idx", 18, &s, 8);
        expect_format_error([&] { token_dataset ds(p); }, "count.idx", docs_at + 8 * D, "sizes do not add up");
    }
    SUBCASE("pointer beyond the .bin") {
        auto p = fresh("pointer");
        std::int64_t ptr = 1 << 20;
        patch(p + ".idx", pointers_at + 8 * 3, &ptr, 8);
        expect_format_error([&] { token_dataset ds(p); }, "pointer.idx", pointers_at + 8 * 3, "beyond the .bin size");
    }
    SUBCASE("length beyond the .bin") {
        auto p = fresh("length");
        std::int32_t len = 100000;
        patch(p + ".idx", lengths_at + 4 * 7, &len, 4);
        expect_format_error([&] { token_dataset ds(p); }, "length.idx", pointers_at + 8 * 7, "beyond the .bin size");
    }
    SUBCASE("negative length") {
        auto p = fresh("negative");
        std::int32_t len = -1;
        patch(p + ".idx", lengths_at + 4 * 2, &len, 4);
        expect_format_error([&] { token_dataset ds(p); }, "negative.idx", lengths_at + 8, "negative length");
    }
    SUBCASE("truncated .bin") {
        auto p = fresh("shortbin");
        truncate_to(p + ".bin", 100);
        expect_format_error([&] { token_dataset ds(p); }, "shortbin.idx", pointers_at + 8 * 3, "beyond the .bin size");
    }
    SUBCASE("non-monotone document index") {
        auto p = fresh("docs");
        std::int64_t d = 1;
        patch(p + ".idx", docs_at + 8 * 4, &d, 8);
        expect_format_error([&] { token_dataset ds(p); }, "docs.idx", docs_at + 8 * 4, "document index decreases");
    }
    SUBCASE("document index not ending at the sequence count") {
        auto p = fresh("docend");
        std::int64_t d = static_cast<std::int64_t>(S - 1);
        patch(p + ".idx", docs_at + 8 * (D - 1), &d, 8);
        expect_format_error([&] { token_dataset ds(p); }, "docend.idx", docs_at + 8 * (D - 1), "document index ends at");
    }
    SUBCASE("missing .bin") {
        auto p = fresh("nobin");
        std::filesystem::remove(p + ".bin");
        try {
            token_dataset ds(p);
            FAIL("opened without .bin");
        } catch (const io_error& e) {
            CHECK(e.file() == p + ".bin");
            CHECK(e.error_code() == ENOENT);
        }
    }
}
