// feedline/format/token_lengths.hpp: a text corpus's token count per document for one tokenizer, as a
// file. The text source needs every document's length before it can lay out an epoch (the same
// sampler as for shards); computing them is a tokenizing pass, so they are kept in a cache file and
// the next open of the same corpus with the same tokenizer reads them instead.
// Layout, little-endian: "FLTOKLEN", u32 version (1), u32 key bytes, the key, u64 documents, u32 per
// document, then the CRC-32 of everything before it (u32). The key says what the lengths are valid
// for (tokenizer, options, each file's identity); a reader takes the lengths only for an equal key.
// Written under a temporary name, synced and renamed (output/atomic_file.hpp), so a reader never sees
// half a file; damage (truncation, a flipped bit, trailing bytes) is a format_error naming the offset.
// Read and written by pipeline/detail/text_token_counts.hpp, for pipeline/text_source.hpp.
#pragma once

#include <boost/crc.hpp>

#include <sys/stat.h>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <feedline/error.hpp>
#include <feedline/output/atomic_file.hpp>
#include <feedline/storage/file.hpp>

namespace feedline {

static_assert(std::endian::native == std::endian::little, "the token-lengths format is little-endian; add byte swaps for this target");

struct token_lengths {
    std::string key;
    std::vector<std::uint32_t> lengths;

    static constexpr char magic[8] = {'F', 'L', 'T', 'O', 'K', 'L', 'E', 'N'};
    static constexpr std::uint32_t version = 1;

    std::vector<std::byte> encode() const {
        std::vector<std::byte> out;
        auto put = [&](const void* p, std::size_t n) {
            if (n == 0) return;  // an empty key or no documents: data() may be null
            const auto* b = static_cast<const std::byte*>(p);
            out.insert(out.end(), b, b + n);
        };
        const auto key_bytes = static_cast<std::uint32_t>(key.size());
        const std::uint64_t n = lengths.size();
        put(magic, 8);
        put(&version, 4);
        put(&key_bytes, 4);
        put(key.data(), key.size());
        put(&n, 8);
        put(lengths.data(), lengths.size() * 4);
        boost::crc_32_type crc;
        crc.process_bytes(out.data(), out.size());
        const std::uint32_t sum = crc.checksum();
        put(&sum, 4);
        return out;
    }

    // Throws format_error naming `name` and the offset for anything but a complete, intact file.
    static token_lengths decode(std::span<const std::byte> in, const std::string& name) {
        std::size_t at = 0;
        auto fail = [&](const std::string& what) { throw format_error(name, at, what); };
        auto take = [&](void* dest, std::uint64_t n) {
            if (in.size() - at < n) fail("truncated (needs " + std::to_string(n) + " more bytes)");
            if (n) std::memcpy(dest, in.data() + at, n);  // an empty key or no documents: dest may be null
            at += n;
        };
        if (in.size() < 8 || std::memcmp(in.data(), magic, 8) != 0) fail("not a feedline token-lengths file (magic FLTOKLEN)");
        at = 8;
        std::uint32_t v = 0, key_bytes = 0;
        take(&v, 4);
        if (v != version) fail("unsupported version " + std::to_string(v));
        take(&key_bytes, 4);
        if (key_bytes > in.size() - at)
            fail("a key of " + std::to_string(key_bytes) + " bytes does not fit the remaining " + std::to_string(in.size() - at));
        token_lengths out;
        out.key.resize(key_bytes);
        take(out.key.data(), key_bytes);
        std::uint64_t n = 0;
        take(&n, 8);
        if (n > (in.size() - at) / 4)
            fail(std::to_string(n) + " documents do not fit the remaining " + std::to_string(in.size() - at) + " bytes");
        out.lengths.resize(n);
        take(out.lengths.data(), n * 4);
        boost::crc_32_type crc;
        crc.process_bytes(in.data(), at);
        std::uint32_t sum = 0;
        take(&sum, 4);
        if (sum != crc.checksum()) {
            at -= 4;
            fail("checksum mismatch: the file is damaged");
        }
        if (at != in.size()) fail("trailing bytes");
        return out;
    }

    // The lengths stored at `path` for `key`: nullopt when there is no such file or it holds another
    // key (a changed corpus or tokenizer). Throws format_error when the file is damaged, io_error when
    // it cannot be read (a directory or FIFO in its place included).
    static std::optional<std::vector<std::uint32_t>> read(const std::string& path, const std::string& key) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
        const file f(path);
        std::vector<std::byte> bytes(f.size());
        detail::pread_exact(f.use().fd(), path, bytes.data(), bytes.size(), 0);
        token_lengths t = decode(bytes, path);
        if (t.key != key) return std::nullopt;
        return std::move(t.lengths);
    }

    // Writes atomically (temporary name, fsync, rename, directory fsync). Throws io_error.
    void write(const std::string& path) const {
        const std::vector<std::byte> bytes = encode();
        atomic_file out(path);
        out.write(bytes.data(), bytes.size());
        out.commit();
    }
};

}  // namespace feedline
