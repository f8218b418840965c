#!/usr/bin/env bash
# The main job: set up, build, make a small English-like corpus, train a sentencepiece model on it,
# pack it into Megatron shards, inspect them, and train the sample model on them with feedline-train
# for about a minute (GPU if present, else CPU), ending with a summary of loss, throughput and data stall.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs="${FEEDLINE_JOBS:-$(nproc)}"
seconds="${FEEDLINE_DEMO_SECONDS:-60}"
cmake --preset release > /dev/null
cmake --build --preset release -j "$jobs" --target feedline-make-corpus feedline-pack feedline-inspect feedline-iterate feedline-train > /dev/null
bin=build/release/bin
out=demo-output
rm -rf "$out" && mkdir -p "$out"

echo "== 1. corpus: 20000 training documents and 1000 held-out ones"
"$bin/feedline-make-corpus" --output "$out/corpus.jsonl" --documents 20000 --seed 1
"$bin/feedline-make-corpus" --output "$out/heldout.jsonl" --documents 1000 --seed 2
echo "== 2. sentencepiece model (vocabulary 8000) + Megatron shards"
"$bin/feedline-pack" --input "$out/corpus.jsonl" --train-model 8000 --output "$out/corpus" --append-eos
"$bin/feedline-pack" --input "$out/heldout.jsonl" --model "$out/corpus.model" --output "$out/heldout" --append-eos
echo "== 3. inspect"
"$bin/feedline-inspect" "$out/corpus"
echo "== 4. the pipeline alone: [32, 256] batches, no model (GPU if present, else host memory)"
"$bin/feedline-iterate" "$out/corpus" --batch-size 32 --seq-len 256 --batches 2000 --device auto
echo "== 5. train the sample model for ${seconds} s (GPU if present, else CPU)"
"$bin/feedline-train" --data "$out/corpus" --eval-data "$out/heldout" --tokenizer "$out/corpus.model" \
  --max-seconds "$seconds" --checkpoint "$out/checkpoint" --device auto
echo "== done: shards, model and checkpoint in $out/"
