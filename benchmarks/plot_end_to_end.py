#!/usr/bin/python3
"""Draws bench_end_to_end's result (its last output line, a JSON object run with --peers) as a bar
chart of tokens/s on a log scale: the hand-written gather loops, feedline, and the Python loaders.

    build/release/bin/bench_end_to_end --data 'GLOB' --peers | tail -1 > e2e.json
    /usr/bin/python3 benchmarks/plot_end_to_end.py e2e.json docs/img/end_to_end.svg

Needs matplotlib (Debian: apt-get install python3-matplotlib); run with Debian's python3.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")  # files only, no display
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: a small, searchable SVG
import matplotlib.pyplot as plt  # noqa: E402

PEER_LABELS = {
    "torch_dataloader_w0": "DataLoader, 0 workers",
    "torch_dataloader_w1_p2": "DataLoader, 1 worker, prefetch 2",
    "torch_dataloader_w2_p2": "DataLoader, 2 workers, prefetch 2",
    "torch_dataloader_w2_p4": "DataLoader, 2 workers, prefetch 4",
    "nanogpt_get_batch": "nanoGPT get_batch",
    "numpy_fancy_indexing": "numpy fancy indexing",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="file holding bench_end_to_end's last output line")
    ap.add_argument("output", help="image to write (.svg or .png)")
    ap.add_argument("--title", default="Random [32, 1024] windows from warm uint16 shards, CPU only")
    a = ap.parse_args()
    with open(a.result) as f:
        r = json.loads(f.read().strip().splitlines()[-1])
    if "peers" not in r:
        raise SystemExit(f"{a.result}: no 'peers' (run bench_end_to_end with --peers)")

    rows = [(PEER_LABELS.get(k, k), v, "python") for k, v in sorted(r["peers"].items(), key=lambda kv: kv[1])]
    rows += [
        ("naive C++ gather, 1 thread", r["naive_gather_1t"], "baseline"),
        ("feedline, 1 worker", r["tokens_per_s_1w"], "feedline"),
        ("naive C++ gather, 2 threads", r["naive_gather_2t"], "baseline"),
        ("feedline, 2 workers", r["tokens_per_s"], "feedline"),
    ]
    # The gather loop with feedline's software prefetch (benchmarks since 2026-11-24).
    if "gather_prefetch_1t" in r:
        rows += [
            ("C++ gather + prefetch, 1 thread", r["gather_prefetch_1t"], "baseline"),
            ("C++ gather + prefetch, 2 threads", r["gather_prefetch_2t"], "baseline"),
        ]
    colors = {"python": "#9e9e9e", "baseline": "#5c7cba", "feedline": "#e07b39"}

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    y = range(len(rows))
    ax.barh(list(y), [v for _, v, _ in rows], color=[colors[k] for _, _, k in rows])
    ax.set_yticks(list(y), [n for n, _, _ in rows])
    ax.set_xscale("log")
    ax.set_xlabel("tokens/s (log scale)")
    ax.set_title(a.title, fontsize=10)
    for i, (_, v, _) in enumerate(rows):
        ax.text(v * 1.05, i, f"{v / 1e6:,.0f} M", va="center", fontsize=8)
    ax.set_xlim(right=max(v for _, v, _ in rows) * 4)
    ax.grid(axis="x", which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.output)


if __name__ == "__main__":
    main()
