// feedline/format/text.hpp: JSONL and plain-text documents, streamed (one line or block at a time).
// These are the inputs of tokenization: feedline-pack turns them into token shards offline, and the
// pipeline's workers tokenize them on the fly. A JSONL line is {"text": "..."} (field name configurable);
// plain text is one document per file or per blank-line-separated block. Feeds format/text_corpus.hpp
// (tokenized on the fly by pipeline/text_source.hpp) and feedline-pack (tools/pack.cpp).
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <feedline/detail/paths.hpp>
#include <feedline/error.hpp>
#include <feedline/format/jsonl_field.hpp>
#include <feedline/names.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

struct text_document {
    std::string text;
    std::uint64_t number = 0;  // 0-based position in the source, counting skipped lines too
    std::uint64_t line = 0;    // 1-based line where it starts
    std::uint64_t offset = 0;  // byte offset where it starts
    std::uint64_t end = 0;     // byte offset just past its last line (and that line's newline)
};

enum class text_split { whole_file, blank_lines, lines };

template <>
struct enum_names<text_split> {
    static constexpr std::array values{named(text_split::whole_file, "file"), named(text_split::blank_lines, "blank"),
                                       named(text_split::lines, "line")};
};

struct text_options {
    std::string field = "text";                 // JSONL field that holds the document
    bool skip_invalid = false;                  // count and skip bad JSONL lines instead of throwing
    text_split split = text_split::whole_file;  // plain text only
    // The longest line or document read, in bytes (a JSONL line, a plain-text line, a blank-line block
    // or a whole-file document): a longer one is a format_error naming the file, offset and line (or,
    // with skip_invalid, a skipped and counted one) instead of memory in proportion to whatever one
    // document holds. 0: no limit. Tokenizing is bounded separately (tokenizer_options::piece_bytes).
    std::uint64_t max_line_bytes = std::uint64_t(64) << 20;
    friend bool operator==(const text_options&, const text_options&) = default;
};

// Reads documents from one JSONL or plain-text file without loading it whole (a whole-file document is
// one document, so it is loaded). Files ending in .jsonl / .json / .ndjson are JSONL. Not thread-safe.
class text_reader {
public:
    // Throws io_error when the file is not a regular file or cannot be opened, config_error for JSONL
    // without JSON support built.
    explicit text_reader(std::string path, text_options options = {})
            : path_(std::move(path)), opt_(std::move(options)), in_((require_regular_file(path_), path_), std::ios::binary) {
        if (!in_) throw io_error(path_, errno, "cannot open");
        jsonl_ = detail::ends_with(path_, ".jsonl") || detail::ends_with(path_, ".json") || detail::ends_with(path_, ".ndjson");
#if !FEEDLINE_HAS_JSON
        if (jsonl_)
            throw config_error("input", path_ + ": JSONL support not built (nlohmann_json was not found when feedline was configured)");
#endif
    }

    // Reads the next document into `doc`; false at end of file. Throws format_error naming the file,
    // the byte offset and the line for invalid JSON or a missing/non-string field (unless skip_invalid).
    bool next(text_document& doc) {
        if (jsonl_) return next_jsonl(doc);
        switch (opt_.split) {
            case text_split::whole_file: return next_whole(doc);
            case text_split::blank_lines: return next_block(doc);
            case text_split::lines: return next_line(doc);
        }
        return false;
    }
    bool is_jsonl() const noexcept { return jsonl_; }
    std::uint64_t skipped() const noexcept { return skipped_; }
    const std::string& path() const noexcept { return path_; }

private:
    // One line, without its '\n' (and '\r'). A line over max_line_bytes is read no further: with
    // skip_invalid the rest is discarded and the line counted as skipped (`skipped` is set), else it
    // is a format_error. Reading stops at the limit, so memory stays bounded by it.
    bool getline(std::string& line, bool* skipped = nullptr) {
        line_offset_ = offset_;
        line.clear();
        const std::uint64_t limit = opt_.max_line_bytes;
        bool any = false, too_long = false;
        char chunk[1 << 16];
        for (;;) {
            // istream::getline scans a buffer at a time; a full chunk means the line goes on.
            in_.getline(chunk, sizeof chunk);
            const auto n = static_cast<std::size_t>(in_.gcount());
            std::size_t stored = n;
            bool ended = true;
            if (in_.good()) {
                stored = n - 1;  // the '\n' was taken, not stored
            } else if (!in_.eof() && !in_.bad() && n == sizeof chunk - 1) {
                in_.clear();
                ended = false;
            } else if (in_.bad()) {
                throw io_error(path_, errno, "read failed", offset_);
            }
            any = any || n > 0;
            offset_ += n;
            if (!too_long && limit != 0 && line.size() + stored > limit) {
                if (!opt_.skip_invalid || skipped == nullptr)
                    throw format_error(path_, line_offset_,
                                       "line " + std::to_string(line_no_ + 1) + " is longer than max_line_bytes (" + std::to_string(limit) +
                                           " bytes; raise text.documents.max_line_bytes for longer documents)");
                too_long = true;
                std::string().swap(line);
            }
            if (!too_long) line.append(chunk, stored);
            if (ended) break;
        }
        if (!any) return false;
        ++line_no_;
        if (skipped != nullptr) *skipped = too_long;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
    }

    bool next_jsonl(text_document& doc) {
#if FEEDLINE_HAS_JSON
        std::string line;
        bool too_long = false;
        while (getline(line, &too_long)) {
            if (too_long) {
                ++skipped_;
                ++number_;
                continue;
            }
            if (std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); })) continue;
            const jsonl_field_status status = json_.extract(line, opt_.field, doc.text);
            if (status != jsonl_field_status::ok) {
                const std::string problem = status == jsonl_field_status::invalid_json ? "not valid JSON"
                                            : status == jsonl_field_status::too_deep
                                                ? "nested deeper than " + std::to_string(jsonl_field_parser::max_depth) + " levels"
                                            : status == jsonl_field_status::missing_field ? "no \"" + opt_.field + "\" field"
                                                                                          : "field \"" + opt_.field + "\" is not a string";
                if (!opt_.skip_invalid) throw format_error(path_, line_offset_, "line " + std::to_string(line_no_) + ": " + problem);
                ++skipped_;
                ++number_;
                continue;
            }
            doc.line = line_no_;
            doc.offset = line_offset_;
            doc.end = offset_;
            doc.number = number_++;
            return true;
        }
        return false;
#else
        (void)doc;
        return false;
#endif
    }

    bool next_whole(text_document& doc) {
        if (done_) return false;
        done_ = true;
        std::error_code ec;
        const auto size = std::filesystem::file_size(path_, ec);
        if (!ec && opt_.max_line_bytes != 0 && size > opt_.max_line_bytes)
            throw format_error(path_, 0,
                               "a whole-file document of " + std::to_string(size) + " bytes is longer than max_line_bytes (" +
                                   std::to_string(opt_.max_line_bytes) + " bytes; raise text.documents.max_line_bytes, or split the file)");
        doc.text.assign(std::istreambuf_iterator<char>(in_), std::istreambuf_iterator<char>());
        if (in_.bad()) throw io_error(path_, errno, "read failed");
        doc.line = 1;
        doc.offset = 0;
        doc.end = doc.text.size();
        doc.number = number_++;
        return true;
    }

    bool next_line(text_document& doc) {
        bool too_long = false;
        for (;;) {
            if (!getline(doc.text, opt_.skip_invalid ? &too_long : nullptr)) return false;
            if (!too_long) break;
            ++skipped_;
            ++number_;
        }
        doc.line = line_no_;
        doc.offset = line_offset_;
        doc.end = offset_;
        doc.number = number_++;
        return true;
    }

    // A blank-line-separated block is a document, bounded like a line: a block longer than
    // max_line_bytes is a format_error naming where it starts (or, with skip_invalid, read to its end
    // without keeping it, and counted), never memory in proportion to a file without blank lines.
    bool next_block(text_document& doc) {
        std::string line;
        const std::uint64_t limit = opt_.max_line_bytes;
        for (;;) {
            doc.text.clear();
            bool started = false, too_long = false, long_line = false;
            while (getline(line, opt_.skip_invalid ? &long_line : nullptr)) {
                const bool blank = !long_line && std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); });
                if (blank) {
                    if (started) break;
                    continue;
                }
                if (!started) {
                    doc.line = line_no_;
                    doc.offset = line_offset_;
                    started = true;
                } else if (!too_long) {
                    doc.text += '\n';
                }
                if (too_long) continue;
                if (long_line || (limit != 0 && doc.text.size() + line.size() > limit)) {
                    if (!opt_.skip_invalid)
                        throw format_error(path_, doc.offset,
                                           "the document starting at line " + std::to_string(doc.line) +
                                               " (a blank-line-separated block) is longer than max_line_bytes (" + std::to_string(limit) +
                                               " bytes; raise text.documents.max_line_bytes, or separate its paragraphs with blank lines)");
                    too_long = true;
                    std::string().swap(doc.text);
                    continue;
                }
                doc.text += line;
                doc.end = offset_;
            }
            if (!started) return false;
            if (!too_long) {
                doc.number = number_++;
                return true;
            }
            ++skipped_;  // a block skipped whole: on to the next
            ++number_;
        }
    }

    std::string path_;
    text_options opt_;
    std::ifstream in_;
    jsonl_field_parser json_;
    bool jsonl_ = false;
    bool done_ = false;
    std::uint64_t line_no_ = 0, offset_ = 0, line_offset_ = 0, number_ = 0, skipped_ = 0;
};

// Expands text inputs (files, directories, globs) into a sorted list of files. Throws io_error when
// a path does not exist, a pattern matches nothing, or a path is not a regular file (a FIFO would
// block the reader forever).
inline std::vector<std::string> resolve_text_inputs(const std::vector<std::string>& inputs) {
    std::vector<std::string> out;
    for (const auto& in : inputs) {
        const expanded_location where = expand_location(in);
        if (where.kind == expanded_location::form::single && !scheme_for(in).exists(in)) throw io_error(in, ENOENT, "no such file");
        out.insert(out.end(), where.entries.begin(), where.entries.end());
    }
    for (const auto& f : out) require_regular_file(f);
    return out;
}

}  // namespace feedline
