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
#include <cstring>
#include <memory>
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

// Reads documents from one JSONL or plain-text file or object without loading it whole (a whole-file
// document is one document, so it is loaded), through its byte source (storage/byte_source.hpp): a
// local file or a remote object alike, read in chunks up to the size it had when opened. Files ending
// in .jsonl / .json / .ndjson are JSONL. Not thread-safe.
class text_reader {
public:
    // Opens `location` through its storage scheme. Throws io_error when it is not a regular file (or an
    // object) or cannot be opened, config_error for JSONL without JSON support built.
    explicit text_reader(const std::string& location, text_options options = {})
            : text_reader(std::shared_ptr<const byte_source>(open_byte_source(location)), std::move(options)) {}

    // Reads an open source (shared: a corpus keeps it for random access afterwards).
    explicit text_reader(std::shared_ptr<const byte_source> source, text_options options = {})
            : source_(std::move(source)), opt_(std::move(options)), size_(source_->size()) {
        const std::string& name = source_->name();
        jsonl_ = detail::ends_with(name, ".jsonl") || detail::ends_with(name, ".json") || detail::ends_with(name, ".ndjson");
#if !FEEDLINE_HAS_JSON
        if (jsonl_)
            throw config_error("input", name + ": JSONL support not built (nlohmann_json was not found when feedline was configured)");
#endif
        // A remote object is read in larger pieces: each read is a request.
        const std::uint64_t chunk = source_->local_file() != nullptr ? std::uint64_t(256) << 10 : std::uint64_t(8) << 20;
        buffer_.resize(static_cast<std::size_t>(std::clamp<std::uint64_t>(size_, 1, chunk)));
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
    const std::string& path() const noexcept { return source_->name(); }
    const std::shared_ptr<const byte_source>& source() const noexcept { return source_; }

private:
    // The next chunk of the source into the buffer; false at its end.
    bool fill() {
        const std::uint64_t at = offset_;  // everything before it was consumed
        if (at >= size_) return false;
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buffer_.size(), size_ - at));
        source_->read_at(buffer_.data(), n, at);
        begin_ = 0;
        end_ = n;
        return true;
    }

    // One line, without its '\n' (and '\r'). A line over max_line_bytes is read no further: with
    // skip_invalid the rest is discarded and the line counted as skipped (`skipped` is set), else it
    // is a format_error. Reading stops at the limit, so memory stays bounded by it.
    bool getline(std::string& line, bool* skipped = nullptr) {
        line_offset_ = offset_;
        line.clear();
        if (offset_ >= size_) return false;
        const std::uint64_t limit = opt_.max_line_bytes;
        bool too_long = false;
        for (;;) {
            if (begin_ == end_ && !fill()) break;  // the last line has no newline
            const char* from = buffer_.data() + begin_;
            const std::size_t available = end_ - begin_;
            const auto* newline = static_cast<const char*>(std::memchr(from, '\n', available));
            const std::size_t stored = newline != nullptr ? static_cast<std::size_t>(newline - from) : available;
            const std::size_t taken = stored + (newline != nullptr ? 1 : 0);
            begin_ += taken;
            offset_ += taken;
            if (!too_long && limit != 0 && line.size() + stored > limit) {
                if (!opt_.skip_invalid || skipped == nullptr)
                    throw format_error(path(), line_offset_,
                                       "line " + std::to_string(line_no_ + 1) + " is longer than max_line_bytes (" + std::to_string(limit) +
                                           " bytes; raise text.documents.max_line_bytes for longer documents)");
                too_long = true;
                std::string().swap(line);
            }
            if (!too_long) line.append(from, stored);
            if (newline != nullptr) break;
        }
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
                if (!opt_.skip_invalid) throw format_error(path(), line_offset_, "line " + std::to_string(line_no_) + ": " + problem);
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
        if (opt_.max_line_bytes != 0 && size_ > opt_.max_line_bytes)
            throw format_error(path(), 0,
                               "a whole-file document of " + std::to_string(size_) + " bytes is longer than max_line_bytes (" +
                                   std::to_string(opt_.max_line_bytes) + " bytes; raise text.documents.max_line_bytes, or split the file)");
        doc.text.resize(static_cast<std::size_t>(size_));
        source_->read_at(doc.text.data(), size_, 0);
        offset_ = size_;
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
                        throw format_error(path(), doc.offset,
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

    std::shared_ptr<const byte_source> source_;
    text_options opt_;
    std::uint64_t size_ = 0;    // the source's size when opened: what is read
    std::vector<char> buffer_;  // the chunk being read: bytes [begin_, end_) are not consumed yet
    std::size_t begin_ = 0, end_ = 0;
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
    for (const auto& f : out)
        if (&scheme_for(f) == &local_storage()) require_regular_file(f);  // a remote object is checked when opened
    return out;
}

}  // namespace feedline
