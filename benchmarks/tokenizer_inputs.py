#!/usr/bin/python3
"""Inputs for bench_tokenizer from what a Debian machine has: English prose (Python's own documentation
topics, pydoc_data), code (the standard library's .py files) and mixed-script text (sentences of words
in a dozen scripts with emoji, full-width forms and digits), as JSONL, and a Unigram and a BPE
sentencepiece model trained on all three with the library's trainer.

    /usr/bin/python3 benchmarks/tokenizer_inputs.py OUT_DIR [--vocab 16000]
writes OUT_DIR/{english,code,mixed}.jsonl and OUT_DIR/unigram.model and OUT_DIR/bpe.model."""
import argparse
import json
import pathlib
import random
import sysconfig

import sentencepiece


def english():
    from pydoc_data.topics import topics
    return [text for _, text in sorted(topics.items())]


def code(limit_bytes=4 << 20):
    docs, total = [], 0
    for path in sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append(text)
        total += len(text.encode())
        if total > limit_bytes:
            break
    return docs


WORDS = ("the river quiet dawn carried boats naïve café résumé déjà Ça coûte 東京 大きい 都市 です 日本語 中文 漢字 "
         "カタカナ ひらがな 한국어 서울 Ελληνικά κείμενα Русский текст العربية مرحبا עברית हिन्दी नमस्ते ไทย ภาษา 🙂 👍🏽 "
         "Ｆｕｌｌ ｗｉｄｔｈ ﬁle ① x² 2026-11-25 €3,50 42 3.14159 Donaudampfschifffahrt").split()


def mixed(count=2000, seed=1):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))) for _ in range(count)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=16000)
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = {"english": english(), "code": code(), "mixed": mixed()}
    for name, docs in sets.items():
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    with open(out / "train.txt", "w", encoding="utf-8") as f:
        for docs in sets.values():
            for d in docs:  # lines, not documents: the trainer skips sentences over 4 kB
                f.write("\n".join(line[:4000] for line in d.splitlines() if line.strip()) + "\n")
    for model_type in ("unigram", "bpe"):
        sentencepiece.SentencePieceTrainer.train(input=str(out / "train.txt"), model_prefix=str(out / model_type), model_type=model_type,
                                                 vocab_size=a.vocab, character_coverage=0.9995, input_sentence_size=200000,
                                                 shuffle_input_sentence=True, minloglevel=2, num_threads=2, hard_vocab_limit=False)
    for name, docs in sets.items():
        print(f"{name}: {len(docs)} documents, {sum(len(d.encode()) for d in docs) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
