#!/usr/bin/env bash
# The main job: set up, build, make a small English-like corpus, train a sentencepiece model on it,
# pack it into Megatron shards and llm.c shards, inspect both, and stream batches from each through the
# pipeline (same sampler, two formats). Until the sample trainer exists, that is the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs="${FEEDLINE_JOBS:-$(nproc)}"
cmake --preset release > /dev/null
cmake --build --preset release -j "$jobs" --target feedline-make-corpus feedline-pack feedline-inspect feedline-iterate > /dev/null
bin=build/release/bin
out=demo-output
rm -rf "$out" && mkdir -p "$out"

echo "== 1. corpus"
"$bin/feedline-make-corpus" --output "$out/corpus.jsonl" --documents 20000 --seed 1
echo "== 2. sentencepiece model (vocabulary 8000) + Megatron shards"
"$bin/feedline-pack" --input "$out/corpus.jsonl" --train-model 8000 --output "$out/corpus" --append-eos
echo "== 3. llm.c shards with the same model"
"$bin/feedline-pack" --input "$out/corpus.jsonl" --model "$out/corpus.model" --output "$out/corpus_train" --format llmc --shard-size 1000000
echo "== 4. inspect"
"$bin/feedline-inspect" "$out/corpus"
"$bin/feedline-inspect" "$out/corpus_train_*.bin"
echo "== 5. stream [32, 256] batches through the pipeline (GPU if present, else host memory)"
"$bin/feedline-iterate" "$out/corpus" --batch-size 32 --seq-len 256 --batches 2000 --device auto
"$bin/feedline-iterate" "$out/corpus_train_*.bin" --batch-size 32 --seq-len 256 --batches 2000 --mode windows --device auto
echo "== done: shards in $out/"
