#!/usr/bin/env python3
"""feedline from Python against what PyTorch users load token shards with today, in one process, on
the same llm.c shards (B x T windows of uint16 tokens, page cache warm):

  - throughput with a consumer that only touches the tensors (reads one element of inputs and
    targets): feedline (Python; also with copy=True, every batch kept in memory torch owns), feedline-iterate (C++, same config, run in the same session; it sums
    every token, so feedline from Python is also timed summing), DataLoader over np.memmap with 0, 2
    and 4 workers (pin_memory on), nanoGPT's get_batch and numpy fancy indexing;
  - a paced consumer (a fixed CPU busy-loop per step): p50/p99 of the wait for the next batch;
  - host memory: PSS summed over the process and its children (DataLoader workers), which counts pages
    the processes share once, before and while each loader runs;
  - with --text and --tokenizer: tokenizing JSONL on the fly, feedline with 2 workers against a
    DataLoader (2 workers) whose dataset encodes with sentencepiece's Python binding and packs the
    tokens into the same B x T windows.

Run from the repository root with the package installed (scripts/install-python.sh):

    .venv-py/bin/python benchmarks/bench_python.py --data '/tmp/e2e/shard_*.bin' --iterate build/release/bin/feedline-iterate

Prints one line per measurement, then one JSON object with every figure and the ratios
(feedline_vs_cpp, feedline_vs_best_python).
"""
import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_python import Windows, open_shards  # noqa: E402  (the same peers bench_end_to_end compares with)

import feedline  # noqa: E402


def memory(pid):
    """Pss and its anonymous, file and shared-memory parts (bytes), summed over a process and all its
    descendants, from /proc/PID/smaps_rollup. PSS counts a page shared by k processes as 1/k in each,
    so DataLoader workers' shared pages are counted once in the sum."""
    keys = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem")
    total = dict.fromkeys(keys, 0)
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in total:
                        total[k] += int(v.split()[0]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return total


def pss_bytes(pid):
    return memory(pid)["Pss"]


def memory_child(a):
    """One loader alone in this process: its batches consumed, memory sampled every 50, the peak printed."""
    B, T = a.batch_size, a.seq_len
    steps = a.batches if a.memory_child == "feedline" else max(200, a.peer_batches)
    info = {}
    if a.memory_child == "feedline":
        pipe = feedline.Pipeline(a.data, batch_size=B, seq_len=T, seed=1, device="cpu", max_steps=steps + 1)
        source = ((b.inputs, b.targets) for b in pipe)
    elif a.memory_child == "dataloader_w4":
        source = iter(torch.utils.data.DataLoader(Windows(a.data, T, (steps + 10) * B), batch_size=B, num_workers=4, pin_memory=True,
                                                  persistent_workers=True, prefetch_factor=2))
    else:  # "idle": the interpreter, torch and feedline imported, no loader
        source = iter(())
    peak = memory(os.getpid())
    for i, (x, y) in enumerate(source):
        int(x[0, 0])
        if i % 50 == 49:
            now = memory(os.getpid())
            peak = {k: max(peak[k], now[k]) for k in peak}
        if i >= steps:
            break
    if a.memory_child == "feedline":
        st = pipe.stats()
        info = {"memory_budget": st["memory_budget"], "planned_bytes": st["planned_bytes"], "workers": st["workers"]}
    print(json.dumps({"loader": a.memory_child, "batches": steps, **{k.lower(): v for k, v in peak.items()}, **info}))


def memory_comparison(a, out):
    """feedline and DataLoader (4 workers) each in a process of its own, against an idle one."""
    rows = {}
    for loader in ("idle", "feedline", "dataloader_w4"):
        cmd = [sys.executable, os.path.abspath(__file__), "--data", a.data, "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len),
               "--batches", str(a.batches), "--peer-batches", str(a.peer_batches), "--memory-child", loader]
        rows[loader] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    mib = 1 << 20
    for loader in ("feedline", "dataloader_w4"):
        r, idle = rows[loader], rows["idle"]
        for k in ("pss", "pss_anon", "pss_file", "pss_shmem"):
            out[f"mem_{loader}_{k}"] = r[k]
        print(f"memory, {loader} alone: PSS {r['pss'] / mib:.0f} MiB (idle process {idle['pss'] / mib:.0f}, anon {idle['pss_anon'] / mib:.0f}): "
              f"anon {r['pss_anon'] / mib:.0f}, "
              f"file {r['pss_file'] / mib:.0f}, shmem {r['pss_shmem'] / mib:.0f}"
              + (f"; feedline's plan {r['planned_bytes'] / mib:.0f} MiB of a {r['memory_budget'] / mib:.0f} MiB budget" if loader == "feedline" else ""),
              flush=True)
    out["mem_idle_pss"] = rows["idle"]["pss"]
    out["mem_feedline_planned_bytes"] = rows["feedline"]["planned_bytes"]
    out["mem_dataloader_vs_feedline_anon_shmem"] = (rows["dataloader_w4"]["pss_anon"] + rows["dataloader_w4"]["pss_shmem"]) / max(
        1, rows["feedline"]["pss_anon"] + rows["feedline"]["pss_shmem"])


def run(batches, source, touch):
    """tokens/s over `batches` steps of `source` (an iterator of (x, y)); the first step is start-up."""
    it = iter(source)
    touch(*next(it))
    t0 = time.perf_counter()
    for _ in range(batches):
        touch(*next(it))
    return time.perf_counter() - t0


def paced(source, batches, busy_s):
    """Wait per step of a consumer that computes for busy_s between batches: (p50, p99) in microseconds."""
    it = iter(source)
    next(it)
    waits = []
    for _ in range(batches):
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - t0)
    waits.sort()
    return 1e6 * statistics.median(waits), 1e6 * waits[int(0.99 * (len(waits) - 1))]


class SpmWindows(torch.utils.data.IterableDataset):
    """What a DataLoader user writes to tokenize on the fly: each worker reads every n-th JSONL line,
    encodes it with sentencepiece's Python binding, appends EOS and cuts B x (T + 1) windows."""

    def __init__(self, path, model, B, T):
        self.path, self.model, self.B, self.T = path, model, B, T

    def __iter__(self):
        import sentencepiece as spm
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        sp = spm.SentencePieceProcessor(model_file=self.model)
        need = self.B * (self.T + 1)
        buf = []
        while True:
            with open(self.path) as f:
                for i, line in enumerate(f):
                    if i % n != k:
                        continue
                    buf += sp.encode(json.loads(line)["text"]) + [sp.eos_id()]
                    while len(buf) >= need:
                        w = torch.tensor(buf[:need], dtype=torch.int32).view(self.B, self.T + 1)
                        del buf[:need]
                        yield w[:, :-1], w[:, 1:]


def tokenize_on_the_fly(a, out, touch):
    B, T, n = a.batch_size, a.seq_len, a.text_batches
    tokens = n * B * T

    def feed():
        pipe = feedline.Pipeline(a.text, tokenizer=a.tokenizer, batch_size=B, seq_len=T, seed=1, workers=2, device="cpu", max_steps=n + 1)
        for b in pipe:
            yield b.inputs, b.targets

    out["text_feedline_2w"] = tokens / run(n, feed(), touch)
    loader = torch.utils.data.DataLoader(SpmWindows(a.text, a.tokenizer, B, T), batch_size=None, num_workers=2, prefetch_factor=2)
    out["text_dataloader_spm_2w"] = tokens / run(n, loader, touch)
    out["text_feedline_vs_dataloader"] = out["text_feedline_2w"] / out["text_dataloader_spm_2w"]
    print(f"tokenizing JSONL, 2 workers: feedline {out['text_feedline_2w'] / 1e6:.2f} M tokens/s, DataLoader + sentencepiece "
          f"{out['text_dataloader_spm_2w'] / 1e6:.2f} M tokens/s -> {out['text_feedline_vs_dataloader']:.2f}x", flush=True)


def on_the_gpu(a, out, data, B, T):
    """Batches delivered into GPU memory: feedline's device ring (tensors over the device slot) against
    a DataLoader with pinned batches and nanoGPT's pin_memory().to(non_blocking=True) path. Every step
    runs a kernel that reads both tensors; each figure ends with a synchronize."""
    dev = torch.device("cuda")
    n = a.batches

    def touch(x, y):
        return x[0, 0] + y[-1, -1]

    def timed(steps, source):
        it = iter(source)
        touch(*next(it))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            touch(*next(it))
        torch.cuda.synchronize()
        return steps * B * T / (time.perf_counter() - t0)

    def feedline_gpu():
        pipe = feedline.Pipeline(a.data, batch_size=B, seq_len=T, seed=1, device="cuda", max_steps=n + 1)
        for b in pipe:
            yield b.inputs, b.targets

    def to_device(source):
        for x, y in source:
            yield x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    rng = np.random.default_rng(0)
    offsets = np.arange(T + 1)

    def fancy_pinned():
        while True:
            ix = rng.integers(0, len(data) - T - 1, B)
            w = torch.from_numpy(data[ix[:, None] + offsets].astype(np.int64)).pin_memory().to(dev, non_blocking=True)
            yield w[:, :-1], w[:, 1:]

    out["gpu_feedline"] = timed(n, feedline_gpu())
    kw = dict(batch_size=B, shuffle=False, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)
    m = a.peer_batches
    out["gpu_dataloader_w4"] = timed(m, to_device(torch.utils.data.DataLoader(Windows(a.data, T, (m + 10) * B), **kw)))
    out["gpu_numpy_fancy_pinned"] = timed(m, fancy_pinned())
    best = max(out["gpu_dataloader_w4"], out["gpu_numpy_fancy_pinned"])
    out["gpu_feedline_vs_best_python"] = out["gpu_feedline"] / best
    print(f"into GPU memory ({torch.cuda.get_device_name()}): feedline {out['gpu_feedline'] / 1e6:.0f} M tokens/s, DataLoader w4 + "
          f"non_blocking copies {out['gpu_dataloader_w4'] / 1e6:.1f}, numpy fancy indexing + pin_memory {out['gpu_numpy_fancy_pinned'] / 1e6:.1f}"
          f" -> {out['gpu_feedline_vs_best_python']:.1f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="llm.c shard glob (uint16)")
    ap.add_argument("--iterate", help="feedline-iterate, for the C++ figure in the same session")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of feedline from Python and feedline-iterate")
    ap.add_argument("--peer-batches", type=int, default=200, help="steps for the (much slower) Python loaders")
    ap.add_argument("--busy-us", type=float, default=2000, help="the paced consumer's compute per step")
    ap.add_argument("--text", help="JSONL corpus for the on-the-fly tokenization comparison (with --tokenizer)")
    ap.add_argument("--tokenizer", help="sentencepiece model for --text")
    ap.add_argument("--text-batches", type=int, default=100)
    ap.add_argument("--gpu", action="store_true", help="also deliver batches into GPU memory (needs torch with CUDA and a GPU)")
    ap.add_argument("--memory", action="store_true", help="also compare memory (PSS) with each loader in a process of its own")
    ap.add_argument("--memory-child", choices=("idle", "feedline", "dataloader_w4"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.memory_child:
        return memory_child(a)
    B, T = a.batch_size, a.seq_len
    torch.set_num_threads(1)
    out = {"batch_size": B, "seq_len": T, "cpus": os.cpu_count()}
    me = os.getpid()
    out["pss_idle"] = pss_bytes(me)

    def touch(x, y):
        return int(x[0, 0]) + int(y[-1, -1])

    def summed(x, y):
        return int(x.sum())

    def feedline_batches(n, copy=False):
        pipe = feedline.Pipeline(a.data, batch_size=B, seq_len=T, seed=1, device="cpu", max_steps=n + 1, copy=copy)
        for b in pipe:
            yield b.inputs, b.targets

    tokens = a.batches * B * T
    out["pss_feedline"] = pss_bytes(me)
    # Python (a consumer that touches the tensors, and one that sums every token in torch) against
    # C++ (feedline-iterate, which sums every token) in interleaved rounds, medians: single runs on a
    # shared machine moved the ratio between 0.6 and 1.0.
    touches, copies, py_sums, cpp_sums = [], [], [], []
    for _ in range(a.rounds):
        touches.append(tokens / run(a.batches, feedline_batches(a.batches), touch))
        gc.collect()
        copies.append(tokens / run(a.batches, feedline_batches(a.batches, copy=True), touch))  # every batch kept (copied)
        gc.collect()
        py_sums.append(tokens / run(a.batches, feedline_batches(a.batches), summed))
        gc.collect()
        if a.iterate:
            r = subprocess.run([a.iterate, a.data, "--batch-size", str(B), "--seq-len", str(T), "--seed", "1", "--device", "cpu",
                                "--batches", str(a.batches + 1)], capture_output=True, text=True, check=True)
            cpp_sums.append(json.loads(r.stdout.strip().splitlines()[-1])["tokens_per_s"])
    out["feedline_touch"] = statistics.median(touches)
    out["feedline_sum"] = statistics.median(py_sums)
    out["feedline_copy_touch"] = statistics.median(copies)
    out["copy_vs_zero_copy"] = statistics.median([c / t for c, t in zip(copies, touches)])

    def spread(xs):
        return f"{min(xs) / 1e6:.0f}-{max(xs) / 1e6:.0f}"

    print(f"feedline (Python), medians of {a.rounds} rounds: touch {out['feedline_touch'] / 1e6:.0f} M tokens/s ({spread(touches)}); "
          f"summing {out['feedline_sum'] / 1e6:.0f} M tokens/s ({spread(py_sums)}); copy=True, touch "
          f"{out['feedline_copy_touch'] / 1e6:.0f} M tokens/s ({spread(copies)}), {out['copy_vs_zero_copy']:.2f}x zero copy", flush=True)
    if cpp_sums:
        out["feedline_cpp_sum"] = statistics.median(cpp_sums)
        out["feedline_vs_cpp"] = statistics.median([p / c for p, c in zip(touches, cpp_sums)])
        out["feedline_sum_vs_cpp"] = statistics.median([p / c for p, c in zip(py_sums, cpp_sums)])
        print(f"feedline-iterate (C++), summing: {out['feedline_cpp_sum'] / 1e6:.0f} M tokens/s ({spread(cpp_sums)}) -> Python/C++, "
              f"medians of the rounds' ratios: touching {out['feedline_vs_cpp']:.2f}, summing {out['feedline_sum_vs_cpp']:.2f}", flush=True)
    out["feedline_paced_p50_us"], out["feedline_paced_p99_us"] = paced(feedline_batches(300), 300, a.busy_us / 1e6)
    gc.collect()

    peers = {}
    n = a.peer_batches
    for workers in (0, 2, 4):
        kw = dict(batch_size=B, shuffle=False, num_workers=workers, pin_memory=True)
        if workers:
            kw.update(persistent_workers=True, prefetch_factor=2)
        loader = torch.utils.data.DataLoader(Windows(a.data, T, (n + 10) * B), **kw)
        name = f"dataloader_w{workers}"
        peers[name] = n * B * T / run(n, loader, touch)
        out[f"pss_{name}"] = pss_bytes(me)
        if workers == 4:
            loader = torch.utils.data.DataLoader(Windows(a.data, T, (310) * B), **kw)
            out["dataloader_w4_paced_p50_us"], out["dataloader_w4_paced_p99_us"] = paced(loader, 300, a.busy_us / 1e6)
        del loader
        gc.collect()
        print(f"{name} (pin_memory): {peers[name] / 1e6:.1f} M tokens/s", flush=True)

    data = open_shards(a.data)[0]

    def get_batch():  # nanoGPT's train.py
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([torch.from_numpy(data[i: i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1: i + 1 + T].astype(np.int64)) for i in ix])
        return x, y

    def forever(f):
        while True:
            yield f()

    peers["nanogpt_get_batch"] = n * B * T / run(n, forever(get_batch), touch)
    rng = np.random.default_rng(0)
    offsets = np.arange(T + 1)

    def fancy():
        ix = rng.integers(0, len(data) - T - 1, B)
        w = torch.from_numpy(data[ix[:, None] + offsets].astype(np.int64))
        return w[:, :-1], w[:, 1:]

    peers["numpy_fancy_indexing"] = n * B * T / run(n, forever(fancy), touch)
    for k in ("nanogpt_get_batch", "numpy_fancy_indexing"):
        print(f"{k}: {peers[k] / 1e6:.1f} M tokens/s", flush=True)
    if a.text and a.tokenizer:
        tokenize_on_the_fly(a, out, touch)
    if a.memory:
        memory_comparison(a, out)
    if a.gpu:
        if torch.cuda.is_available():
            on_the_gpu(a, out, data, B, T)
        else:
            print("--gpu: skipped, torch.cuda.is_available() is False", flush=True)

    best = max(peers, key=peers.get)
    out.update(peers)
    out["best_python"] = best
    out["feedline_vs_best_python"] = out["feedline_touch"] / peers[best]
    print(f"feedline / best Python loader ({best}): {out['feedline_vs_best_python']:.1f}x", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
