"""feedline from Python in a few lines: batches of token windows as torch tensors, stats, and resume.

    python examples/python/quickstart.py demo-output/corpus          # a Megatron prefix (scripts/demo.sh makes one)
    python examples/python/quickstart.py corpus.jsonl --tokenizer corpus.model
"""
import argparse
import json

import feedline

parser = argparse.ArgumentParser()
parser.add_argument("data", help="shards (Megatron prefix, llm.c glob, directory), JSONL/text, or a blend '0.7 a 0.3 b'")
parser.add_argument("--tokenizer", help="sentencepiece model, for JSONL/text")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

pipe = feedline.Pipeline(args.data, batch_size=8, seq_len=256, seed=1, tokenizer=args.tokenizer, max_steps=args.steps)
for batch in pipe:
    x, y = batch.inputs, batch.targets          # [8, 256] int32, no copy; on the GPU when there is one
    if batch.step == args.steps // 2:
        state = pipe.state_dict()               # keep it in your checkpoint (JSON-serialisable)
print(json.dumps({k: pipe.stats()[k] for k in ("batches", "tokens_per_s", "stall_fraction", "workers", "device")}))

resumed = feedline.Pipeline(args.data, batch_size=8, seq_len=256, seed=1, tokenizer=args.tokenizer, max_steps=args.steps)
resumed.load_state_dict(state)                  # continues with the batch after the saved one
print("resumed at step", next(resumed).step)
