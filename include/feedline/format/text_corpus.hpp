// feedline/format/text_corpus.hpp: random access to the documents of JSONL / plain-text files, for
// tokenizing on the fly. Opening scans every file once with text_reader (so the rules for what a
// document is are the ones feedline-pack uses) and keeps, per document, only where its bytes are:
// 16 bytes per document, never the text. document_text(i) re-reads those bytes through the file's byte
// source (pread for a local file, a ranged read for an object; thread-safe) and decodes them exactly as
// text_reader did (the same jsonl_field_parser). Feeds pipeline/text_source.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/format/jsonl_field.hpp>
#include <feedline/format/text.hpp>
#include <feedline/storage/byte_source.hpp>

namespace feedline {

class text_corpus {
public:
    struct document_ref {
        std::uint64_t offset = 0;  // where its bytes start in the file
        std::uint32_t length = 0;  // bytes, including a trailing newline
        std::uint32_t file = 0;    // index into files()
    };

    // Inputs: files, directories or globs (resolve_text_inputs). Throws io_error for missing files,
    // format_error for invalid JSONL lines (unless options.skip_invalid), config_error when there is
    // no document at all or one is larger than 4 GiB.
    explicit text_corpus(const std::vector<std::string>& inputs, text_options options = {}) : options_(std::move(options)) {
        for (const std::string& path : resolve_text_inputs(inputs)) {
            text_reader reader(path, options_);
            const auto index = static_cast<std::uint32_t>(files_.size());
            files_.push_back(reader.source());  // one descriptor (or object) per file, kept for random access
            jsonl_.push_back(reader.is_jsonl());
            text_document doc;
            while (reader.next(doc)) {
                if (doc.end - doc.offset > UINT32_MAX)
                    throw config_error("text document", path + ": a document at offset " + std::to_string(doc.offset) + " exceeds 4 GiB");
                documents_.push_back({doc.offset, static_cast<std::uint32_t>(doc.end - doc.offset), index});
                text_bytes_ += doc.text.size();
            }
            skipped_ += reader.skipped();
        }
        if (documents_.empty()) throw config_error("dataset", "no text documents in the given inputs");
    }

    std::uint64_t document_count() const noexcept { return documents_.size(); }
    std::size_t file_count() const noexcept { return files_.size(); }
    const byte_source& file_at(std::size_t i) const { return *files_.at(i); }
    const text_options& options() const noexcept { return options_; }
    const document_ref& document(std::uint64_t i) const { return documents_.at(i); }
    const byte_source& file_of(const document_ref& d) const { return *files_[d.file]; }
    std::uint64_t text_bytes() const noexcept { return text_bytes_; }
    std::uint64_t skipped() const noexcept { return skipped_; }
    std::uint64_t memory_bytes() const noexcept { return documents_.capacity() * sizeof(document_ref); }

    // What one thread needs to read documents: reused between calls, so reading allocates nothing
    // once the buffers have grown to the longest document.
    struct scratch {
        std::string raw;  // the document's bytes as on disk
        jsonl_field_parser json;
    };

    // The text of document i, as text_reader produced it. Thread-safe with one scratch per thread.
    // Throws io_error if the file shrank since opening, format_error if its bytes changed meaning.
    void document_text(std::uint64_t i, scratch& s, std::string& text) const {
        const document_ref& d = documents_.at(i);
        const byte_source& f = *files_[d.file];
        s.raw.resize(d.length);
        f.read_at(s.raw.data(), d.length, d.offset);  // format_error naming the file when it shrank
        if (jsonl_[d.file]) {
            if (s.json.extract(s.raw, options_.field, text) != jsonl_field_status::ok)
                throw format_error(f.name(), d.offset,
                                   "this JSONL line no longer holds a \"" + options_.field + "\" string (file changed?)");
            return;
        }
        if (options_.split == text_split::whole_file) {
            text = s.raw;
            return;
        }
        // One line, or a block of lines: drop the final newline, then each line's '\r', rejoin with '\n'.
        std::string_view bytes(s.raw);
        if (!bytes.empty() && bytes.back() == '\n') bytes.remove_suffix(1);
        text.clear();
        for (std::size_t start = 0;;) {
            std::size_t nl = bytes.find('\n', start);
            std::string_view line = bytes.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
            if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
            if (start > 0) text += '\n';
            text += line;
            if (nl == std::string_view::npos) break;
            start = nl + 1;
        }
    }

private:
    text_options options_;
    std::vector<std::shared_ptr<const byte_source>> files_;
    std::vector<bool> jsonl_;
    std::vector<document_ref> documents_;
    std::uint64_t text_bytes_ = 0, skipped_ = 0;
};

}  // namespace feedline
