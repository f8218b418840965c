// Text inputs: JSONL with a configurable field, bad lines reported with their line number (or
// skipped and counted), plain text as whole files, blank-line blocks or lines.
#include <doctest/doctest.h>

#include <feedline/format/jsonl_field.hpp>
#include <feedline/format/text.hpp>

#include "test_support.hpp"

using namespace feedline;
namespace ft = feedline::test;

namespace {
std::vector<text_document> read_all(text_reader& r) {
    std::vector<text_document> out;
    text_document d;
    while (r.next(d)) out.push_back(d);
    return out;
}
}  // namespace

#if FEEDLINE_HAS_JSON
TEST_CASE("Text.Jsonl.ReadsTheFieldInOrderKeepingEmptyDocuments") {
    ft::scratch_dir dir;
    ft::write_text(dir / "a.jsonl", "{\"text\": \"hello\"}\n\n{\"text\": \"\", \"id\": 2}\r\n{\"text\": \"caf\\u00e9 \\n two\"}");
    text_reader r(dir / "a.jsonl");
    auto docs = read_all(r);
    REQUIRE(docs.size() == 3);
    CHECK(docs[0].text == "hello");
    CHECK(docs[1].text.empty());
    CHECK(docs[1].line == 3);
    CHECK(docs[2].text == "caf\xc3\xa9 \n two");
    CHECK(docs[2].number == 2);
}

TEST_CASE("Text.Jsonl.CustomField") {
    ft::scratch_dir dir;
    ft::write_text(dir / "b.jsonl", "{\"content\": \"x\", \"text\": 5}\n");
    text_reader r(dir / "b.jsonl", text_options{.field = "content"});
    auto docs = read_all(r);
    REQUIRE(docs.size() == 1);
    CHECK(docs[0].text == "x");
}

TEST_CASE("Text.Jsonl.BadLinesNameFileLineAndOffset") {
    ft::scratch_dir dir;
    const std::string good = "{\"text\": \"ok\"}\n";
    struct bad_case {
        std::string line, words;
    };
    for (const auto& c : {bad_case{"{\"text\": \"unterminated}", "not valid JSON"}, bad_case{"{\"body\": \"x\"}", "no \"text\" field"},
                          bad_case{"{\"text\": 42}", "field \"text\" is not a string"}, bad_case{"[1, 2]", "no \"text\" field"}}) {
        CAPTURE(c.line);
        ft::write_text(dir / "c.jsonl", good + good + c.line + "\n" + good);
        text_reader r(dir / "c.jsonl");
        try {
            read_all(r);
            FAIL("no error");
        } catch (const format_error& e) {
            CHECK(e.file() == dir / "c.jsonl");
            CHECK(e.offset() == 2 * good.size());
            CHECK(std::string(e.what()).find("line 3: " + c.words) != std::string::npos);
        }
        text_reader skipping(dir / "c.jsonl", text_options{.skip_invalid = true});
        auto docs = read_all(skipping);
        CHECK(docs.size() == 3);
        CHECK(skipping.skipped() == 1);
        CHECK(docs[2].number == 3);  // numbering counts the skipped line
    }
}

// With simdjson built in, the fast parser must still accept exactly nlohmann's lines with the same
// text: here on the cases where the two libraries differ or could (fuzz_jsonl_field searches for more).
TEST_CASE("Text.Jsonl.FastParserAcceptsWhatNlohmannAccepts") {
    using status = jsonl_field_status;
    struct line_case {
        std::string line;
        status expected;
        std::string text;
    };
    const std::vector<line_case> cases = {
        {R"({"text": "plain"})", status::ok, "plain"},
        {"  {\"text\": \"spaces and CRLF\"}\r\n", status::ok, "spaces and CRLF"},
        {R"({"text": "first", "text": "last"})", status::ok, "last"},  // duplicate keys: the last counts
        {R"({"text": "a", "text": 7})", status::not_string, ""},
        {R"({"te\u0078t": "escaped key"})", status::ok, "escaped key"},
        {R"({"id": 123456789012345678901234567890, "text": "big integer"})", status::ok,
         "big integer"},  // simdjson refuses, nlohmann decides
        {R"({"id": 18446744073709551616, "text": "2^64"})", status::ok, "2^64"},
        {R"({"id": -9223372036854775809, "text": "below int64"})", status::ok, "below int64"},
        {"\xef\xbb\xbf{\"text\": \"after a BOM\"}", status::ok, "after a BOM"},
        {R"({"text": "nul \u0000 inside"})", status::ok, std::string("nul \0 inside", 12)},
        {R"({"text": "\ud83d\ude00 pair"})", status::ok, "\xf0\x9f\x98\x80 pair"},
        {R"({"a": {"text": "nested only"}})", status::missing_field, ""},
        {R"([{"text": "in an array"}])", status::missing_field, ""},
        {R"("text")", status::missing_field, ""},
        {R"({"text": null})", status::not_string, ""},
        {R"({"id": 1e400, "text": "out of range"})", status::invalid_json, ""},
        {R"({"text": "\ud800 lone surrogate"})", status::invalid_json, ""},
        {"{\"text\": \"bad utf-8 \xff\"}", status::invalid_json, ""},
        {"{\"text\": \"raw\ttab\"}", status::invalid_json, ""},
        {R"({"text": "a"} trailing)", status::invalid_json, ""},
        {R"({"text": "a"}{"text": "b"})", status::invalid_json, ""},
        {R"({"t": tru, "text": "bad atom elsewhere"})", status::invalid_json, ""},
        {R"({"id": 01, "text": "leading zero"})", status::invalid_json, ""},
        {R"({"text": "unterminated)", status::invalid_json, ""},
        {"", status::invalid_json, ""},
        {std::string(1024, '[') + std::string(1024, ']'), status::missing_field, ""},            // as deep as allowed
        {std::string(1025, '[') + std::string(1025, ']'), status::too_deep, ""},                 // refused unparsed
        {"{\"text\": \"" + std::string(2000, '[') + "\"}", status::ok, std::string(2000, '[')},  // inside a string: not nesting
        {"{\"text\": \"" + std::string(jsonl_field_parser::simdjson_max_line, 'x') + "\"}", status::ok,
         std::string(jsonl_field_parser::simdjson_max_line, 'x')},
    };
    jsonl_field_parser fast, reference(jsonl_field_parser::engine::nlohmann);
    for (const line_case& c : cases) {
        CAPTURE(c.line.substr(0, 80));
        for (jsonl_field_parser* p : {&fast, &reference}) {
            std::string line = c.line, text = "untouched";
            const status got = p->extract(line, "text", text);
            CHECK(got == c.expected);
            CHECK(text == (got == status::ok ? c.text : "untouched"));
            CHECK(line == c.line);
        }
    }
    if (!jsonl_field_parser::has_simdjson) MESSAGE("built without simdjson: both parsers are nlohmann_json");
}
#endif

TEST_CASE("Text.Plain.WholeFileBlocksAndLines") {
    ft::scratch_dir dir;
    ft::write_text(dir / "t.txt", "first para\nline two\n\n\nsecond\n  \nthird\n");
    text_reader whole(dir / "t.txt");
    auto w = read_all(whole);
    REQUIRE(w.size() == 1);
    CHECK(w[0].text == "first para\nline two\n\n\nsecond\n  \nthird\n");

    text_reader blocks(dir / "t.txt", text_options{.split = text_split::blank_lines});
    auto b = read_all(blocks);
    REQUIRE(b.size() == 3);
    CHECK(b[0].text == "first para\nline two");
    CHECK(b[1].text == "second");
    CHECK(b[1].line == 5);
    CHECK(b[2].text == "third");

    text_reader lines(dir / "t.txt", text_options{.split = text_split::lines});
    CHECK(read_all(lines).size() == 7);
}

TEST_CASE("Text.Inputs.GlobsDirectoriesAndMissingFiles") {
    ft::scratch_dir dir;
    ft::write_text(dir / "b.txt", "b");
    ft::write_text(dir / "a.txt", "a");
    auto files = resolve_text_inputs({dir.path().string()});
    REQUIRE(files.size() == 2);
    CHECK(files[0] == dir / "a.txt");
    CHECK(resolve_text_inputs({dir / "*.txt"}).size() == 2);
    CHECK_THROWS_AS(resolve_text_inputs({dir / "missing.txt"}), io_error);
    CHECK_THROWS_AS(text_reader(dir / "missing.txt"), io_error);
}
