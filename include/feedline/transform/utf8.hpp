// feedline/transform/utf8.hpp: a code point appended to a string as UTF-8, for the tokenizer.json
// code that writes text (pattern classes in tokenizer_regex.hpp, NFC in unicode_nfc.hpp).
#pragma once

#include <string>

namespace feedline::detail {

inline void append_utf8(std::string& out, char32_t c) {
    if (c < 0x80) {
        out += char(c);
    } else if (c < 0x800) {
        out += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    } else if (c < 0x10000) {
        out += {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
    } else {
        out += {char(0xF0 | (c >> 18)), char(0x80 | ((c >> 12) & 0x3F)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
    }
}

}  // namespace feedline::detail
