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


@pytest.fixture(scope="session", autouse=True)
def cache_dir(tmp_path_factory):
    """feedline's caches (token counts, remote blocks) in the session's scratch, never the user's: a cache
    left by an earlier run would answer reads the tests expect to see made."""
    os.environ["FEEDLINE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


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


@pytest.fixture(scope="session")
def s3(data, tmp_path_factory):
    """The Megatron and llm.c data of `data`, uploaded to a real S3 server (SeaweedFS on 127.0.0.1, started
    by scripts/s3-test-server.sh and stopped after the session), with this process's AWS settings pointed at
    it. {'megatron': url, 'llmc': url, 'endpoint': str}"""
    root = Path(__file__).resolve().parents[2]
    server = tmp_path_factory.mktemp("s3") / "server"
    r = subprocess.run([str(root / "scripts" / "s3-test-server.sh"), "start", str(server)], capture_output=True, text=True)
    if r.returncode == 77:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    endpoint = (server / "endpoint").read_text().strip()
    sign = ["--aws-sigv4", "aws:amz:us-east-1:s3", "--user", "feedline:feedline-secret", "--fail", "--silent", "--show-error"]
    try:
        subprocess.run(["curl", *sign, "-X", "PUT", f"{endpoint}/python-tests"], check=True)
        for f in sorted(data["dir"].iterdir()):
            if f.suffix in (".bin", ".idx"):
                subprocess.run(["curl", *sign, "-T", str(f), f"{endpoint}/python-tests/data/{f.name}"], check=True)
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "feedline", "AWS_SECRET_ACCESS_KEY": "feedline-secret",
                           "AWS_REGION": "us-east-1"})
        yield {"megatron": "s3://python-tests/data/" + Path(data["megatron"]).name,
               "llmc": "s3://python-tests/data/" + Path(data["llmc"]).name, "endpoint": endpoint}
    finally:
        subprocess.run([str(root / "scripts" / "s3-test-server.sh"), "stop", str(server)], capture_output=True)
