#!/usr/bin/env python3
"""Writes include/feedline/transform/unicode_nfc_tables.hpp: Unicode's canonical decompositions,
combining classes and compositions as the `tokenizers` package's NFC normalizer has them, for
feedline's NFC (transform/unicode_nfc.hpp), which tokenizer.json models such as Qwen2's ask for.

`tokenizers` normalizes with tables older than Python's and not all of one Unicode version (0.23.3:
combining classes of about Unicode 10, yet a composition of Unicode 13 that it never decomposes), so
the tables are read from the package itself, code point by code point:
  - decompositions: its NFD of every code point (Hangul syllables are left to the algorithm);
  - combining classes: Python's value for each code point that the package reorders, checked against
    a mark of every class in both orders, so the relative order is the package's;
  - compositions: Python's canonical pairs that the package's NFC composes.
Then NFC by these tables is checked against the package's on every code point and on random runs of
marks. Run with a Python that has `tokenizers`:
    .venv-py/bin/python scripts/unicode-nfc.py
tests/python/test_tokenizer_json.py checks the encoder with an NFC model against the installed package."""
import pathlib
import random
import unicodedata

import tokenizers
from tokenizers import normalizers

NFD, NFC = normalizers.NFD(), normalizers.NFC()
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
POINTS = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def decompositions():
    out = {}
    for c in POINTS:
        d = NFD.normalize_str(chr(c))
        if d != chr(c) and not HANGUL_FIRST <= c <= HANGUL_LAST:
            out[c] = [ord(x) for x in d]
    return out


def combining_classes(decomposed):
    """{code point: class} for the code points (not decomposed) the package reorders."""
    out = {}
    for c in POINTS:
        s = chr(c)
        if c in decomposed or HANGUL_FIRST <= c <= HANGUL_LAST:
            continue
        # Class 240 (U+0345) is the highest, 1 (U+0334) the lowest: a mark is reordered against one of them.
        moved = NFD.normalize_str("\u0345" + s) != "\u0345" + s or NFD.normalize_str(s + "\u0334") != s + "\u0334"
        if moved or c == 0x345:
            k = unicodedata.combining(s)
            assert k, f"U+{c:04X} is reordered by `tokenizers` but has class 0 in Python's Unicode {unicodedata.unidata_version}"
            out[c] = k
    references = {}
    for c, k in sorted(out.items()):
        references.setdefault(k, c)
    for c, k in out.items():
        for kr, r in references.items():
            a, b = chr(c) + chr(r), chr(r) + chr(c)
            assert (NFD.normalize_str(a) != a) == (k > kr), f"U+{c:04X} against U+{r:04X}"
            assert (NFD.normalize_str(b) != b) == (kr > k), f"U+{r:04X} against U+{c:04X}"
    return out


def compositions():
    out = {}
    for c in POINTS:
        d = unicodedata.decomposition(chr(c))
        if not d or d.startswith("<") or len(d.split()) != 2:
            continue
        first, second = (int(x, 16) for x in d.split())
        if NFC.normalize_str(chr(first) + chr(second)) == chr(c):
            out[(first, second)] = c
    return out


def nfc(text, decomposed, classes, composed):
    """NFC by the tables, as the C++ does it (UAX #15), to check them here."""
    buf = []
    for ch in text:
        c = ord(ch)
        if HANGUL_FIRST <= c <= HANGUL_LAST:
            s = c - HANGUL_FIRST
            buf += [0x1100 + s // 588, 0x1161 + (s % 588) // 28] + ([0x11A7 + s % 28] if s % 28 else [])
        else:
            buf += decomposed.get(c, [c])
    i = 1
    while i < len(buf):  # canonical order: a stable sort of each run of marks by class
        k = classes.get(buf[i], 0)
        j = i
        while k and j > 0 and classes.get(buf[j - 1], 0) > k:
            buf[j - 1], buf[j] = buf[j], buf[j - 1]
            j -= 1
        i += 1
    if not buf:
        return ""
    out, starter = [buf[0]], 0 if classes.get(buf[0], 0) == 0 else None
    last = 0 if starter == 0 else 256
    for c in buf[1:]:
        k = classes.get(c, 0)
        composite = None
        if starter is not None and (last < k or last == 0):
            s = out[starter]
            if 0x1100 <= s <= 0x1112 and 0x1161 <= c <= 0x1175:
                composite = HANGUL_FIRST + ((s - 0x1100) * 21 + c - 0x1161) * 28
            elif HANGUL_FIRST <= s <= HANGUL_LAST and (s - HANGUL_FIRST) % 28 == 0 and 0x11A8 <= c <= 0x11C2:
                composite = s + c - 0x11A7
            else:
                composite = composed.get((s, c))
        if composite is not None and (last < k or last == 0):
            out[starter] = composite
            continue
        if k == 0:
            starter = len(out)
        last = k
        out.append(c)
    return "".join(map(chr, out))


def check(decomposed, classes, composed):
    for c in POINTS:
        assert nfc(chr(c), decomposed, classes, composed) == NFC.normalize_str(chr(c)), f"U+{c:04X}"
    rng = random.Random(7)
    marks = sorted(classes)
    firsts = sorted({f for f, _ in composed} | {0x1100, 0x1161, 0xAC00, 0xAC01, 0x41, 0x65})
    seconds = sorted({s for _, s in composed} | {0x1161, 0x11A8, 0x11C2})
    for _ in range(200000):
        text = "".join(chr(rng.choice(rng.choice([marks, firsts, seconds, POINTS]))) for _ in range(rng.randint(1, 8)))
        assert nfc(text, decomposed, classes, composed) == NFC.normalize_str(text), ascii(text)


def rows(items, width=110):
    lines, row = [], "   "
    for item in items:
        if len(row) + len(item) + 1 > width:
            lines.append(row)
            row = "   "
        row += " " + item
    lines.append(row)
    return lines


def main():
    decomposed = decompositions()
    classes = combining_classes(decomposed)
    composed = compositions()
    check(decomposed, classes, composed)

    target = pathlib.Path(__file__).resolve().parent.parent / "include/feedline/transform/unicode_nfc_tables.hpp"
    pool, entries = [], []
    for c in sorted(decomposed):
        entries.append(f"{{0x{c:X}, {len(pool)}, {len(decomposed[c])}}},")
        pool += decomposed[c]
    lines = [
        "// feedline/transform/unicode_nfc_tables.hpp: generated by scripts/unicode-nfc.py from the `tokenizers`",
        f"// package {tokenizers.__version__} (its NFC normalizer): canonical decompositions, combining classes and",
        "// compositions as that package has them, for transform/unicode_nfc.hpp. Do not edit; run the script again.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace feedline::detail::unicode_nfc_tables {",
        "",
        "// A code point's full canonical decomposition: `length` code points from decomposed_points[offset].",
        "// Hangul syllables are not here (the algorithm of Unicode's chapter 3.12 decomposes them).",
        "struct decomposition {",
        "    std::uint32_t code_point;",
        "    std::uint16_t offset;",
        "    std::uint8_t length;",
        "};",
        "",
        "inline constexpr std::uint32_t decomposed_points[] = {",
        *rows(f"0x{c:X}," for c in pool),
        "};",
        "",
        "inline constexpr decomposition decompositions[] = {",
        *rows(entries),
        "};",
        "",
        "// Code points with a combining class other than 0 (that are not decomposed), by code point.",
        "struct combining_class {",
        "    std::uint32_t code_point;",
        "    std::uint8_t value;",
        "};",
        "",
        "inline constexpr combining_class combining_classes[] = {",
        *rows(f"{{0x{c:X}, {k}}}," for c, k in sorted(classes.items())),
        "};",
        "",
        "// Primary composites by the pair they compose from, sorted by (first, second).",
        "struct composition {",
        "    std::uint32_t first, second, composite;",
        "};",
        "",
        "inline constexpr composition compositions[] = {",
        *rows(f"{{0x{f:X}, 0x{s:X}, 0x{c:X}}}," for (f, s), c in sorted(composed.items())),
        "};",
        "",
        "}  // namespace feedline::detail::unicode_nfc_tables",
    ]
    assert len(pool) < 65536
    target.write_text("\n".join(lines) + "\n")
    print(f"wrote {target}: {len(decomposed)} decompositions, {len(classes)} combining classes, {len(composed)} compositions")


if __name__ == "__main__":
    main()
