#!/usr/bin/env python3
"""feedline's byte-level BPE encoder against the `tokenizers` package on a tokenizer.json model, one thread
each (tokenizers with TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1), both through encode_batch on
the same documents, interleaved in rounds. Every document's ids are checked identical before timing.

    .venv-py/bin/python benchmarks/bench_tokenizer_json.py --model M.json --input FILE.jsonl [--rounds 5]

Models: benchmarks/tokenizer_json_models.py. The last line is JSON: identical, documents, bytes,
feedline_mb_per_s, tokenizers_mb_per_s, vs_tokenizers (the median of the rounds' ratios)."""
import argparse
import json
import os
import statistics
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import feedline  # noqa: E402
import tokenizers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with open(a.input, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    size = sum(len(t.encode()) for t in texts)
    theirs = tokenizers.Tokenizer.from_file(a.model)
    ours = feedline.Tokenizer(a.model)

    def run_theirs():
        return [e.ids for e in theirs.encode_batch(texts, add_special_tokens=False)]

    def run_ours():
        return ours.encode_batch(texts, threads=1)

    want, got = run_theirs(), run_ours()
    identical = want == got
    differ = sum(1 for w, g in zip(want, got) if w != g)
    ratios, ours_s, theirs_s = [], [], []
    if identical:
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            run_ours()
            t1 = time.perf_counter()
            run_theirs()
            t2 = time.perf_counter()
            ours_s.append(t1 - t0)
            theirs_s.append(t2 - t1)
            ratios.append((t2 - t1) / (t1 - t0))
    result = {
        "model": os.path.basename(a.model),
        "input": os.path.basename(a.input),
        "identical": identical,
        "documents_differing": differ,
        "documents": len(texts),
        "bytes": size,
        "tokens": sum(len(ids) for ids in want),
        "feedline_mb_per_s": round(size / statistics.median(ours_s) / 1e6, 2) if ours_s else None,
        "tokenizers_mb_per_s": round(size / statistics.median(theirs_s) / 1e6, 2) if theirs_s else None,
        "vs_tokenizers": round(statistics.median(ratios), 2) if ratios else None,
        "tokenizers_version": tokenizers.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
