// feedline/format/megatron.hpp: Megatron-LM's indexed dataset (<prefix>.bin + <prefix>.idx), read and written.
// Layout (megatron/core/datasets/indexed_dataset.py, little-endian, arrays unaligned from byte 34):
//   9-byte magic "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code | u64 sequence count S |
//   u64 document count D | int32 lengths[S] | int64 byte pointers[S] | int64 document indices[D]
//   (| int8 modes[S] for multimodal data). D counts the leading 0: document j is sequences [idx[j], idx[j+1]).
// feedline samples sequences (what Megatron's GPTDataset calls documents); the document index is
// validated and exposed. Fed by storage/, feeds format/dataset.hpp.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <feedline/detail/paths.hpp>
#include <feedline/detail/prefetch.hpp>
#include <feedline/detail/shard_manifest.hpp>
#include <feedline/format/dtype.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/output/output_lock.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/storage/guarded_copy.hpp>
#include <feedline/storage/mmap_reader.hpp>
#include <feedline/storage/storage_scheme.hpp>

namespace feedline {

// The .idx header, field after field: magic, version (u64), dtype code (u8), sequence count (u64),
// document count (u64); the arrays follow it.
namespace megatron_layout {
inline constexpr std::array<char, 9> magic = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t version = 1;
inline constexpr std::uint64_t version_offset = magic.size();
inline constexpr std::uint64_t dtype_offset = version_offset + sizeof(std::uint64_t);
inline constexpr std::uint64_t sequence_count_offset = dtype_offset + sizeof(std::uint8_t);
inline constexpr std::uint64_t document_count_offset = sequence_count_offset + sizeof(std::uint64_t);
inline constexpr std::uint64_t header_size = document_count_offset + sizeof(std::uint64_t);
static_assert(header_size == 34, "Megatron's .idx header is 34 bytes");
}  // namespace megatron_layout

// A validated .idx, parsed from bytes. Keeps only offsets into the bytes, so opening an index with
// 10^8 sequences costs one validation pass and no copies. The bytes must outlive the view. Every read
// of the bytes is a guarded copy: an .idx truncated under a running job is a format_error naming it,
// not a SIGBUS (storage/guarded_copy.hpp).
class megatron_index_view {
public:
    // Validates everything that can be checked without the .bin: magic, version, dtype code, that the
    // array sizes add up to the file size, and that the document index starts at 0, never decreases
    // and ends at S. `bin_size` (when known) also bounds every sequence. Throws format_error naming
    // `path`, the byte offset and what was expected.
    megatron_index_view(std::span<const std::byte> bytes, std::string path, std::optional<std::uint64_t> bin_size = std::nullopt)
            : bytes_(bytes), own_path_(new const std::string(std::move(path))) {
        try {
            check(bin_size);
        } catch (...) {
            delete own_path_;
            throw;
        }
    }
    // The same for a pair's .idx (megatron_shard), named in errors after its pair's .bin, <prefix>.bin
    // to <prefix>.idx, instead of a path of its own: a mixture keeps a pair per domain, and a second
    // path was 48 of its bytes on the heap. `pair_bin` must outlive the view.
    megatron_index_view(std::span<const std::byte> bytes, const byte_source& pair_bin, std::optional<std::uint64_t> bin_size)
            : bytes_(bytes), pair_bin_(&pair_bin), named_by_bin_(true) {
        check(bin_size);
    }
    megatron_index_view(const megatron_index_view&) = delete;
    megatron_index_view& operator=(const megatron_index_view&) = delete;
    ~megatron_index_view() {
        if (!named_by_bin_) delete own_path_;
    }

    token_dtype dtype() const noexcept { return dtype_; }
    std::uint64_t sequence_count() const noexcept { return sequences_; }
    // Number of entries in the document index, including its leading 0 (as Megatron stores it).
    std::uint64_t document_index_size() const noexcept { return documents_; }
    bool has_modes() const noexcept { return has_modes_; }
    std::span<const std::byte> bytes() const noexcept { return bytes_; }

    // Sequence i's entries, for i < sequence_count() (unchecked). Throw format_error only when the mapped
    // file shrank under the view.
    std::uint32_t length(std::uint64_t i) const {
        std::int32_t v;
        load(&v, lengths_offset() + 4 * i, 4);
        return static_cast<std::uint32_t>(v);
    }
    std::uint64_t pointer(std::uint64_t i) const { return static_cast<std::uint64_t>(i64(pointers_offset() + 8 * i)); }
    // Both of sequence i's entries, under one guard (what reading it takes).
    struct sequence_entry {
        std::uint64_t pointer = 0;  // bytes into the .bin
        std::uint32_t length = 0;   // tokens
    };
    sequence_entry sequence(std::uint64_t i) const {
        sequence_entry e;
        if (!detail::guarded_reads([&](detail::sigbus_guard& guard) noexcept { e = sequence_in(guard, i); })) throw shrank_under(i);
        return e;
    }
    // The .idx's path, as errors name it.
    std::string path() const { return named_by_bin_ ? detail::strip_suffix(pair_bin_->name(), ".bin") + ".idx" : *own_path_; }
    // The error for a read of sequence i's entries that faulted: the file shrank under the view. Names
    // the first of the two entries past the file's end now (its length's, else its pointer's).
    format_error shrank_under(std::uint64_t i) const {
        struct stat st {};
        const std::string path = this->path();
        const bool lengths_gone = ::stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) < lengths_offset() + 4 * (i + 1);
        return detail::file_shrank_error(path, lengths_gone ? lengths_offset() + 4 * i : pointers_offset() + 8 * i);
    }
    // sequence(i), read under a guard the caller holds (detail::guarded_reads): a batch's entries under
    // one recovery point, each a pair of plain loads instead of a guarded copy apiece.
    sequence_entry sequence_in(detail::sigbus_guard& guard, std::uint64_t i) const noexcept {
        const std::byte* len = bytes_.data() + lengths_offset() + 4 * i;
        const std::byte* ptr = bytes_.data() + pointers_offset() + 8 * i;
        std::int32_t l;
        std::int64_t p;
        guard.covering(len, sizeof l);
        detail::copy_from_mapping(&l, len, sizeof l);
        guard.covering(ptr, sizeof p);
        detail::copy_from_mapping(&p, ptr, sizeof p);
        return {static_cast<std::uint64_t>(p), static_cast<std::uint32_t>(l)};
    }
    // Requests sequence i's entries into the cache (a batch's random entries miss; their misses overlap
    // when all are requested before the first is read).
    void prefetch_sequence(std::uint64_t i) const noexcept {
        detail::prefetch(bytes_.data() + lengths_offset() + 4 * i);
        detail::prefetch(bytes_.data() + pointers_offset() + 8 * i);
    }
    // Requests the view's own fields (what prefetch_sequence and sequence_in read first).
    void prefetch_self() const noexcept {
        detail::prefetch(&bytes_);
        detail::prefetch(&sequences_);
    }
    std::uint64_t document_index(std::uint64_t j) const { return static_cast<std::uint64_t>(i64(documents_offset() + 8 * j)); }
    std::uint64_t total_tokens() const noexcept { return total_tokens_; }
    // One past the last byte of the .bin any sequence covers (Megatron writes sequences back to back,
    // so this is the .bin's size).
    std::uint64_t data_end() const noexcept { return data_end_; }

    std::uint64_t lengths_offset() const noexcept { return megatron_layout::header_size; }
    std::uint64_t pointers_offset() const noexcept { return lengths_offset() + 4 * sequences_; }
    std::uint64_t documents_offset() const noexcept { return pointers_offset() + 8 * sequences_; }

private:
    [[noreturn]] void fail(std::uint64_t offset, const std::string& what) const { throw format_error(path(), offset, what); }
    void load(void* dest, std::uint64_t off, std::size_t n) const {
        if (!detail::guarded_copy(dest, bytes_.data() + off, n)) throw detail::file_shrank_error(path(), off);
    }
    std::uint64_t u64(std::uint64_t off) const {
        std::uint64_t v;
        load(&v, off, 8);
        return v;
    }
    std::int64_t i64(std::uint64_t off) const {
        std::int64_t v;
        load(&v, off, 8);
        return v;
    }

    // Everything the constructors validate (above).
    void check(std::optional<std::uint64_t> bin_size) {
        using namespace megatron_layout;
        if (bytes_.size() < header_size)
            fail(bytes_.size(),
                 "truncated index: " + std::to_string(bytes_.size()) + " bytes, the header alone needs " + std::to_string(header_size));
        std::array<char, header_size> header{};
        load(header.data(), 0, header_size);
        if (std::memcmp(header.data(), magic.data(), magic.size()) != 0)
            fail(0, "wrong magic: expected \"MMIDIDX\\0\\0\" (a Megatron-LM .idx file)");
        if (auto v = u64(version_offset); v != version) fail(version_offset, "unknown version " + std::to_string(v) + " (expected 1)");
        auto code = static_cast<std::uint8_t>(header[dtype_offset]);
        auto dt = detail::dtype_from_megatron_code(code);
        if (!dt) fail(dtype_offset, "unknown dtype code " + std::to_string(code) + " (expected 1-8)");
        dtype_ = *dt;
        sequences_ = u64(sequence_count_offset);
        documents_ = u64(document_count_offset);
        // Guard the size arithmetic against counts that would overflow (a corrupt header).
        const std::uint64_t limit = std::uint64_t(1) << 56;
        if (sequences_ > limit || documents_ > limit)
            fail(sequences_ > limit ? sequence_count_offset : document_count_offset,
                 "implausible count (sequences " + std::to_string(sequences_) + ", documents " + std::to_string(documents_) + ")");
        const std::uint64_t expected = header_size + sequences_ * 12 + documents_ * 8;
        if (bytes_.size() == expected + sequences_ && sequences_ > 0)
            has_modes_ = true;  // multimodal datasets append one int8 mode per sequence
        else if (bytes_.size() != expected)
            fail(std::min<std::uint64_t>(bytes_.size(), expected),
                 "sizes do not add up: " + std::to_string(sequences_) + " sequences and " + std::to_string(documents_) +
                     " document indices need " + std::to_string(expected) + " bytes, the file has " + std::to_string(bytes_.size()) +
                     (bytes_.size() < expected ? " (truncated)" : ""));
        if (documents_ == 0) fail(document_count_offset, "document index is empty (it must hold at least the leading 0)");
        validate(bin_size);
    }

    // One pass over the arrays, copied out in chunks (one guarded copy per chunk, not per entry).
    void validate(std::optional<std::uint64_t> bin_size) {
        constexpr std::uint64_t chunk = 8192;
        const std::uint64_t item = dtype_size(dtype_);
        std::vector<std::int32_t> lengths(std::min(chunk, sequences_));
        std::vector<std::int64_t> values(std::min(chunk, std::max(sequences_, documents_)));
        for (std::uint64_t first = 0; first < sequences_; first += chunk) {
            const std::uint64_t n = std::min(chunk, sequences_ - first);
            load(lengths.data(), lengths_offset() + 4 * first, 4 * n);
            load(values.data(), pointers_offset() + 8 * first, 8 * n);
            for (std::uint64_t k = 0; k < n; ++k) {
                const std::uint64_t i = first + k;
                const std::int32_t len = lengths[k];
                if (len < 0)
                    fail(lengths_offset() + 4 * i, "sequence " + std::to_string(i) + " has negative length " + std::to_string(len));
                const std::int64_t ptr = values[k];
                if (ptr < 0 || static_cast<std::uint64_t>(ptr) % item != 0)
                    fail(pointers_offset() + 8 * i, "sequence " + std::to_string(i) + " has invalid byte pointer " + std::to_string(ptr) +
                                                        " (must be >= 0 and a multiple of " + std::to_string(item) + ")");
                const std::uint64_t end = static_cast<std::uint64_t>(ptr) + static_cast<std::uint64_t>(len) * item;
                if (bin_size && end > *bin_size)
                    fail(pointers_offset() + 8 * i, "sequence " + std::to_string(i) + " spans bytes [" + std::to_string(ptr) + ", " +
                                                        std::to_string(end) + ") beyond the .bin size " + std::to_string(*bin_size));
                total_tokens_ += static_cast<std::uint64_t>(len);
                data_end_ = std::max(data_end_, end);
            }
        }
        std::int64_t prev = 0;
        for (std::uint64_t first = 0; first < documents_; first += chunk) {
            const std::uint64_t n = std::min(chunk, documents_ - first);
            load(values.data(), documents_offset() + 8 * first, 8 * n);
            for (std::uint64_t k = 0; k < n; ++k) {
                const std::uint64_t j = first + k;
                const std::int64_t d = values[k];
                if (j == 0 && d != 0) fail(documents_offset(), "document index must start at 0, found " + std::to_string(d));
                if (d < prev)
                    fail(documents_offset() + 8 * j, "document index decreases: entry " + std::to_string(j) + " is " + std::to_string(d) +
                                                         " after " + std::to_string(prev));
                if (static_cast<std::uint64_t>(d) > sequences_)
                    fail(documents_offset() + 8 * j, "document index entry " + std::to_string(j) + " = " + std::to_string(d) +
                                                         " exceeds the sequence count " + std::to_string(sequences_));
                prev = d;
            }
        }
        if (static_cast<std::uint64_t>(prev) != sequences_)
            fail(documents_offset() + 8 * (documents_ - 1),
                 "document index ends at " + std::to_string(prev) + ", expected the sequence count " + std::to_string(sequences_));
    }

    std::span<const std::byte> bytes_;
    // A view's own path (on the heap, owned: views alone are few), or for a pair's its .bin, whose
    // name leads to it (named_by_bin_, in the padding below): one word either way, where a string in
    // the view was 32 bytes and a pair's a heap block more.
    union {
        const std::string* own_path_;
        const byte_source* pair_bin_;
    };
    std::uint64_t sequences_ = 0, documents_ = 0, total_tokens_ = 0, data_end_ = 0;
    token_dtype dtype_ = token_dtype::uint16;
    bool has_modes_ = false;
    bool named_by_bin_ = false;
};

// One Megatron shard opened for reading: <prefix>.idx held in memory (mapped, for a local file) and
// validated, <prefix>.bin open, both through their storage scheme (storage/storage_scheme.hpp).
// Immutable after construction; thread-safe to share between readers.
class megatron_shard {
public:
    // Throws io_error when a file is missing and format_error when the index is invalid or does not
    // describe the .bin beside it. The two files are checked to be one pair: after both local files are
    // open, the names must still lead to them (a pack publishing the prefix meanwhile is waited out, up
    // to about two seconds, never paired across), and the index must cover the .bin exactly (a .bin
    // longer than its index says was not written with it).
    explicit megatron_shard(const std::string& prefix) : megatron_shard(open_pair(prefix)) {}
    megatron_shard(const megatron_shard&) = delete;
    megatron_shard& operator=(const megatron_shard&) = delete;
    ~megatron_shard() { whole_object::free_taken(index_.bytes(), idx_mapped_); }

    // The prefix it was opened by (its .bin's name, less the suffix: a mixture holds a pair per domain,
    // and kept paths were a fifth of a domain's bytes).
    std::string prefix() const { return detail::strip_suffix(bin_->name(), ".bin"); }
    const megatron_index_view& index() const noexcept { return index_; }
    const byte_source& bin() const noexcept { return *bin_; }
    token_dtype dtype() const noexcept { return index_.dtype(); }

private:
    using source_pair = std::pair<std::unique_ptr<byte_source>, std::unique_ptr<byte_source>>;

    // The .idx is loaded (a local one mapped) and its source closed with `pair`: a shard holds one
    // descriptor, its .bin's.
    explicit megatron_shard(source_pair pair) : megatron_shard(std::move(pair.second), whole_object::load(*pair.first)) {}
    // `idx` holds the bytes until the pair is checked; then the index view's span is what holds them.
    megatron_shard(std::unique_ptr<byte_source> bin, whole_object idx)
            : bin_(std::move(bin)), index_(idx.bytes(), *bin_, bin_->size()), idx_mapped_(idx.mapped()) {
        if (index_.data_end() != bin_->size())
            throw format_error(bin_->name(), index_.data_end(),
                               "the .bin holds " + std::to_string(bin_->size()) + " bytes but its index (" + index_.path() +
                                   ") ends at byte " + std::to_string(index_.data_end()) +
                                   ": the two were not written together (a re-pack replaced one of them?)");
        idx.take();
    }

    // Is the local file now at `path` the one `s` has open? (Other sources: nothing to check.)
    static bool still_at(const byte_source& s, const std::string& path) {
        const file* f = s.local_file();
        return f == nullptr || f->still_at(path);
    }
    // Opens the .idx, then the .bin, then checks both names still lead to what was opened: a writer
    // publishes by removing the old .idx before renaming the new .bin in (megatron_writer::commit), so
    // an old .idx opened before a new .bin is always seen here as a changed name.
    static source_pair open_pair(const std::string& prefix) {
        const std::string idx = prefix + ".idx", bin = prefix + ".bin";
        const storage_scheme& scheme = scheme_for(prefix);
        for (int attempt = 0;; ++attempt) {
            try {
                auto i = scheme.open(idx);
                auto b = scheme.open(bin);
                if (still_at(*i, idx) && still_at(*b, bin)) return {std::move(i), std::move(b)};
            } catch (const io_error& e) {
                if (attempt == 0 || e.error_code() != ENOENT) throw;  // missing from the start: no retry
            }
            if (attempt == 200)
                throw io_error(
                    idx, EAGAIN,
                    "the pair " + prefix + ".idx/.bin kept changing while it was opened for two seconds (a pack is publishing it?)");
            ::usleep(10'000);
        }
    }

    std::unique_ptr<byte_source> bin_;
    // Over the .idx's bytes, which it holds (whole_object::take: their span kept once, 80 bytes a pair,
    // one of the allocator's 96-byte chunks; a mixture keeps a pair per domain).
    megatron_index_view index_;
    bool idx_mapped_;  // the bytes are a mapping (else a copy from new[])
};
static_assert(sizeof(void*) != 8 || sizeof(megatron_shard) == 80, "a mixture keeps a pair per domain (bench_mixture)");

// Writes a Megatron dataset exactly as Megatron-LM's IndexedDatasetBuilder does: one sequence per
// document, document index with its leading 0. Files appear under their final names only after
// finish(); destroying an unfinished writer removes its temporary files. Holds the prefix's output lock
// while it lives (output/output_lock.hpp): a second writer of the same prefix is refused at once.
class megatron_writer {
public:
    // Throws config_error when the dtype has no Megatron code (uint32), io_error when a file cannot
    // be created or another writer holds the prefix. `held`: a lock the caller already holds, on this
    // prefix or on the set it belongs to (megatron_shards_writer, feedline-pack).
    megatron_writer(std::string prefix, token_dtype dtype, const output_lock* held = nullptr)
            : prefix_(std::move(prefix)),
              dtype_(dtype),
              lock_(held ? held : &own_lock_.emplace(prefix_)),
              bin_(prefix_ + ".bin", 1u << 20, lock_->tag()),
              document_index_{0} {
        if (!detail::megatron_code(dtype))
            throw config_error("dtype", std::string(to_string(dtype)) + " has no Megatron dtype code; use int32");
    }

    // Appends one document. Throws config_error when a token does not fit the dtype, io_error when the
    // write fails (ENOSPC names the path). Not thread-safe.
    template <class T>
    void add_document(std::span<const T> tokens) {
        if (tokens.size() > 0x7fffffffu) throw config_error("document", "longer than 2^31-1 tokens (int32 length)");
        scratch_.resize(tokens.size() * dtype_size(dtype_));
        for (std::size_t i = 0; i < tokens.size(); ++i)
            if (!detail::store_token(scratch_.data(), dtype_, i, tokens[i]))
                throw config_error("dtype", "token " + std::to_string(tokens[i]) + " does not fit " + std::string(to_string(dtype_)) +
                                                " (document " + std::to_string(lengths_.size()) + ")");
        pointers_.push_back(static_cast<std::int64_t>(bin_.size()));
        lengths_.push_back(static_cast<std::int32_t>(tokens.size()));
        bin_.write(scratch_.data(), scratch_.size());
        document_index_.push_back(static_cast<std::int64_t>(lengths_.size()));
    }
    template <class T>
    void add_document(const std::vector<T>& tokens) {
        add_document(std::span<const T>(tokens));
    }

    std::uint64_t documents() const noexcept { return documents_ + lengths_.size(); }
    std::uint64_t bytes_written() const noexcept { return bin_.size(); }
    const std::string& prefix() const noexcept { return prefix_; }

    // Writes the .idx and closes both files under temporary names, keeping no buffer or index array
    // in memory (a writer of many shards holds only their names). Throws io_error.
    void close() {
        using namespace megatron_layout;
        if (idx_) return;
        idx_.emplace(prefix_ + ".idx", 1u << 20, lock_->tag());
        idx_->write(magic.data(), magic.size());
        std::uint64_t v = version;
        idx_->write(&v, 8);
        std::uint8_t code = *detail::megatron_code(dtype_);
        idx_->write(&code, 1);
        std::uint64_t s = lengths_.size(), d = document_index_.size();
        idx_->write(&s, 8);
        idx_->write(&d, 8);
        idx_->write(lengths_.data(), lengths_.size() * 4);
        idx_->write(pointers_.data(), pointers_.size() * 8);
        idx_->write(document_index_.data(), document_index_.size() * 8);
        bin_.close_pending();
        idx_->close_pending();
        bin_.release_buffer();
        idx_->release_buffer();
        documents_ = lengths_.size();
        for (auto* v32 : {&lengths_}) std::vector<std::int32_t>().swap(*v32);
        for (auto* v64 : {&pointers_, &document_index_}) std::vector<std::int64_t>().swap(*v64);
    }

    // The identities of the .bin and the .idx (in that order) under their temporary names, after close().
    std::vector<file_identity> identities() {
        close();
        return {bin_.identity(), idx_->identity()};
    }

    // Publishes the pair so that no crash point leaves a .bin and an .idx that validate together
    // unless they were written together: an older .idx under the final name is removed first (and the
    // removal synced), then the .bin is renamed and synced, then the .idx. Killed anywhere in between,
    // the prefix has no .idx, so it is no dataset (an older .bin beside a newer .idx, or the reverse,
    // cannot happen even when their sizes would agree). Readers check the pair they opened is the one
    // under the names after opening both (megatron_shard). Writers of several shards close() them all,
    // then commit() them all.
    void commit() {
        close();
        const std::string idx_path = prefix_ + ".idx";
        if (::unlink(idx_path.c_str()) != 0 && errno != ENOENT) throw io_error(idx_path, errno, "cannot remove the older index");
        sync_parent_directory(idx_path);
        bin_.commit();
        idx_->commit();
    }

    // close() then commit().
    void finish() { commit(); }

private:
    std::string prefix_;
    token_dtype dtype_;
    std::optional<output_lock> own_lock_;
    const output_lock* lock_;
    atomic_file bin_;
    std::vector<std::int32_t> lengths_;
    std::vector<std::int64_t> pointers_;
    std::vector<std::int64_t> document_index_;
    std::vector<std::byte> scratch_;
    std::optional<atomic_file> idx_;
    std::uint64_t documents_ = 0;
};

// Writes a Megatron dataset as numbered pairs "<prefix>_000000.bin/.idx", ..., starting a new pair once
// the current .bin holds `shard_bytes` (0: one pair, "<prefix>_000000"). Published together by
// finish(): the pairs of an earlier pack into the prefix that its manifest vouches for are replaced,
// anything else named like them is refused (detail/shard_manifest.hpp). Not thread-safe.
class megatron_shards_writer {
public:
    // Throws as megatron_writer, and io_error naming files numbered like this set's shards that no
    // manifest of an earlier pack vouches for. `held`: a lock the caller already holds on `prefix`.
    megatron_shards_writer(std::string prefix, token_dtype dtype, std::uint64_t shard_bytes, const output_lock* held = nullptr)
            : prefix_(std::move(prefix)),
              dtype_(dtype),
              shard_bytes_(shard_bytes),
              lock_(held ? held : &own_lock_.emplace(prefix_)),
              outputs_(prefix_, {".bin", ".idx"}, *lock_) {
        open_next();
    }

    template <class T>
    void add_document(std::span<const T> tokens) {
        if (shard_bytes_ && shards_.back()->bytes_written() >= shard_bytes_) {
            shards_.back()->close();
            open_next();
        }
        shards_.back()->add_document(tokens);
    }
    template <class T>
    void add_document(const std::vector<T>& tokens) {
        add_document(std::span<const T>(tokens));
    }

    // Closes and publishes every pair; returns their prefixes. Throws io_error.
    std::vector<std::string> finish() {
        std::vector<std::vector<file_identity>> ids;
        for (auto& w : shards_) ids.push_back(w->identities());
        outputs_.publish(ids, [&](std::size_t i) { shards_[i]->commit(); });
        std::vector<std::string> out;
        for (auto& w : shards_) out.push_back(w->prefix());
        return out;
    }

private:
    void open_next() {
        shards_.push_back(
            std::make_unique<megatron_writer>(detail::strip_suffix(outputs_.path(shards_.size(), ".bin"), ".bin"), dtype_, lock_));
    }
    std::string prefix_;
    token_dtype dtype_;
    std::uint64_t shard_bytes_;
    std::optional<output_lock> own_lock_;
    const output_lock* lock_;
    detail::numbered_outputs outputs_;
    std::vector<std::unique_ptr<megatron_writer>> shards_;
};

}  // namespace feedline
