// feedline/format/raw_tokens.hpp: headerless token files, named as "raw:<dtype>:<location>".
// nanoGPT's prepare.py writes train.bin/val.bin as nothing but tokens (np.uint16, GPT-2's <|endoftext|>
// after every document); other projects write uint32 or int32 the same way. Nothing in such a file says
// what it holds, so the spec names the dtype: "raw:uint16:data/openwebtext/train.bin". The location is
// any a shard may have: a file, a glob, a directory (its .bin files) or an s3:// URL.
// Unlike llm.c's delimiter, which begins a document, a raw file's delimiter ends one (nanoGPT appends
// it), so packed mode's documents keep their own end-of-text and never start with the previous one's.
// Fed by storage/; feeds format/dataset.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <feedline/error.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

namespace raw_layout {
inline constexpr std::string_view prefix = "raw:";
// The default document delimiter by dtype: GPT-2's <|endoftext|> (nanoGPT's uint16 files) and Llama 3's
// <|end_of_text|> for 32- and 64-bit tokens. 8-bit and int16 files have none (no id a model of that size
// reserves): packed mode reads each of them as one stream of documents cut at row ends. Only packed
// mode uses it; feedline-inspect --delimiter overrides it.
inline constexpr std::uint32_t gpt2_eot = 50256;
inline constexpr std::uint32_t llama3_eot = 128001;
inline constexpr std::uint32_t no_delimiter = 0x7fffffffu;  // no token of those dtypes (negative ones included) loads as it
inline constexpr std::uint32_t default_delimiter(token_dtype t) noexcept {
    return t == token_dtype::uint16 ? gpt2_eot : dtype_size(t) >= 4 ? llama3_eot : no_delimiter;
}
}  // namespace raw_layout

struct raw_spec {
    token_dtype dtype = token_dtype::uint16;
    std::optional<std::uint32_t> delimiter;  // "eot=<id>" or "eot=none"; else raw_layout::default_delimiter
    std::string location;                    // a file, glob, directory or URL
};

// Parses "raw:<dtype>:<location>" or "raw:<dtype>:eot=<id>:<location>" (the token that ends each
// document, for tokenizers other than GPT-2's and Llama 3's; "eot=none": no delimiter, packed rows cut
// documents only at row ends); nullopt for a spec that does not start with "raw:". Throws config_error
// naming the spec for a missing or non-integer dtype, a bad eot or an empty location.
inline std::optional<raw_spec> parse_raw_spec(const std::string& spec) {
    if (spec.rfind(raw_layout::prefix, 0) != 0) return std::nullopt;
    const std::string usage =
        "'" + spec + "': a headerless token file is named raw:<dtype>:<path> or raw:<dtype>:eot=<id>:<path>, e.g. raw:uint16:train.bin";
    const std::size_t colon = spec.find(':', raw_layout::prefix.size());
    if (colon == std::string::npos || colon + 1 == spec.size()) throw config_error("dataset", usage);
    const std::string name = spec.substr(raw_layout::prefix.size(), colon - raw_layout::prefix.size());
    raw_spec out;
    try {
        out.dtype = parse_dtype(name);
    } catch (const config_error&) {
        throw config_error("dataset", usage + " ('" + name + "' is not a dtype: uint8, int8, uint16, int16, uint32, int32 or int64)");
    }
    if (out.dtype == token_dtype::float32 || out.dtype == token_dtype::float64)
        throw config_error("dataset", usage + " (tokens are integers, not " + name + ")");
    out.location = spec.substr(colon + 1);
    if (out.location.rfind("eot=", 0) == 0) {
        const std::size_t end = out.location.find(':');
        const std::string value = out.location.substr(4, end == std::string::npos ? std::string::npos : end - 4);
        if (end == std::string::npos || end + 1 == out.location.size()) throw config_error("dataset", usage + " (no path after eot=)");
        if (value == "none") {
            out.delimiter = raw_layout::no_delimiter;
        } else {
            const bool digits = !value.empty() && value.size() <= 10 && value.find_first_not_of("0123456789") == std::string::npos;
            const std::uint64_t id = digits ? std::stoull(value) : UINT64_MAX;
            if (id >= raw_layout::no_delimiter)
                throw config_error("dataset", usage + " (eot=" + value + " is not a token id below 2^31, or none)");
            out.delimiter = static_cast<std::uint32_t>(id);
        }
        out.location = out.location.substr(end + 1);
    }
    if (out.location.empty()) throw config_error("dataset", usage + " (no path)");
    return out;
}

// One headerless token file opened and checked: its size must be a whole number of tokens. O(1).
class raw_token_file {
public:
    // Throws io_error (missing), format_error naming the file and the offset of a partial last token
    // or an empty file.
    raw_token_file(const std::string& location, token_dtype dtype) : bin_(open_byte_source(location)), dtype_(dtype) {
        const std::uint64_t size = bin_->size(), item = dtype_size(dtype);
        if (size == 0) throw format_error(bin_->name(), 0, "empty file (no tokens)");
        if (size % item != 0)
            throw format_error(bin_->name(), size - size % item,
                               std::to_string(size) + " bytes is not a whole number of " + std::string(to_string(dtype)) + " tokens (" +
                                   std::to_string(size % item) + " byte(s) left over): a truncated file, or not " +
                                   std::string(to_string(dtype)) + "?");
        tokens_ = size / item;
    }
    const byte_source& bin() const noexcept { return *bin_; }
    token_dtype dtype() const noexcept { return dtype_; }
    std::uint64_t tokens() const noexcept { return tokens_; }

private:
    std::unique_ptr<byte_source> bin_;
    token_dtype dtype_;
    std::uint64_t tokens_ = 0;
};

}  // namespace feedline
