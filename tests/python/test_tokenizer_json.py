"""feedline's byte-level BPE encoder for tokenizer.json models against the `tokenizers` package, id for id:
models trained here by `tokenizers` in GPT-2's form (ByteLevel with its pattern, with and without the leading
space), GPT-4o's (cased letter classes and marks), Llama-3's (a Split pattern with case-insensitive contractions, then ByteLevel; ignore_merges; special
tokens) on text of many scripts; random text, every Unicode code point in the positions the patterns care
about, and the same models through feedline-pack and a Pipeline."""
import json
import random
import struct
import subprocess

import pytest

import feedline

tokenizers = pytest.importorskip("tokenizers", reason="the `tokenizers` package (scripts/install-python.sh installs it)")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from conftest import bin_dir, tool  # noqa: E402

# GPT-4o's (o200k): cased letter classes, marks, and contractions after a word.
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an they you "
         "don't it's we'll I'M you've Héllo naïve café 日本語 東京 Привет текст مرحبا नमस्ते 🙂🙃 e\u0301 := -> {} 3.14 12345").split()
POOLS = [(0x20, 0x7E), (0x0, 0x20), (0xA0, 0x2FF), (0x300, 0x36F), (0x400, 0x4FF), (0x600, 0x6FF), (0x900, 0x97F),
         (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F), (0x2000, 0x206F), (0x10000, 0x10FFFF), (0x85, 0x85),
         (0x180E, 0x180E), (0x1100, 0x11FF), (0xAC00, 0xAC60), (0xF900, 0xFAFF), (0x1E00, 0x1EFF), (0x1DC0, 0x1DFF)]
EXTRAS = [" ", "  ", "\n", "'s", "'S", " '", "\r\n", "<|endoftext|>", "<|end_of_text|>", "<|begin_of_text|>", "123456",
          "don't", "\u017f", "'\u017f", "\u212a", "\t\t", " \n "]


def corpus_line(rng):
    parts = []
    for _ in range(60):
        r = rng.random()
        if r < 0.75:
            parts.append(rng.choice(WORDS))
        elif r < 0.85:
            parts.append(str(rng.randint(0, 99999)))
        else:
            parts.append("".join(chr(rng.randint(0x20, 0x24F)) for _ in range(rng.randint(1, 6))))
    return " ".join(parts)


def random_text(rng):
    out = []
    for _ in range(rng.randint(0, 60)):
        lo, hi = rng.choice(POOLS)
        c = rng.randint(lo, hi)
        out.append(chr(0x41 if 0xD800 <= c < 0xE000 else c))
        if rng.random() < 0.2:
            out.append(rng.choice(EXTRAS))
    return "".join(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{'gpt2': path, 'gpt2-prefix': path, 'llama3': path, 'o200k': path, 'qwen2': path, 'corpus': [lines], 'dir': Path}"""
    d = tmp_path_factory.mktemp("tokenizer-json")
    rng = random.Random(1)
    corpus = [corpus_line(rng) for _ in range(600)]

    def train(name, pre, specials, ignore_merges=False, post=None, normalizer=None, added=()):
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre
        if normalizer:
            tok.normalizer = normalizer
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(corpus, trainer)
        if post:
            tok.post_processor = post
        tok.add_tokens(list(added))
        path = d / f"{name}.json"
        tok.save(str(path))
        return str(path)

    return {
        "gpt2": train("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"]),
        "gpt2-prefix": train("gpt2-prefix", pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"]),
        "llama3": train("llama3", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(5)],
            ignore_merges=True,
            post=processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])),
        "o200k": train("o200k", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(O200K), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ["<|endoftext|>"]),
        # Qwen2's form: NFC, then its pattern; an added token matched on normalized text, written decomposed.
        "qwen2": train("qwen2", pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            normalizer=normalizers.NFC(), added=[AddedToken("cafe\u0301!", normalized=True)]),
        "corpus": corpus,
        "dir": d,
    }


@pytest.mark.parametrize("name", ["gpt2", "gpt2-prefix", "llama3", "o200k", "qwen2"])
def test_ids_equal_the_tokenizers_package_on_random_text_of_many_scripts(trained, name):
    rng = random.Random(5)
    texts = [random_text(rng) for _ in range(20000)] + trained["corpus"] + [
        "", " ", "hello world", "  leading", "trailing  ", "a\n\n\nb", "<|endoftext|><|endoftext|>", "x" * 5000,
        " " * 3000 + "y", "日本語" * 1000]
    theirs = Tokenizer.from_file(trained[name])
    want = [e.ids for e in theirs.encode_batch(texts, add_special_tokens=False)]
    ours = feedline.Tokenizer(trained[name])
    assert (ours.kind, ours.description) == ("byte-level-bpe", "feedline's byte-level BPE encoder")
    assert ours.vocab_size == theirs.get_vocab_size()
    assert ours.encode_batch(texts, threads=2) == want
    assert [ours.encode(t) for t in texts[:500]] == want[:500]


@pytest.mark.parametrize("name", ["llama3", "o200k", "qwen2"])  # their classes include GPT-2's
def test_every_code_point_is_classed_as_the_tokenizers_package_classes_it(trained, name):
    """Letters, numbers and white space as Oniguruma (inside `tokenizers`) sees them: every code point before
    and after a letter, a digit, a space, an apostrophe and a newline, in groups of 16."""
    points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    texts = ["".join(f" {chr(c)}x{chr(c)}1{chr(c)}{chr(c)}'{chr(c)}\n{chr(c)} " for c in points[i:i + 16])
             for i in range(0, len(points), 16)]
    want = [e.ids for e in Tokenizer.from_file(trained[name]).encode_batch(texts, add_special_tokens=False)]
    got = feedline.Tokenizer(trained[name]).encode_batch(texts, threads=2)
    differ = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not differ, f"{len(differ)} groups differ, the first from U+{points[differ[0] * 16]:04X}"


def test_bos_and_eos_are_the_models_special_tokens(trained):
    llama = feedline.Tokenizer(trained["llama3"], add_bos=True, add_eos=True)
    theirs = Tokenizer.from_file(trained["llama3"])
    text = "Hello there, 東京"
    assert llama.encode(text) == [theirs.token_to_id("<|begin_of_text|>")] + theirs.encode(text, add_special_tokens=False).ids + \
        [theirs.token_to_id("<|end_of_text|>")]
    gpt2 = feedline.Tokenizer(trained["gpt2"], add_eos=True)
    assert gpt2.eos_id == Tokenizer.from_file(trained["gpt2"]).token_to_id("<|endoftext|>") and gpt2.bos_id == -1
    with pytest.raises(feedline.ConfigError, match="has no BOS token"):
        feedline.Tokenizer(trained["gpt2"], add_bos=True)


def test_nfc_is_the_tokenizers_packages_on_marks_hangul_and_compatibility_ideographs(trained):
    """Qwen2's NFC: decomposed and composed Latin, marks of every combining class in every order, Hangul
    jamo and syllables, compatibility ideographs, and every code point after a base letter and before a
    mark; the added token written decomposed matches its composed form."""
    import unicodedata
    marks = [c for c in range(0x300, 0x2000) if unicodedata.combining(chr(c))] + [0x1D165, 0x1D16D, 0x10A38, 0x302A]
    pools = [list(range(0x41, 0x7B)), marks, list(range(0x1100, 0x1200)), list(range(0xAC00, 0xAC60)),
             list(range(0xC0, 0x250)), list(range(0xF900, 0xFB50)), list(range(0x1E00, 0x1F00)), [0x20, 0x27, 0x0A]]
    rng = random.Random(11)
    texts = ["".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 40))) for _ in range(30000)]
    points = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    texts += ["".join(f"a{chr(c)}\u0301 e{chr(c)}{chr(c)}\u0316\u0345" for c in points[i:i + 32]) for i in range(0, len(points), 32)]
    texts += ["x cafe\u0301! y caf\u00e9! <|im_start|>e\u0301<|im_end|>", "\u1100\u1161\u11a8 \uac00\u11a8", "\u0301start"]
    theirs = Tokenizer.from_file(trained["qwen2"])
    want = [e.ids for e in theirs.encode_batch(texts, add_special_tokens=False)]
    got = feedline.Tokenizer(trained["qwen2"]).encode_batch(texts, threads=2)
    differ = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not differ, f"{len(differ)} texts differ, the first {ascii(texts[differ[0]][:80])}"
    added = theirs.token_to_id("cafe\u0301!")  # stored as written, matched normalized
    assert added is not None and want[-3].count(added) == 2


def test_a_normalizer_it_does_not_reproduce_is_refused_saying_which(trained, tmp_path):
    j = json.loads(open(trained["gpt2"], encoding="utf-8").read())
    for normalizer, named in [({"type": "NFKC"}, "NFKC"), ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
                                                          "Lowercase")]:
        j["normalizer"] = normalizer
        path = tmp_path / "other.json"
        path.write_text(json.dumps(j), encoding="utf-8")
        with pytest.raises(feedline.ConfigError, match=rf"other\.json: its normalizer \({named}\) is not supported"):
            feedline.Tokenizer(str(path))


def test_feedline_pack_and_a_pipeline_take_a_tokenizer_json_where_they_take_a_model(trained):
    d = trained["dir"]
    docs = trained["corpus"][:200] + ["Tab\tand newline\n inside", "🙂 emoji <|endoftext|> inside"]
    with open(d / "docs.jsonl", "w", encoding="utf-8") as f:
        for t in docs:
            f.write(json.dumps({"text": t}) + "\n")
    tool("feedline-pack", "--quiet", "--append-eos", "--input", str(d / "docs.jsonl"), "--model", trained["gpt2"],
         "--output", str(d / "gpt2"))
    dumped = subprocess.run([str(bin_dir() / "feedline-inspect"), "--dump-tokens", str(d / "gpt2")], capture_output=True, check=True).stdout
    packed = list(struct.unpack(f"<{len(dumped) // 4}I", dumped))
    theirs = Tokenizer.from_file(trained["gpt2"])
    eos = theirs.token_to_id("<|endoftext|>")
    want = [i for e in theirs.encode_batch(docs, add_special_tokens=False) for i in e.ids + [eos]]
    assert packed == want

    # A pipeline reading the same text: every window is a stretch of those tokens.
    pipe = feedline.Pipeline(str(d / "docs.jsonl"), tokenizer=trained["gpt2"], batch_size=2, seq_len=32, max_steps=6,
                             shuffle="none", device="cpu", workers=2)
    text = " " + " ".join(map(str, want)) + " "
    windows = 0
    for batch in pipe:
        for row in batch.inputs.tolist():
            assert " " + " ".join(map(str, row)) + " " in text
            windows += 1
    assert windows == 12


def test_feedline_inspect_summarises_a_tokenizer_json(trained):
    summary = json.loads(tool("feedline-inspect", trained["llama3"], "--json"))
    theirs = Tokenizer.from_file(trained["llama3"])
    assert summary["format"] == "tokenizer.json" and summary["model_type"] == "byte-level BPE"
    assert summary["vocab_size"] == theirs.get_vocab_size() and summary["ignore_merges"] is True
    assert (summary["bos_token"], summary["eos_token"]) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert summary["bos_id"] == theirs.token_to_id("<|begin_of_text|>")
    assert summary["added_tokens"] == 7 and summary["encoder"] == "feedline's byte-level BPE encoder"
    assert "Split" in summary["pre_tokenizer"] and summary["pre_tokenizer"].endswith("bytes")
    printed = tool("feedline-inspect", trained["gpt2"])
    assert "format     tokenizer.json (byte-level BPE" in printed and "GPT-2's pattern" in printed
