#!/usr/bin/env python3
"""Interoperability with Megatron-LM's own indexed dataset code (megatron-core from PyPI).

1. Megatron's IndexedDatasetBuilder writes datasets in every dtype (with an empty document and a
   document made of several sequences); feedline-inspect must read back exactly the same tokens.
2. feedline-pack writes a dataset; Megatron's IndexedDataset must read the same tokens, and Megatron's
   builder fed those tokens must write byte-identical .bin and .idx files.

Exits 77 (skipped) with the reason when megatron-core cannot be imported.
"""
import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types


def load_megatron():
    # megatron/core/__init__.py imports the whole training stack; its datasets package needs only
    # numpy and torch. Register the package paths without running the package __init__ files.
    spec = importlib.util.find_spec("megatron")
    if spec is None:
        raise ImportError("megatron-core is not installed (scripts/install-deps.sh installs it into .venv-compat)")
    root = list(spec.submodule_search_locations)[0]
    for name, sub in [("megatron", ""), ("megatron.core", "core"), ("megatron.core.datasets", "core/datasets")]:
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(root, sub)]
        sys.modules[name] = module
    from megatron.core.datasets import indexed_dataset

    return indexed_dataset


def dump_tokens(bin_dir, path):
    out = subprocess.run([os.path.join(bin_dir, "feedline-inspect"), "--dump-tokens", path], capture_output=True, check=True)
    import numpy

    return numpy.frombuffer(out.stdout, dtype="<u4")


def summary(bin_dir, path):
    out = subprocess.run([os.path.join(bin_dir, "feedline-inspect"), "--json", path], capture_output=True, check=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--scratch", required=True)
    args = ap.parse_args()
    try:
        mi = load_megatron()
        import numpy
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot run here"
        print(f"SKIPPED: Megatron interop needs megatron-core, numpy and torch: {e}", file=sys.stderr)
        return 77

    os.makedirs(args.scratch, exist_ok=True)
    work = tempfile.mkdtemp(prefix="megatron-interop-", dir=args.scratch)
    failures = []
    try:
        # 1. Megatron writes, feedline reads.
        dtypes = [numpy.uint8, numpy.int8, numpy.int16, numpy.int32, numpy.int64, numpy.float64, numpy.float32, numpy.uint16]
        for dt in dtypes:
            prefix = os.path.join(work, f"megatron_{numpy.dtype(dt).name}")
            builder = mi.IndexedDatasetBuilder(prefix + ".bin", dtype=dt)
            sequences = []
            for d, length in enumerate([5, 0, 1, 30, 7]):
                seq = [(d * 13 + i) % 100 for i in range(length)]
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
                builder.end_document()
                sequences.append(seq)
            # One document of three sequences (Megatron's sentence-split layout).
            for part in ([1, 2], [3], [4, 5, 6]):
                builder.add_item(torch.tensor(part, dtype=torch.int64))
                sequences.append(part)
            builder.end_document()
            builder.finalize(prefix + ".idx")

            expected = [t for s in sequences for t in s]
            got = dump_tokens(args.bin_dir, prefix).tolist()
            if got != expected:
                failures.append(f"{numpy.dtype(dt).name}: feedline read {got[:10]}... expected {expected[:10]}...")
            info = summary(args.bin_dir, prefix)
            if info["documents"] != len(sequences) or info["dtype"] != numpy.dtype(dt).name:
                failures.append(f"{numpy.dtype(dt).name}: summary {info}")

        # 2. feedline writes, Megatron reads (and would have written the same bytes).
        corpus = os.path.join(work, "corpus.jsonl")
        subprocess.run([os.path.join(args.bin_dir, "feedline-make-corpus"), "--output", corpus, "--documents", "200"], check=True,
                       capture_output=True)
        with open(corpus, "a") as f:
            f.write('{"text": ""}\n')  # an empty document
        ours = os.path.join(work, "feedline")
        subprocess.run([os.path.join(args.bin_dir, "feedline-pack"), "--quiet", "--input", corpus, "--train-model", "300", "--output",
                        ours, "--append-eos"], check=True)
        ds = mi.IndexedDataset(ours)
        tokens = dump_tokens(args.bin_dir, ours)
        megatron_tokens = numpy.concatenate([ds[i] for i in range(len(ds))]).astype("<u4")
        if len(ds) != 201 or not numpy.array_equal(tokens, megatron_tokens):
            failures.append(f"Megatron read {len(ds)} sequences; tokens equal: {numpy.array_equal(tokens, megatron_tokens)}")
        if list(ds.document_indices) != list(range(len(ds) + 1)):
            failures.append("document index differs")
        rewrite = os.path.join(work, "rewritten")
        builder = mi.IndexedDatasetBuilder(rewrite + ".bin", dtype=ds.index.dtype)
        for i in range(len(ds)):
            builder.add_item(torch.from_numpy(ds[i].astype(numpy.int64)))
            builder.end_document()
        builder.finalize(rewrite + ".idx")
        for ext in (".bin", ".idx"):
            with open(ours + ext, "rb") as a, open(rewrite + ext, "rb") as b:
                if a.read() != b.read():
                    failures.append(f"{ext} written by feedline differs from Megatron's")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"Megatron interop: {len(dtypes)} dtypes read, feedline dataset read and re-written by Megatron; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
