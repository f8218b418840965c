// feedline/transform/sentencepiece_model.hpp: a sentencepiece .model file read by feedline, without
// libsentencepiece: its pieces (text, score, type), the trainer flags that decide how text is split and
// the normalizer (its precompiled character map). Read from the protobuf bytes with a small wire-format
// reader, so feedline's own encoder (transform/spm_encoder.hpp) works where the library is absent, and
// the library's tokenizer can ask how a model splits text.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/crc.hpp>

#include <feedline/error.hpp>
#include <feedline/storage/file.hpp>

namespace feedline::detail {

// A protobuf message's fields, one at a time. Malformed input ends the walk (ok() turns false).
class proto_reader {
public:
    explicit proto_reader(std::string_view bytes) : p_(bytes) {}
    // The next field: its number, wire type, and its varint or fixed-width value or its length-delimited
    // bytes. False at the end or on malformed input (`ok()` tells which).
    bool next(std::uint32_t& field, std::uint32_t& wire, std::uint64_t& value, std::string_view& bytes) {
        if (at_ >= p_.size()) return false;
        std::uint64_t key = 0;
        if (!varint(key)) return fail();
        field = static_cast<std::uint32_t>(key >> 3);
        wire = static_cast<std::uint32_t>(key & 7);
        switch (wire) {
            case 0: return varint(value) || fail();
            case 1: return fixed(8, value);
            case 5: return fixed(4, value);
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
    bool fixed(std::size_t n, std::uint64_t& v) {  // little-endian, as protobuf writes fixed32/fixed64
        if (n > p_.size() - at_) return fail();
        v = 0;
        for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(static_cast<unsigned char>(p_[at_ + i])) << (8 * i);
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

// SentencePiece.Type (sentencepiece_model.proto).
enum class piece_type : std::uint8_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

struct model_piece {
    std::string text;
    float score = 0;
    piece_type type = piece_type::normal;
};

// What a model file holds that decides its ids (sentencepiece_model.proto: ModelProto.pieces = 1,
// .trainer_spec = 2, .normalizer_spec = 3). Fields absent take proto2's declared defaults.
struct sentencepiece_model {
    std::vector<model_piece> pieces;
    // TrainerSpec: model_type = 3 (UNIGRAM 1, BPE 2, WORD 3, CHAR 4), split_by_unicode_script = 21,
    // split_by_whitespace = 22, split_by_number = 23, treat_whitespace_as_suffix = 24, split_digits =
    // 25, allow_whitespace_only_pieces = 26, byte_fallback = 35, unk/bos/eos_piece = 45/46/47.
    int model_type = 1;
    bool split_by_unicode_script = true, split_by_whitespace = true, split_by_number = true, treat_whitespace_as_suffix = false,
         split_digits = false, allow_whitespace_only_pieces = false, byte_fallback = false;
    std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>";
    // NormalizerSpec: name = 1, precompiled_charsmap = 2, add_dummy_prefix = 3,
    // remove_extra_whitespaces = 4, escape_whitespaces = 5.
    std::string normalizer_name;
    std::string precompiled_charsmap;
    bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
    bool parsed = false;  // the bytes were a well-formed message with at least one piece

    const char* model_type_name() const noexcept {
        switch (model_type) {
            case 1: return "Unigram";
            case 2: return "BPE";
            case 3: return "word";
            case 4: return "char";
            default: return "unknown";
        }
    }
};

inline sentencepiece_model read_sentencepiece_model(std::string_view bytes) {
    sentencepiece_model m;
    proto_reader top(bytes);
    std::uint32_t field = 0, wire = 0;
    std::uint64_t value = 0;
    std::string_view body;
    while (top.next(field, wire, value, body)) {
        if (wire != 2) continue;
        proto_reader inner(body);
        std::uint32_t f = 0, w = 0;
        std::uint64_t v = 0;
        std::string_view b;
        if (field == 1) {
            model_piece p;
            while (inner.next(f, w, v, b)) {
                if (f == 1 && w == 2) p.text = b;
                if (f == 2 && w == 5) p.score = std::bit_cast<float>(static_cast<std::uint32_t>(v));
                if (f == 3 && w == 0) p.type = static_cast<piece_type>(v);
            }
            m.pieces.push_back(std::move(p));
        } else if (field == 2) {
            while (inner.next(f, w, v, b)) {
                if (w == 0 && f == 3) m.model_type = static_cast<int>(v);
                for (auto [number, flag] : {std::pair{21u, &m.split_by_unicode_script},
                                            {22u, &m.split_by_whitespace},
                                            {23u, &m.split_by_number},
                                            {24u, &m.treat_whitespace_as_suffix},
                                            {25u, &m.split_digits},
                                            {26u, &m.allow_whitespace_only_pieces},
                                            {35u, &m.byte_fallback}})
                    if (w == 0 && f == number) *flag = v != 0;
                for (auto [number, text] : {std::pair{45u, &m.unk_piece}, {46u, &m.bos_piece}, {47u, &m.eos_piece}})
                    if (w == 2 && f == number) *text = b;
            }
        } else if (field == 3) {
            while (inner.next(f, w, v, b)) {
                if (w == 2 && f == 1) m.normalizer_name = b;
                if (w == 2 && f == 2) m.precompiled_charsmap = b;
                for (auto [number, flag] :
                     {std::pair{3u, &m.add_dummy_prefix}, {4u, &m.remove_extra_whitespaces}, {5u, &m.escape_whitespaces}})
                    if (w == 0 && f == number) *flag = v != 0;
            }
        }
        if (!inner.ok()) return {};
    }
    m.parsed = top.ok() && !m.pieces.empty();
    return m;
}

// Whether a long document may be encoded a piece at a time with the same ids as whole: the model
// splits at every space anyway (split_by_whitespace, the space starting the next piece), collapses runs
// of spaces and adds the dummy prefix, so a piece that starts with a space encodes as it would in place;
// and no user-defined symbol holds a space (U+2581 or ' ').
inline bool splits_at_spaces(const sentencepiece_model& m) {
    if (!m.parsed || !m.split_by_whitespace || m.treat_whitespace_as_suffix || !m.add_dummy_prefix || !m.remove_extra_whitespaces ||
        !m.escape_whitespaces)
        return false;
    for (const auto& p : m.pieces)
        if (p.type == piece_type::user_defined &&
            (p.text.find(' ') != std::string::npos || p.text.find("\xe2\x96\x81") != std::string::npos))
            return false;
    return true;
}

// Does `model` look like a sentencepiece model: a serialized ModelProto starts with its pieces (field
// 1, length-delimited: byte 0x0a). What is not a regular file is claimed too, so its error is the
// model loader's ("is a FIFO") rather than "no tokenizer recognizes it". Never blocks.
inline bool looks_like_sentencepiece(const std::string& model) {
    const auto head = regular_file_head(model, 1);
    return !head || head->empty() || static_cast<unsigned char>((*head)[0]) == 0x0a;
}

// The largest sentencepiece model file feedline reads (real ones are 0.2-5 MB).
inline constexpr std::uint64_t max_model_bytes = std::uint64_t(1) << 30;

// A model file's bytes (a regular file, bounded). Throws config_error naming `field` (the option that
// named it) when there is none or it cannot be read.
inline std::string read_model_file(const std::string& path, const std::string& field) {
    if (path.empty()) throw config_error(field, "text input needs a tokenizer model");
    try {
        return read_regular_file(path, max_model_bytes);
    } catch (const io_error& e) {
        throw config_error(field, e.what());
    }
}

// "crc32 C bytes N": what a tokenizer's identity says about its model's contents.
inline std::string model_checksum(std::string_view bytes) {
    boost::crc_32_type crc;
    crc.process_bytes(bytes.data(), bytes.size());
    return "crc32 " + std::to_string(crc.checksum()) + " bytes " + std::to_string(bytes.size());
}

}  // namespace feedline::detail
