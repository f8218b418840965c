// feedline/transform/tokenizer_regex.hpp: a tokenizer.json pre-tokenizer pattern (GPT-2's, Llama-3's,
// ...) compiled by PCRE2 with its JIT, splitting text the way the `tokenizers` package's Split does with
// behavior "isolated": each match is a piece, and so is each run of text between matches.
// `tokenizers` matches with Oniguruma, whose Unicode version is not PCRE2's (16.0 against 15.0 for
// Debian 12's PCRE2 10.42), and whose \s differs from PCRE2's at U+180E. So the classes these patterns
// use (\s, \S, \p{L}, \p{N}, ...) are made Oniguruma's (transform/regex_unicode_classes.hpp) before
// PCRE2 sees the pattern: PCRE2's class plus the code points it lacks where that is exact, else every
// range written out; other classes keep PCRE2's.
// Used by the byte-level BPE encoder (transform/byte_level_bpe.hpp).
#pragma once

#if FEEDLINE_HAS_PCRE2

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <feedline/transform/regex_unicode_classes.hpp>
#include <feedline/transform/utf8.hpp>

namespace feedline::detail {

namespace regex_detail {

inline std::string range_text(char32_t first, char32_t last) {
    char buffer[32];
    if (first == last)
        std::snprintf(buffer, sizeof buffer, "\\x{%X}", unsigned(first));
    else
        std::snprintf(buffer, sizeof buffer, "\\x{%X}-\\x{%X}", unsigned(first), unsigned(last));
    return buffer;
}

// The code points of `points` (in order) that PCRE2's `pattern` matches: one search over them all.
inline std::vector<char32_t> matched_by(const char* pattern, const std::vector<char32_t>& points) {
    std::string subject;
    std::vector<std::uint32_t> at;  // each code point's byte offset
    subject.reserve(points.size() * 4);
    at.reserve(points.size());
    for (const char32_t c : points) at.push_back(static_cast<std::uint32_t>(subject.size())), append_utf8(subject, c);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    std::vector<char32_t> found;
    if (!code) return found;
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    for (std::size_t from = 0;
         pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), from, PCRE2_NO_UTF_CHECK, data, nullptr) > 0;) {
        const std::size_t start = pcre2_get_ovector_pointer(data)[0];
        const auto index = static_cast<std::size_t>(std::lower_bound(at.begin(), at.end(), start) - at.begin());
        found.push_back(points[index]);
        from = index + 1 < at.size() ? at[index + 1] : subject.size();
        if (from >= subject.size()) break;
    }
    pcre2_match_data_free(data);
    pcre2_code_free(code);
    return found;
}

// How a class reads inside brackets so that PCRE2 matches exactly Oniguruma's code points. Where PCRE2's
// own \p{X} matches nothing outside them (its Unicode tables are older, not different), it is PCRE2's
// class plus what it lacks, which keeps its table lookup for text beyond ASCII; otherwise, or when
// `every_range` is asked (for ASCII text: PCRE2 then decides each byte from a bitmap, faster than a
// property lookup), every range is written out. \s is always written out: a few ranges. Worked out
// once per process and class, by matching the class over every code point.
inline const std::string& class_inside_brackets(const std::string& name, bool every_range) {
    static std::mutex lock;
    static std::map<std::pair<std::string, bool>, std::string> known;
    std::lock_guard hold(lock);
    if (const auto it = known.find({name, every_range}); it != known.end()) return it->second;
    const auto ranges = unicode_classes::find(name);
    std::string all;
    for (const auto& r : ranges) all += range_text(r.first, r.last);
    const auto keep = [&](std::string spelled) -> const std::string& { return known[{name, every_range}] = std::move(spelled); };
    if (name == "s" || every_range) return keep(std::move(all));
    std::vector<char32_t> inside, outside;
    std::size_t next = 0;
    for (char32_t c = 0; c < 0x110000; ++c) {
        if (c >= 0xD800 && c < 0xE000) continue;
        while (next < ranges.size() && ranges[next].last < c) ++next;
        (next < ranges.size() && ranges[next].first <= c ? inside : outside).push_back(c);
    }
    const std::string native = "\\p{" + name + "}";
    if (!matched_by(native.c_str(), outside).empty()) return keep(std::move(all));
    std::string spelled = native;
    const auto lacking = matched_by(("[^" + native + "]").c_str(), inside);
    for (std::size_t i = 0; i < lacking.size();) {
        std::size_t j = i;
        while (j + 1 < lacking.size() && lacking[j + 1] == lacking[j] + 1) ++j;
        spelled += range_text(lacking[i], lacking[j]);
        i = j + 1;
    }
    return keep(std::move(spelled));
}

}  // namespace regex_detail

// `pattern` with the classes Oniguruma and PCRE2 may disagree on made Oniguruma's
// (regex_detail::class_inside_brackets; `every_range`: its ranges written out). Outside a bracket class \p{X} becomes [X] and \P{X}, \S
// become [^X]; inside one \p{X} and \s become X itself (a negated class inside brackets keeps PCRE2's
// meaning).
inline std::string spell_out_unicode_classes(std::string_view pattern, bool every_range = false) {
    std::string out;
    bool in_class = false;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
        const char c = pattern[i];
        if (c == '\\' && i + 1 < pattern.size()) {
            const char e = pattern[i + 1];
            std::string name;
            std::size_t end = i + 2;  // past the escape
            bool negated = false;
            if (e == 's' || e == 'S') {
                name = "s", negated = e == 'S';
            } else if ((e == 'p' || e == 'P') && i + 2 < pattern.size()) {
                negated = e == 'P';
                if (pattern[i + 2] == '{') {
                    const std::size_t close = pattern.find('}', i + 3);
                    if (close != std::string_view::npos) name = pattern.substr(i + 3, close - i - 3), end = close + 1;
                } else {
                    name = pattern.substr(i + 2, 1), end = i + 3;
                }
            }
            if (!name.empty() && !unicode_classes::find(name).empty() && !(in_class && negated)) {
                const std::string& inside = regex_detail::class_inside_brackets(name, every_range);
                out += in_class ? inside : (negated ? "[^" : "[") + inside + "]";
                i = end - 1;
                continue;
            }
            out += c;
            out += e;  // any other escape, kept whole so an escaped bracket does not open or close a class
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            // A ']' first in the class (after '^') is a literal, not its end.
            if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += '^', ++i;
            if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += ']', ++i;
            continue;
        }
        if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {  // [:alpha:] inside a class
            const std::size_t close = pattern.find(":]", i + 2);
            if (close != std::string_view::npos) {
                out += pattern.substr(i, close + 2 - i);
                i = close + 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

// One compiled pattern, shared by threads (PCRE2's compiled code is read-only once JIT-compiled): twice,
// the same matches either way, once for text beyond ASCII and once for ASCII text, which matches faster
// with the classes written out.
class tokenizer_regex {
public:
    // Throws std::invalid_argument with PCRE2's message and offset for a pattern it cannot compile.
    explicit tokenizer_regex(std::string_view pattern)
            : source_(pattern),
              any_(compile(spell_out_unicode_classes(pattern))),
              ascii_(compile(spell_out_unicode_classes(pattern, true))) {}

    const std::string& source() const noexcept { return source_; }
    struct compiled {
        std::unique_ptr<pcre2_code, void (*)(pcre2_code*)> code{nullptr, pcre2_code_free};
        bool jit = false;
    };
    // The code for ASCII text (`ascii`) or any text; both match alike.
    const compiled& code(bool ascii) const noexcept { return ascii ? ascii_ : any_; }

private:
    compiled compile(const std::string& spelled) const {
        int error = 0;
        PCRE2_SIZE offset = 0;
        compiled c;
        c.code.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spelled.data()), spelled.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK,
                                   &error, &offset, nullptr));
        if (!c.code) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(error, message, sizeof message);
            throw std::invalid_argument("pattern " + source_ + " does not compile (PCRE2: " + reinterpret_cast<char*>(message) +
                                        ", at byte " + std::to_string(offset) + " of the pattern as rewritten)");
        }
        c.jit = pcre2_jit_compile(c.code.get(), PCRE2_JIT_COMPLETE) == 0;
        return c;
    }

    std::string source_;
    compiled any_, ascii_;
};

// One thread's matching state: match data and a JIT stack that may grow to 8 MiB, so a long run that
// the pattern takes whole (a megabyte of letters) still matches.
class regex_matcher {
public:
    regex_matcher()
            : data_(pcre2_match_data_create(1, nullptr), pcre2_match_data_free),
              context_(pcre2_match_context_create(nullptr), pcre2_match_context_free),
              stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr), pcre2_jit_stack_free) {
        if (!data_ || !context_ || !stack_) throw std::bad_alloc();
        pcre2_jit_stack_assign(context_.get(), nullptr, stack_.get());
    }

    // Calls each(piece) for the pieces of `text` (valid UTF-8) split by `pattern`, matches and the text
    // between them, in order, none empty. Returns an error text (PCRE2's) if matching failed, else
    // empty. Both of the pattern's codes match alike; each search takes the ASCII one where the next
    // 32 bytes are ASCII (a word or two), the other where text beyond ASCII is near; `only`, 0 or 1,
    // makes every search take the code for any text or the ASCII one (tests compare them).
    template <class Each>
    std::string split(const tokenizer_regex& pattern, std::string_view text, Each&& each, int only = -1) {
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        std::size_t at = 0, done = 0;  // where the next search starts; the end of what was handed over
        std::size_t high = 0;          // the next byte beyond ASCII at or after `at` (text.size(): none)
        const auto next_high = [&](std::size_t from) {
            while (from < text.size() && static_cast<unsigned char>(text[from]) < 0x80) ++from;
            return from;
        };
        high = next_high(0);
        while (at <= text.size()) {
            if (high < at) high = next_high(at);
            const tokenizer_regex::compiled& re = pattern.code(only >= 0 ? only == 1 : high - at >= 32 || high == text.size());
            const int rc = re.jit ? pcre2_jit_match(re.code.get(), subject, text.size(), at, 0, data_.get(), context_.get())
                                  : pcre2_match(re.code.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK, data_.get(), context_.get());
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR message[256];
                pcre2_get_error_message(rc, message, sizeof message);
                return "the pre-tokenizer pattern failed at byte " + std::to_string(at) + " (PCRE2: " + reinterpret_cast<char*>(message) +
                       ")";
            }
            const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data_.get());
            const std::size_t start = v[0], end = v[1];
            if (end == start) {  // an empty match splits nothing: search again a character on
                if (start >= text.size()) break;
                at = start + 1;
                while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
                continue;
            }
            if (start > done) each(text.substr(done, start - done));
            each(text.substr(start, end - start));
            done = at = end;
        }
        if (done < text.size()) each(text.substr(done));
        return {};
    }

private:
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data_;
    std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> context_;
    std::unique_ptr<pcre2_jit_stack, void (*)(pcre2_jit_stack*)> stack_;
};

}  // namespace feedline::detail

#endif  // FEEDLINE_HAS_PCRE2
