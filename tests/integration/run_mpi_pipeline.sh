#!/usr/bin/env bash
# Launches pipeline_ranks with real processes under Open MPI's mpirun and checks that the ranks' slices
# of shard and text batches join to the one-process batches. Usage: run_mpi_pipeline.sh BINARY SCRATCH NP.
# Exit 77 (skipped) when mpirun is not installed.
set -euo pipefail
bin="$1" scratch="$2" np="$3"
command -v mpirun >/dev/null || { echo "SKIPPED: mpirun not installed (Debian package openmpi-bin)"; exit 77; }
dir="$scratch/mpi-pipeline-$np-$$"
rm -rf "$dir" && mkdir -p "$dir"
"$bin" --prepare "$dir"
# Root is allowed explicitly (CI runs as root); --oversubscribe lets 3 ranks share 2 cores. Every rank
# counts the text's token lengths at once and publishes the same cache file: renames are atomic.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$bin" "$dir"
"$bin" --check "$dir" "$np"
rm -rf "$dir"
