// feedline/transform/sentencepiece_tokenizer.hpp: the tokenizer interface over libsentencepiece (the
// "sentencepiece" kind). The model is read by feedline (a regular file, bounded) and given to
// sentencepiece as bytes; what the model says about how it splits text is read from its protobuf, so a
// long document can be encoded in exact pieces. Ids equal `spm_encode --output_format=id` plus the
// BOS/EOS asked for. Registers itself; absent (and unregistered) without sentencepiece.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/crc.hpp>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>
#include <feedline/transform/tokenizer.hpp>

#if FEEDLINE_HAS_SENTENCEPIECE
#include <sentencepiece_processor.h>

namespace feedline {

namespace detail {

// What a sentencepiece model file says about how it splits text, read from its protobuf bytes
// (sentencepiece_model.proto: ModelProto.pieces = 1, .trainer_spec = 2, .normalizer_spec = 3;
// TrainerSpec.split_by_whitespace = 22, .treat_whitespace_as_suffix = 24; NormalizerSpec
// .add_dummy_prefix = 3, .remove_extra_whitespaces = 4, .escape_whitespaces = 5; SentencePiece.piece
// = 1, .type = 3, USER_DEFINED = 4). Fields absent take proto2's declared defaults.
struct model_splitting {
    bool split_by_whitespace = true, treat_whitespace_as_suffix = false;
    bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
    bool user_symbol_with_space = false;  // a user-defined piece that holds a space (U+2581 or ' ')
    bool parsed = false;
};

// A protobuf message's fields, one at a time. Malformed input ends the walk (parsed stays false).
class proto_reader {
public:
    explicit proto_reader(std::string_view bytes) : p_(bytes) {}
    // The next field: its number, wire type, varint value or length-delimited bytes. False at the end
    // or on malformed input (`ok()` tells which).
    bool next(std::uint32_t& field, std::uint32_t& wire, std::uint64_t& value, std::string_view& bytes) {
        if (at_ >= p_.size()) return false;
        std::uint64_t key = 0;
        if (!varint(key)) return fail();
        field = static_cast<std::uint32_t>(key >> 3);
        wire = static_cast<std::uint32_t>(key & 7);
        switch (wire) {
            case 0: return varint(value) || fail();
            case 1: return skip(8);
            case 5: return skip(4);
            case 2: {
                std::uint64_t n = 0;
                if (!varint(n) || n > p_.size() - at_) return fail();
                bytes = p_.substr(at_, n);
                at_ += n;
                return true;
            }
            default: return fail();
        }
    }
    bool ok() const noexcept { return ok_; }

private:
    bool varint(std::uint64_t& v) {
        v = 0;
        for (int shift = 0; shift < 64 && at_ < p_.size(); shift += 7) {
            const auto b = static_cast<unsigned char>(p_[at_++]);
            v |= std::uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return true;
        }
        return false;
    }
    bool skip(std::size_t n) {
        if (n > p_.size() - at_) return fail();
        at_ += n;
        return true;
    }
    bool fail() {
        ok_ = false;
        at_ = p_.size();
        return false;
    }
    std::string_view p_;
    std::size_t at_ = 0;
    bool ok_ = true;
};

// Sets each flag whose field number a message holds as a varint (protobuf's bool), and ignores the rest.
inline void read_flags(proto_reader& message, std::initializer_list<std::pair<std::uint32_t, bool*>> flags) {
    std::uint32_t f = 0, w = 0;
    std::uint64_t v = 0;
    std::string_view b;
    while (message.next(f, w, v, b))
        for (const auto& [number, flag] : flags)
            if (w == 0 && f == number) *flag = v != 0;
}

inline model_splitting read_model_splitting(std::string_view model) {
    model_splitting m;
    proto_reader top(model);
    std::uint32_t field = 0, wire = 0;
    std::uint64_t value = 0;
    std::string_view bytes;
    while (top.next(field, wire, value, bytes)) {
        if (wire != 2) continue;
        proto_reader inner(bytes);
        std::uint32_t f = 0, w = 0;
        std::uint64_t v = 0;
        std::string_view b;
        if (field == 1) {  // a piece: user-defined ones holding a space would be cut by a split
            std::string_view piece;
            std::uint64_t type = 1;
            while (inner.next(f, w, v, b)) {
                if (f == 1 && w == 2) piece = b;
                if (f == 3 && w == 0) type = v;
            }
            if (type == 4 && (piece.find(' ') != std::string_view::npos || piece.find("\xe2\x96\x81") != std::string_view::npos))
                m.user_symbol_with_space = true;
        } else if (field == 2) {  // TrainerSpec
            read_flags(inner, {{22, &m.split_by_whitespace}, {24, &m.treat_whitespace_as_suffix}});
        } else if (field == 3) {  // NormalizerSpec
            read_flags(inner, {{3, &m.add_dummy_prefix}, {4, &m.remove_extra_whitespaces}, {5, &m.escape_whitespaces}});
        }
        if (!inner.ok()) return {};
    }
    m.parsed = top.ok();
    return m;
}

// The largest sentencepiece model file feedline reads (real ones are 0.2-5 MB).
inline constexpr std::uint64_t max_model_bytes = std::uint64_t(1) << 30;

}  // namespace detail

class sentencepiece_tokenizer final : public tokenizer {
public:
    // Loads the model. Throws config_error naming `field` (the config field that named the model)
    // when it cannot be loaded or lacks a BOS/EOS piece that is asked for.
    explicit sentencepiece_tokenizer(const tokenizer_options& o, const std::string& field = "text.tokenizer") : options_(o) {
        if (o.model.empty()) throw config_error(field, "text input needs a tokenizer model");
        std::string bytes;
        try {
            bytes = read_regular_file(o.model, detail::max_model_bytes);
        } catch (const io_error& e) {
            throw config_error(field, e.what());
        }
        if (auto st = spm_.LoadFromSerializedProto(bytes); !st.ok())
            throw config_error(field, o.model + ": not a sentencepiece model (" + st.ToString() + ")");
        boost::crc_32_type crc;
        crc.process_bytes(bytes.data(), bytes.size());
        identity_ = "sentencepiece model crc32 " + std::to_string(crc.checksum()) + " bytes " + std::to_string(bytes.size()) + " bos " +
                    std::to_string(o.add_bos) + " eos " + std::to_string(o.add_eos);
        const auto m = detail::read_model_splitting(bytes);
        exact_pieces_ = m.parsed && m.split_by_whitespace && !m.treat_whitespace_as_suffix && m.add_dummy_prefix &&
                        m.remove_extra_whitespaces && m.escape_whitespaces && !m.user_symbol_with_space;
        if (o.add_bos && spm_.bos_id() < 0) throw config_error("text.add_bos", o.model + " has no BOS piece");
        if (o.add_eos && spm_.eos_id() < 0) throw config_error("text.add_eos", o.model + " has no EOS piece");
    }
    sentencepiece_tokenizer(const sentencepiece_tokenizer&) = delete;
    sentencepiece_tokenizer& operator=(const sentencepiece_tokenizer&) = delete;

    std::string_view kind() const noexcept override { return "sentencepiece"; }
    std::string identity() const override { return identity_; }
    int vocab_size() const override { return spm_.GetPieceSize(); }
    int bos_id() const override { return spm_.bos_id(); }
    int eos_id() const override { return spm_.eos_id(); }
    // Whether a long document may be encoded a piece at a time with the same ids as whole: the model
    // splits at every space anyway (split_by_whitespace, the space starting the next piece), collapses
    // runs of spaces and adds the dummy prefix, so a piece that starts with a space encodes as it would
    // in place; and no user-defined symbol holds a space.
    bool pieces_are_exact() const noexcept { return exact_pieces_; }

    // Replaces `out` with the document's ids (BOS/EOS added as configured). Returns an error text
    // (sentencepiece's, or why the document is too long to encode in bounded memory), empty on
    // success. A document longer than piece_bytes is encoded in pieces split before a space (ids equal
    // the whole document's; see pieces_are_exact); `cancel`, when given and set, stops between pieces
    // (an "interrupted" error). Allocates nothing once `out` and the buffers have grown.
    std::string encode(std::string_view text, std::vector<std::int32_t>& out, const std::atomic<bool>* cancel = nullptr) override {
        out.clear();
        if (options_.add_bos) out.push_back(spm_.bos_id());
        if (text.size() <= options_.piece_bytes) {
            if (auto problem = encode_piece(text, out); !problem.empty()) return problem;
        } else if (!exact_pieces_) {
            if (text.size() > options_.max_unsplit_bytes)
                return "a document of " + std::to_string(text.size()) + " bytes is longer than the " +
                       std::to_string(options_.max_unsplit_bytes) +
                       " this model may be given at once (its normalizer or a user-defined symbol keeps it from being split exactly at "
                       "spaces)";
            if (auto problem = encode_piece(text, out); !problem.empty()) return problem;
        } else {
            for (std::size_t start = 0; start < text.size();) {
                std::size_t end = text.size();
                if (text.size() - start > options_.piece_bytes) {
                    // Before the last space within the piece, else the first one after it.
                    std::size_t at = text.rfind(' ', start + options_.piece_bytes);
                    if (at == std::string_view::npos || at <= start) at = text.find(' ', start + options_.piece_bytes);
                    if (at != std::string_view::npos) end = at;
                    if (end - start > options_.max_unsplit_bytes)
                        return "a run of " + std::to_string(end - start) + " bytes without a space at byte " + std::to_string(start) +
                               " is longer than the " + std::to_string(options_.max_unsplit_bytes) + " sentencepiece may be given at once";
                }
                if (auto problem = encode_piece(text.substr(start, end - start), out); !problem.empty()) return problem;
                start = end;
                if (cancel && cancel->load(std::memory_order_relaxed) && start < text.size()) return "interrupted";
            }
        }
        if (options_.add_eos) out.push_back(spm_.eos_id());
        return {};
    }

private:
    std::string encode_piece(std::string_view text, std::vector<std::int32_t>& out) {
        if (auto st = spm_.Encode(text, &ids_); !st.ok()) return st.ToString();
        out.insert(out.end(), ids_.begin(), ids_.end());
        return {};
    }

    tokenizer_options options_;
    sentencepiece::SentencePieceProcessor spm_;
    std::vector<int> ids_;
    bool exact_pieces_ = false;
    std::string identity_;
};

namespace detail {
// Does `model` look like a sentencepiece model: a serialized ModelProto starts with its pieces (field
// 1, length-delimited: byte 0x0a). What is not a regular file is claimed too, so its error is the
// model loader's ("is a FIFO") rather than "no tokenizer recognizes it". Never blocks.
inline bool looks_like_sentencepiece(const std::string& model) {
    const int fd = ::open(model.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return true;
    struct stat st {};
    unsigned char first = 0x0a;
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const bool read = regular && ::pread(fd, &first, 1, 0) == 1;
    ::close(fd);
    return !regular || !read || first == 0x0a;
}

// Registered as "sentencepiece"; with kind "auto" it takes a model that looks like one.
inline const bool sentencepiece_registered =
    tokenizer_registry::add({.name = "sentencepiece",
                             .recognizes = [](const std::string& model) { return detail::looks_like_sentencepiece(model); },
                             .make = [](const tokenizer_options& o, const std::string& field) -> std::unique_ptr<tokenizer> {
                                 return std::make_unique<sentencepiece_tokenizer>(o, field);
                             }});

}  // namespace detail

}  // namespace feedline
#endif
