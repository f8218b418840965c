// feedline/format/llmc.hpp: llm.c token shards, read and written.
// Layout (karpathy/llm.c dev/data/data_common.py, llmc/dataloader.h): a header of 256 little-endian
// int32 — [0] magic, [1] version, [2] token count — then the tokens. Magic 20240520 / version 1 holds
// uint16 tokens (GPT-2); magic 20240801 / version 7 holds uint32 tokens (Llama 3). There is no document
// index: each document begins with a delimiter token and may continue into the next shard.
// feedline extension: header[3] = 1 + the delimiter token id when feedline wrote the shard (llm.c writes
// 0 there and ignores it); 0 means "use llm.c's delimiter for this magic". Fed by storage/, feeds
// format/dataset.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <feedline/detail/shard_manifest.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/output/output_lock.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

namespace llmc_layout {
inline constexpr std::size_t header_ints = 256;
inline constexpr std::uint64_t header_bytes = header_ints * 4;
inline constexpr std::int32_t magic_uint16 = 20240520;
inline constexpr std::int32_t version_uint16 = 1;
inline constexpr std::int32_t magic_uint32 = 20240801;
inline constexpr std::int32_t version_uint32 = 7;
// llm.c's delimiters: GPT-2's <|endoftext|> and Llama 3's <|begin_of_text|>.
inline constexpr std::uint32_t gpt2_eot = 50256;
inline constexpr std::uint32_t llama3_bot = 128000;
// llm.c asserts a shard holds fewer than 2^31 tokens (the count is an int32).
inline constexpr std::uint64_t max_tokens = 0x7fffffffu;
}  // namespace llmc_layout

// Widest field first: 16 bytes, in every shard table entry of every domain of a mixture.
struct llmc_header {
    std::uint64_t tokens = 0;
    std::uint32_t delimiter = llmc_layout::gpt2_eot;
    token_dtype dtype = token_dtype::uint16;
    bool delimiter_recorded = false;  // true when header[3] carried it (feedline-written shard)
};

// Validates a shard header against the file size. `bytes` holds at least the first min(size, 1024)
// bytes of the file. Throws format_error naming `path`, the offset and what was expected.
inline llmc_header parse_llmc_header(std::span<const std::byte> bytes, std::uint64_t file_size, const std::string& path) {
    using namespace llmc_layout;
    if (file_size == 0) throw format_error(path, 0, "empty file (an llm.c shard starts with a 1024-byte header)");
    if (file_size < header_bytes || bytes.size() < header_bytes)
        throw format_error(path, std::min<std::uint64_t>(file_size, bytes.size()),
                           "truncated header: " + std::to_string(file_size) + " bytes, an llm.c header needs 1024");
    std::array<std::int32_t, 4> h{};
    std::memcpy(h.data(), bytes.data(), sizeof(h));
    llmc_header out;
    if (h[0] == magic_uint16) {
        if (h[1] != version_uint16)
            throw format_error(path, 4, "version " + std::to_string(h[1]) + " does not match magic 20240520 (expected version 1)");
        out.dtype = token_dtype::uint16;
        out.delimiter = gpt2_eot;
    } else if (h[0] == magic_uint32) {
        if (h[1] != version_uint32)
            throw format_error(path, 4, "version " + std::to_string(h[1]) + " does not match magic 20240801 (expected version 7)");
        out.dtype = token_dtype::uint32;
        out.delimiter = llama3_bot;
    } else {
        throw format_error(path, 0,
                           "wrong magic " + std::to_string(h[0]) +
                               ": expected 20240520 (uint16 tokens) or 20240801 (uint32 tokens); is this an llm.c shard?");
    }
    if (h[2] < 0) throw format_error(path, 8, "negative token count " + std::to_string(h[2]));
    out.tokens = static_cast<std::uint64_t>(h[2]);
    const std::uint64_t expected = header_bytes + out.tokens * dtype_size(out.dtype);
    if (file_size != expected)
        throw format_error(path, std::min(file_size, expected),
                           "token count " + std::to_string(out.tokens) + " in the header needs a file of " + std::to_string(expected) +
                               " bytes, the file has " + std::to_string(file_size) + (file_size < expected ? " (truncated)" : ""));
    if (h[3] != 0) {
        out.delimiter = static_cast<std::uint32_t>(h[3]) - 1;
        out.delimiter_recorded = true;
    }
    return out;
}

// One llm.c shard opened and validated (header only: O(1), no pass over the tokens).
class llmc_shard {
public:
    // Opens `path` through its storage scheme. Throws io_error (missing), format_error (bad header).
    explicit llmc_shard(const std::string& path) : llmc_shard(std::move(open_all({path}).front())) {}
    // Opens every shard, their headers read in one batch: for objects in remote storage, one round
    // trip for all of them instead of one per shard. Throws as the constructor does.
    static std::vector<llmc_shard> open_all(const std::vector<std::string>& paths) {
        std::vector<std::unique_ptr<byte_source>> sources;
        sources.reserve(paths.size());
        for (const auto& p : paths) sources.push_back(open_byte_source(p));
        std::vector<std::array<std::byte, llmc_layout::header_bytes>> headers(paths.size());
        std::vector<read_request> requests;
        for (std::size_t i = 0; i < paths.size(); ++i)
            requests.push_back(
                {sources[i].get(), 0, std::min<std::uint64_t>(sources[i]->size(), llmc_layout::header_bytes), headers[i].data()});
        detail::read_through_sources(requests);
        std::vector<llmc_shard> out;
        out.reserve(paths.size());
        for (std::size_t i = 0; i < paths.size(); ++i) {
            const auto& b = *sources[i];
            out.push_back(
                llmc_shard(std::move(sources[i]),
                           parse_llmc_header(std::span<const std::byte>(headers[i].data(), requests[i].length), b.size(), b.name())));
        }
        return out;
    }
    const byte_source& bin() const noexcept { return *bin_; }
    const llmc_header& header() const noexcept { return header_; }
    std::uint64_t tokens() const noexcept { return header_.tokens; }
    // Byte offset of token `i` in the file.
    static constexpr std::uint64_t token_offset(std::uint64_t i, token_dtype t) noexcept {
        return llmc_layout::header_bytes + i * dtype_size(t);
    }

private:
    llmc_shard(std::unique_ptr<byte_source> bin, llmc_header header) : bin_(std::move(bin)), header_(header) {}
    std::unique_ptr<byte_source> bin_;
    llmc_header header_;
};

// Writes llm.c shards "<prefix>_000000.bin", "<prefix>_000001.bin", ... each holding up to
// `shard_tokens` tokens. Every document is written as [delimiter, tokens...]; a document that does not
// fit continues in the next shard, as llm.c's own fineweb.py does. Shards appear under their final names
// only when complete. Holds the prefix's output lock while it lives (a second writer of the prefix is
// refused) and replaces only shards an earlier writer's manifest vouches for (detail/shard_manifest.hpp).
// Not thread-safe.
class llmc_writer {
public:
    // Throws config_error for a dtype or delimiter llm.c cannot hold, io_error when another writer
    // holds the prefix or files named like its shards are not an earlier pack's. `held`: a lock the
    // caller already holds on `prefix` (feedline-pack holds one for the whole run).
    llmc_writer(std::string prefix, token_dtype dtype, std::uint32_t delimiter, std::uint64_t shard_tokens = 100'000'000,
                const output_lock* held = nullptr)
            : prefix_(std::move(prefix)), dtype_(dtype), delimiter_(delimiter), shard_tokens_(shard_tokens) {
        if (dtype != token_dtype::uint16 && dtype != token_dtype::uint32)
            throw config_error("dtype", "llm.c shards hold uint16 or uint32 tokens, not " + std::string(to_string(dtype)));
        if (shard_tokens == 0 || shard_tokens > llmc_layout::max_tokens)
            throw config_error("shard_tokens", "must be in [1, 2^31-1], got " + std::to_string(shard_tokens));
        if (!detail::store_token(scratch_one_.data(), dtype_, 0, delimiter_))
            throw config_error("delimiter", "token " + std::to_string(delimiter) + " does not fit " + std::string(to_string(dtype)));
        if (!held) held = &own_lock_.emplace(prefix_);
        lock_ = held;
        outputs_.emplace(prefix_, std::vector<std::string>{".bin"}, *lock_);
    }

    // Appends [delimiter, tokens...]. Throws config_error when a token does not fit the dtype, io_error
    // when a write fails.
    template <class T>
    void add_document(std::span<const T> tokens) {
        const std::size_t item = dtype_size(dtype_);
        scratch_.resize((tokens.size() + 1) * item);
        detail::store_token(scratch_.data(), dtype_, 0, delimiter_);
        for (std::size_t i = 0; i < tokens.size(); ++i)
            if (tokens[i] < T{} || !detail::store_token(scratch_.data(), dtype_, i + 1, tokens[i]))
                throw config_error("dtype", "token " + std::to_string(tokens[i]) + " does not fit " + std::string(to_string(dtype_)) +
                                                " (document " + std::to_string(documents_) + ")");
        // Fill the current shard, continue the document in the next one when it does not fit.
        for (std::size_t done = 0; done < tokens.size() + 1;) {
            if (!current_) open_shard();
            std::uint64_t n = std::min<std::uint64_t>(tokens.size() + 1 - done, shard_tokens_ - current_tokens_);
            current_->write(scratch_.data() + done * item, n * item);
            current_tokens_ += n;
            done += n;
            if (current_tokens_ == shard_tokens_) close_shard();
        }
        ++documents_;
    }
    template <class T>
    void add_document(const std::vector<T>& tokens) {
        add_document(std::span<const T>(tokens));
    }

    std::uint64_t documents() const noexcept { return documents_; }

    // Completes the last shard and publishes every shard under its final name (only now, so an
    // interrupted pack leaves no shard set behind). The shards of an earlier pack into the same prefix
    // that its manifest vouches for are removed first (all of them, and the removal synced), so a pack
    // with fewer shards leaves none behind, and a kill while publishing leaves shards 0..k of this pack
    // alone, never mixed with an earlier pack's. Returns the shard paths. Throws io_error.
    std::vector<std::string> finish() {
        if (current_ || done_.empty()) {
            if (!current_) open_shard();
            close_shard();
        }
        std::vector<std::vector<file_identity>> ids;
        for (auto& s : done_) ids.push_back({s->identity()});
        outputs_->publish(ids, [&](std::size_t i) { done_[i]->commit(); });
        std::vector<std::string> paths;
        for (auto& s : done_) paths.push_back(s->path());
        return paths;
    }

    static std::string shard_path(const std::string& prefix, std::size_t index) {
        char num[24];
        std::snprintf(num, sizeof(num), "%06zu", index);
        return prefix + "_" + num + ".bin";
    }

private:
    void open_shard() {
        // One shard's bytes are buffered at a time: finished shards hold no buffer and no descriptor.
        current_ = std::make_unique<atomic_file>(shard_path(prefix_, done_.size()), 1u << 20, lock_->tag());
        std::array<std::byte, llmc_layout::header_bytes> zeros{};
        current_->write(zeros.data(), zeros.size());  // the real header is written at close
        current_tokens_ = 0;
    }
    void close_shard() {
        using namespace llmc_layout;
        std::array<std::int32_t, header_ints> header{};
        header[0] = dtype_ == token_dtype::uint16 ? magic_uint16 : magic_uint32;
        header[1] = dtype_ == token_dtype::uint16 ? version_uint16 : version_uint32;
        header[2] = static_cast<std::int32_t>(current_tokens_);
        header[3] = static_cast<std::int32_t>(delimiter_ + 1);
        current_->write_at(0, header.data(), header_bytes);
        current_->close_pending();
        current_->release_buffer();
        done_.push_back(std::move(current_));
    }

    std::optional<output_lock> own_lock_;
    const output_lock* lock_ = nullptr;
    std::optional<detail::numbered_outputs> outputs_;
    std::string prefix_;
    token_dtype dtype_;
    std::uint32_t delimiter_;
    std::uint64_t shard_tokens_;
    std::unique_ptr<atomic_file> current_;
    std::uint64_t current_tokens_ = 0;
    std::vector<std::unique_ptr<atomic_file>> done_;
    std::vector<std::byte> scratch_;
    std::array<std::byte, 8> scratch_one_{};
    std::uint64_t documents_ = 0;
};

}  // namespace feedline
