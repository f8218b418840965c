"""Fixtures for the Python package's tests: real data made by feedline's own tools (a synthetic corpus,
a sentencepiece model trained on it, Megatron and llm.c shards), found through FEEDLINE_BIN_DIR."""
import json
import os
import subprocess
from pathlib import Path

import pytest


def bin_dir() -> Path:
    d = os.environ.get("FEEDLINE_BIN_DIR")
    if not d:
        pytest.skip("FEEDLINE_BIN_DIR (the C++ tools' directory, e.g. build/default/bin) is not set")
    return Path(d)


def tool(name: str, *args: str) -> str:
    r = subprocess.run([str(bin_dir() / name), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """{'megatron': prefix, 'llmc': glob, 'jsonl': path, 'model': path, 'dir': Path}"""
    d = tmp_path_factory.mktemp("feedline-data")
    tool("feedline-make-corpus", "--output", str(d / "corpus.jsonl"), "--documents", "300", "--seed", "5")
    tool("feedline-pack", "--quiet", "--append-eos", "--input", str(d / "corpus.jsonl"), "--train-model", "400",
         "--output", str(d / "corpus"))
    tool("feedline-pack", "--quiet", "--append-eos", "--input", str(d / "corpus.jsonl"), "--model", str(d / "corpus.model"),
         "--format", "llmc", "--shard-size", "40000", "--output", str(d / "shard"))
    return {"megatron": str(d / "corpus"), "llmc": str(d / "shard_*.bin"), "jsonl": str(d / "corpus.jsonl"),
            "model": str(d / "corpus.model"), "dir": d}


def iterate(spec: str, *args: str) -> dict:
    """feedline-iterate's JSON summary (token_sum, state, ...) for the same data and config."""
    return json.loads(tool("feedline-iterate", spec, *args).strip().splitlines()[-1])
