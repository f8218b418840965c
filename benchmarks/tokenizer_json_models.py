#!/usr/bin/env python3
"""tokenizer.json models for bench_tokenizer_json.py, made with the `tokenizers` package (run with
.venv-py/bin/python after scripts/install-python.sh):

    tokenizer_json_models.py DIR [--vocab 32000] [--gpt2-ranks gpt2.tiktoken]

trains DIR/gpt2-form.json (ByteLevel with GPT-2's pattern), DIR/llama3-form.json (Llama-3's Split
pattern, ByteLevel, ignore_merges, its special tokens) and DIR/qwen2-form.json (NFC, Qwen2's pattern) on DIR/{english,code,mixed}.jsonl (made by
tokenizer_inputs.py). With --gpt2-ranks (GPT-2's 50,256 byte-level BPE ranks in tiktoken's format, e.g.
whisper/assets/gpt2.tiktoken of the openai-whisper source package on PyPI) it also writes
DIR/gpt2.json: that vocabulary with merges derived from the ranks as `transformers` derives them
(every split of a token into two tokens, in the order of the ranks), GPT-2's pre-tokenizer and
<|endoftext|>."""
import argparse
import base64
import json
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def byte_level_alphabet():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def gpt2_from_ranks(path):
    alphabet = byte_level_alphabet()
    ranks = {}
    for line in open(path, "rb"):
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    as_text = {t: "".join(alphabet[b] for b in t) for t in ranks}
    merges = []
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        local = [(token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]]))
    merges.sort(key=lambda m: m[2])
    vocab = {as_text[t]: r for t, r in ranks.items()}
    vocab["<|endoftext|>"] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[as_text[a], as_text[b]] for a, b, _ in merges]},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--gpt2-ranks")
    a = ap.parse_args()
    d = pathlib.Path(a.dir)
    texts = []
    for name in ("english", "code", "mixed"):
        with open(d / f"{name}.jsonl", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]

    def train(pre, specials, ignore_merges, nfc=False):
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre
        if nfc:
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=specials, show_progress=False,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        return tok

    train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"], False).save(str(d / "gpt2-form.json"))
    train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          ["<|begin_of_text|>", "<|end_of_text|>"], True).save(str(d / "llama3-form.json"))
    train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, nfc=True).save(str(d / "qwen2-form.json"))
    written = ["gpt2-form.json", "llama3-form.json", "qwen2-form.json"]
    if a.gpt2_ranks:
        (d / "gpt2.json").write_text(json.dumps(gpt2_from_ranks(a.gpt2_ranks), ensure_ascii=False), encoding="utf-8")
        Tokenizer.from_file(str(d / "gpt2.json"))  # `tokenizers` reads it
        written.append("gpt2.json")
    print("wrote", ", ".join(str(d / w) for w in written))


if __name__ == "__main__":
    main()
