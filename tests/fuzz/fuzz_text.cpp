// Fuzz target: the JSONL / plain-text reader must yield documents or throw format_error for any
// bytes, and text_corpus (which indexes a file once, then re-reads each document by its offset for
// the tokenizing workers) must give back exactly the documents the reader gave, or fail the same way.
// Input: byte 0 picks JSONL or a plain-text split mode, and skip_invalid; the rest is the file.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <feedline/format/text.hpp>
#include <feedline/format/text_corpus.hpp>

using namespace feedline;

namespace {

// The reader's documents, or nothing when it throws format_error.
std::optional<std::vector<std::string>> read_all(const std::string& path, const text_options& o) {
    try {
        text_reader r(path, o);
        std::vector<std::string> docs;
        text_document d;
        while (r.next(d)) docs.push_back(d.text);
        return docs;
    } catch (const format_error&) {
        return std::nullopt;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const bool jsonl = (data[0] & 3) == 3;
    text_options o;
    o.split = static_cast<text_split>((data[0] & 3) % 3);
    o.skip_invalid = (data[0] & 4) != 0;
    // One file per process, rewritten for each input (text_reader reads files, not memory), removed
    // at exit.
    static const struct scratch_files {
        std::string stem = (std::filesystem::temp_directory_path() / ("feedline-fuzz-text-" + std::to_string(::getpid()))).string();
        ~scratch_files() {
            std::error_code ec;
            std::filesystem::remove(stem + ".jsonl", ec);
            std::filesystem::remove(stem + ".txt", ec);
        }
    } files;
    const std::string path = files.stem + (jsonl ? ".jsonl" : ".txt");
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
    }
    const auto docs = read_all(path, o);
    try {
        text_corpus corpus({path}, o);
        if (!docs || corpus.document_count() != docs->size()) __builtin_trap();
        text_corpus::scratch scratch;
        std::string text;
        for (std::uint64_t i = 0; i < corpus.document_count(); ++i) {
            corpus.document_text(i, scratch, text);
            if (text != (*docs)[i]) __builtin_trap();
        }
    } catch (const format_error&) {
        if (docs) __builtin_trap();  // the corpus refused a file the reader accepted
    } catch (const config_error&) {
        if (docs && !docs->empty()) __builtin_trap();  // "no document at all" is the only config_error
    }
    return 0;
}
