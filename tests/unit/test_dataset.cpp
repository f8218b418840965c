// Shard sets: directories, globs and prefix lists open as one dataset with global document numbering;
// mixed formats or dtypes and missing paths are refused with the offending path named.
#include <doctest/doctest.h>

#include <feedline/detail/paths.hpp>
#include <feedline/format/dataset.hpp>
#include <feedline/storage/reader.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {
// Three Megatron shards; shard k holds documents with lengths k+1, 0, 2k+3 and tokens 100*k + i.
std::vector<std::string> three_shards(const ft::scratch_dir& dir, token_dtype dt = token_dtype::uint16) {
    std::vector<std::string> prefixes;
    for (std::uint32_t k = 0; k < 3; ++k) {
        std::string p = dir / ("part_" + std::to_string(k));
        megatron_writer w(p, dt);
        for (std::uint32_t len : {k + 1, 0u, 2 * k + 3}) {
            std::vector<std::uint32_t> doc(len);
            for (std::uint32_t i = 0; i < len; ++i) doc[i] = 100 * k + i;
            w.add_document(doc);
        }
        w.finish();
        prefixes.push_back(p);
    }
    return prefixes;
}
}  // namespace

TEST_CASE("Dataset.Specs.DirectoryGlobAndPrefixListAgree") {
    ft::scratch_dir dir;
    auto prefixes = three_shards(dir);
    token_dataset by_dir(dir.path().string());
    token_dataset by_glob(dir / "part_*.idx");
    token_dataset by_bin_glob(dir / "part_*.bin");
    token_dataset by_list(prefixes);
    for (const token_dataset* ds : {&by_dir, &by_glob, &by_bin_glob, &by_list}) {
        CHECK(ds->shard_count() == 3);
        CHECK(ds->document_count() == 9);
        CHECK(ds->total_tokens() == (1 + 3) + (2 + 5) + (3 + 7));
    }
    // Global numbering: document 3*k + j is document j of shard k.
    pread_reader r;
    for (std::uint64_t d = 0; d < 9; ++d) {
        auto span = by_list.document(d);
        CHECK(span.shard == d / 3);
        std::vector<std::uint32_t> got(span.length);
        by_list.read_tokens(r, span, 0, span.length, got.data());
        for (std::uint32_t i = 0; i < span.length; ++i) CHECK(got[i] == 100 * span.shard + i);
    }
    CHECK_THROWS_AS(by_list.document(9), std::out_of_range);
}

// locate() answers a batch of documents at once as document() does one by one, in any order and with
// repeats, across shards; document_length() agrees; a bad index is refused before anything is read.
TEST_CASE("Dataset.Specs.LocateAgreesWithDocumentForABatch") {
    ft::scratch_dir dir;
    token_dataset ds(three_shards(dir));
    const std::vector<std::uint64_t> docs{8, 0, 4, 4, 1, 7, 3, 2, 6, 5, 0};
    std::vector<document_span> got(docs.size());
    ds.locate(docs, got);
    for (std::size_t k = 0; k < docs.size(); ++k) {
        CAPTURE(docs[k]);
        const document_span want = ds.document(docs[k]);
        CHECK(got[k].shard == want.shard);
        CHECK(got[k].first_token == want.first_token);
        CHECK(got[k].length == want.length);
        CHECK(ds.document_length(docs[k]) == want.length);
    }
    CHECK(got[0].shard == 2);  // document 8: shard 2's third, 7 tokens after its first 3
    CHECK(got[0].first_token == 3);
    CHECK(got[0].length == 7);
    const std::vector<std::uint64_t> bad{1, 9};
    CHECK_THROWS_AS(ds.locate(bad, got), std::out_of_range);
}

// An .idx cut short while its dataset holds it mapped: locate() of a document whose entries were cut
// off is a format_error naming the .idx and the first of its entries past the new end (its length's,
// else its pointer's), not a SIGBUS; one whose entries are still there reads as before.
TEST_CASE("Dataset.Specs.LocateOfAnIndexTruncatedWhileMappedIsAFormatError") {
    ft::scratch_dir dir;
    const std::string prefix = dir / "big";
    megatron_writer w(prefix, token_dtype::uint16);
    for (std::uint32_t d = 0; d < 3000; ++d) w.add_document(std::vector<std::uint32_t>(1 + d % 7, d % 50000));
    w.finish();
    token_dataset ds(prefix);
    // 34-byte header, lengths [34, 12034), pointers [12034, 36034), then the document index.
    const std::uint64_t length_of_last = 34 + 4 * 2999, pointer_of_last = 12034 + 8 * 2999;
    const std::vector<std::uint64_t> first{0, 1}, last{2999, 1};  // the first faults first
    std::vector<document_span> got(2);
    ds.locate(last, got);
    CHECK(got[0].length == 1 + 2999 % 7);
    for (const auto& cut : {std::pair<off_t, std::uint64_t>{16384, pointer_of_last}, {4096, length_of_last}}) {
        const off_t size = cut.first;  // not a structured binding: CAPTURE's lambda cannot name one (clang)
        const std::uint64_t offset = cut.second;
        CAPTURE(size);
        REQUIRE(::truncate((prefix + ".idx").c_str(), size) == 0);
        if (size == 16384) {  // document 1's entries are still in the file
            ds.locate(first, got);
            CHECK(got[1].length == 2);
        }
        try {
            ds.locate(last, got);
            FAIL("no error from a truncated .idx");
        } catch (const format_error& e) {
            CHECK(e.file() == prefix + ".idx");
            CHECK(e.offset() == offset);
            CHECK(std::string(e.what()).find("shrank") != std::string::npos);
        }
        CHECK_THROWS_AS(ds.document(2999), format_error);  // one at a time: the same guard
    }
}

// Globs expanded while a glob_listings lives read each directory once and give what glob(3) gives,
// in its order: prefixes of other names (a_1 and a_10), ?, [...], hidden names, a subdirectory, a
// doubled slash, a dangling link, nothing matched, a pattern relative to the working directory; the
// patterns it leaves to glob(3) (a wildcard before the last component, a trailing slash, an escape, a
// leading dot) too.
TEST_CASE("Dataset.Specs.GlobsFromOneListingMatchGlob3") {
    ft::scratch_dir dir;
    for (const char* name : {"a_1.bin", "a_10.bin", "a_2.bin", "a_1.idx", "b_1.bin", ".a_3.bin", "A_4.bin", "a_[x].bin", "sub/a_5.bin",
                             "sub/c_6.bin", "sub2/a_7.bin"}) {
        std::filesystem::create_directories(std::filesystem::path(dir / name).parent_path());
        ft::write_text(dir / name, name);
    }
    std::filesystem::create_directories(dir / "a_dir.bin");
    REQUIRE(::symlink((dir / "nowhere").c_str(), (dir / "a_link.bin").c_str()) == 0);
    const std::vector<std::string> patterns = {"a_*.bin", "a_?.bin", "a_[12].bin",  "a_[!1]*", "*.bin", "*",
                                               "b_*",     "c_*",     "a_1*",        "sub/a_*", "sub/*", "sub//a_*",
                                               "*/a_*",   "a_*/",    "a_\\[x].bin", ".a*",     "[.]a*", "A*"};
    std::vector<std::vector<std::string>> by_glob;
    for (const std::string& p : patterns) by_glob.push_back(detail::glob_paths(dir / p));
    CHECK(by_glob[0] == std::vector<std::string>{dir / "a_1.bin", dir / "a_10.bin", dir / "a_2.bin", dir / "a_[x].bin", dir / "a_dir.bin",
                                                 dir / "a_link.bin"});
    CHECK(by_glob[7].empty());
    // Relative to the working directory ("a_*.bin" lists "."): the scratch directory for a moment,
    // given back however the block ends.
    std::vector<std::string> relative, relative_listed;
    {
        struct working_directory {
            std::filesystem::path was = std::filesystem::current_path();
            explicit working_directory(const std::filesystem::path& to) { std::filesystem::current_path(to); }
            ~working_directory() { std::filesystem::current_path(was); }
        } in_scratch(dir.path());
        relative = detail::glob_paths("a_*.bin");
        detail::glob_listings listings;
        relative_listed = detail::glob_paths("a_*.bin");
    }
    CHECK(relative == std::vector<std::string>{"a_1.bin", "a_10.bin", "a_2.bin", "a_[x].bin", "a_dir.bin", "a_link.bin"});
    CHECK(relative_listed == relative);
    detail::glob_listings listings;  // not const: globs fill it
    for (std::size_t i = 0; i < patterns.size(); ++i) CHECK_MESSAGE(detail::glob_paths(dir / patterns[i]) == by_glob[i], patterns[i]);
    CHECK(listings.directories_listed() == 3);  // dir, sub and sub/ (sub//a_*); the others went to glob(3)
}

TEST_CASE("Dataset.Specs.PartialReadsStayInsideTheDocument") {
    ft::scratch_dir dir;
    token_dataset ds(three_shards(dir));
    auto span = ds.document(8);  // shard 2, last document: 7 tokens 200..206
    pread_reader r;
    std::vector<std::int64_t> got(3);
    ds.read_tokens(r, span, 2, 3, got.data());
    CHECK(got == std::vector<std::int64_t>{202, 203, 204});
    CHECK_THROWS_AS(ds.read_tokens(r, span, 5, 3, got.data()), std::out_of_range);
}

TEST_CASE("Dataset.Specs.MixedDtypesAreRefused") {
    ft::scratch_dir a, b;
    auto p16 = three_shards(a, token_dtype::uint16);
    auto p32 = three_shards(b, token_dtype::int32);
    try {
        token_dataset ds(std::vector<std::string>{p16[0], p32[0]});
        FAIL("opened mixed dtypes");
    } catch (const config_error& e) {
        CHECK(std::string(e.what()).find(p32[0]) != std::string::npos);
    }
}

TEST_CASE("Dataset.Specs.MixedFormatsAreRefused") {
    ft::scratch_dir dir;
    auto prefixes = three_shards(dir);
    llmc_writer w(dir / "llmc", token_dtype::uint16, 1);
    w.add_document(std::vector<std::uint16_t>{1, 2});
    auto shards = w.finish();
    CHECK_THROWS_AS(token_dataset(std::vector<std::string>{prefixes[0], shards[0]}), config_error);
}

TEST_CASE("Dataset.Specs.NoShardsIsAConfigErrorInEveryForm") {
    // A spec resolved by hand can hold no shard; the dataset refuses it rather than answering
    // document counts from an empty table.
    for (const auto format : {dataset_format::megatron, dataset_format::llmc, dataset_format::raw}) {
        CAPTURE(static_cast<int>(format));
        detail::resolved_spec spec;
        spec.format = format;
        CHECK_THROWS_AS(token_dataset{spec}, config_error);
    }
    CHECK_THROWS_AS(token_dataset(std::vector<std::string>{}), config_error);
}

TEST_CASE("Dataset.Specs.MissingPathsAreIoErrors") {
    ft::scratch_dir dir;
    CHECK_THROWS_AS(token_dataset(dir / "nothing"), io_error);
    CHECK_THROWS_AS(token_dataset(dir / "nothing_*.bin"), io_error);
    CHECK_THROWS_AS(token_dataset(dir.path().string()), io_error);  // empty directory
}

// uint16 -> int32 takes a SIMD path for whole blocks and a scalar one for the rest: every length
// around the block sizes, from addresses of every alignment, gives each token zero-extended (65535
// stays 65535, not -1) and writes nothing past the count.
TEST_CASE("Dataset.Dtype.Uint16ToInt32EveryLengthAndAlignment") {
    std::vector<std::uint16_t> tokens(200);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(65535 - i * 331);
    std::vector<std::byte> raw(tokens.size() * 2 + 8);
    for (std::size_t shift = 0; shift < 4; ++shift) {
        std::memcpy(raw.data() + shift, tokens.data(), tokens.size() * 2);
        for (std::size_t count = 0; count <= 70; ++count) {
            std::vector<std::int32_t> out(count + 4, -7);
            detail::convert_tokens(raw.data() + shift, token_dtype::uint16, count, out.data());
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < count; ++i) wrong += out[i] != static_cast<std::int32_t>(tokens[i]);
            CHECK_MESSAGE(wrong == 0, "count " << count << ", shift " << shift);
            for (std::size_t i = count; i < out.size(); ++i) CHECK(out[i] == -7);
        }
    }
}
