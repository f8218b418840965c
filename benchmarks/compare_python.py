#!/usr/bin/python3
"""Python peers for bench_end_to_end: the same random windows (B x (T+1) uint16 tokens from llm.c
shards, as int64 inputs/targets) through PyTorch's DataLoader (map-style dataset over np.memmap,
num_workers 0/1/2, persistent workers, prefetch 2/4), nanoGPT's get_batch (Python loop + torch.stack),
and vectorised numpy fancy indexing. Prints one line per peer and, last, one JSON object
{"peers": {name: tokens_per_s}, "best_peer": name, "best_tokens_per_s": x}.
Run with Debian's /usr/bin/python3 (python3-torch, python3-numpy)."""
import argparse, glob, json, os, time

import numpy as np
import torch

HEADER_BYTES = 256 * 4  # llm.c: 256 int32 header words, then uint16 tokens


def open_shards(pattern):
    return [np.memmap(p, dtype=np.uint16, mode="r", offset=HEADER_BYTES) for p in sorted(glob.glob(pattern))]


class Windows(torch.utils.data.Dataset):
    """Sample i: a random window (seeded by i) of T+1 tokens from a random shard."""

    def __init__(self, pattern, T, n):
        self.pattern, self.T, self.n, self.shards = pattern, T, n, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.shards is None:  # opened in each worker process
            self.shards = open_shards(self.pattern)
        rng = np.random.default_rng(i)
        s = self.shards[rng.integers(len(self.shards))]
        o = int(rng.integers(len(s) - self.T - 1))
        w = torch.from_numpy(s[o : o + self.T + 1].astype(np.int64))
        return w[:-1], w[1:]


def time_loader(loader, B, T, batches):
    it = iter(loader)
    next(it)  # start-up (worker spawn) is not throughput
    t0 = time.perf_counter()
    for _ in range(batches):
        x, y = next(it)
    return batches * B * T / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="llm.c shard glob")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=300)
    a = ap.parse_args()
    B, T, N = a.batch_size, a.seq_len, a.batches
    torch.set_num_threads(1)
    peers = {}
    for workers, prefetch in [(0, None), (1, 2), (2, 2), (2, 4)]:
        kw = dict(batch_size=B, shuffle=False, num_workers=workers)
        if workers:
            kw.update(persistent_workers=True, prefetch_factor=prefetch)
        loader = torch.utils.data.DataLoader(Windows(a.data, T, (N + 10) * B), **kw)
        name = f"torch_dataloader_w{workers}" + (f"_p{prefetch}" if workers else "")
        peers[name] = time_loader(loader, B, T, N)
        print(f"{name}: {peers[name] / 1e6:.1f} M tokens/s", flush=True)
        del loader

    shards = open_shards(a.data)
    data = shards[0]
    rng = np.random.default_rng(0)

    def get_batch():  # nanoGPT's train.py
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([torch.from_numpy(data[i : i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + T].astype(np.int64)) for i in ix])
        return x, y

    t0 = time.perf_counter()
    for _ in range(N):
        get_batch()
    peers["nanogpt_get_batch"] = N * B * T / (time.perf_counter() - t0)
    print(f"nanogpt_get_batch: {peers['nanogpt_get_batch'] / 1e6:.1f} M tokens/s", flush=True)

    offsets = np.arange(T + 1)
    t0 = time.perf_counter()
    for _ in range(N):
        ix = rng.integers(0, len(data) - T - 1, B)
        w = data[ix[:, None] + offsets].astype(np.int64)
        x, y = w[:, :-1], w[:, 1:]
    peers["numpy_fancy_indexing"] = N * B * T / (time.perf_counter() - t0)
    print(f"numpy_fancy_indexing: {peers['numpy_fancy_indexing'] / 1e6:.1f} M tokens/s", flush=True)

    best = max(peers, key=peers.get)
    print(json.dumps({"peers": peers, "best_peer": best, "best_tokens_per_s": peers[best]}))


if __name__ == "__main__":
    main()
