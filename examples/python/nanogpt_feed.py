"""nanoGPT's training loop with its get_batch() replaced by feedline.

nanoGPT reads a uint16 memmap and copies random windows into a pinned tensor every step:

    def get_batch(split):
        data = np.memmap(os.path.join(data_dir, f'{split}.bin'), dtype=np.uint16, mode='r')
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
        ...

With feedline the batches are prepared by worker threads ahead of the loop, straight into staging
slots, and arrive as tensors (on the GPU when there is one) without a copy; the loop only changes in
where x and y come from. It reads nanoGPT's own prepare.py output as it is (headerless uint16 tokens,
named "raw:uint16:<file>"), as well as feedline's shards and JSONL:

    python examples/python/nanogpt_feed.py --data raw:uint16:data/openwebtext/train.bin --vocab 50304
    python examples/python/nanogpt_feed.py --data demo-output/corpus --steps 300
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import feedline


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, d=128, layers=2, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((block, block), float("-inf")), diagonal=1))

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:T, :T])
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1).long())  # padding targets are -100, its default ignore_index


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="nanoGPT's train.bin as raw:uint16:PATH, shards, or JSONL with --tokenizer")
    p.add_argument("--tokenizer")
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size (default: 1 + the largest id in a sample of batches, rounded up to 64)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.manual_seed(1)

    # The one change: feedline instead of get_batch().
    pipe = feedline.Pipeline(args.data, batch_size=args.batch_size, seq_len=args.block_size, seed=1, tokenizer=args.tokenizer,
                             device=args.device, max_steps=args.steps)
    vocab = args.vocab
    if not vocab:  # the largest id in a sample of batches, rounded up as nanoGPT rounds GPT-2's
        probe = feedline.Pipeline(args.data, batch_size=64, seq_len=args.block_size, seed=2, tokenizer=args.tokenizer, device="cpu", max_steps=50)
        vocab = (1 + max(int(b.inputs.max()) for b in probe) + 63) // 64 * 64

    model = GPT(vocab, args.block_size).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    t0, first = time.time(), None
    for batch in pipe:
        x, y = batch.inputs, batch.targets       # was: x, y = get_batch('train')
        lr = 3e-3 * min(1.0, (batch.step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * batch.step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(x.long(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
        if batch.step % 50 == 0 or batch.step == args.steps - 1:
            s = pipe.stats()
            print(f"step {batch.step:4d} | loss {loss.item():.4f} | data stall {100 * s['stall_fraction']:.2f}% | {time.time() - t0:.1f}s")
    print(f"loss {first:.3f} -> {loss.item():.3f} in {args.steps} steps on {args.device}; feedline: {pipe.describe()}")


if __name__ == "__main__":
    main()
