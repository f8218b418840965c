#!/usr/bin/env bash
# Launches sampler_ranks with real processes under Open MPI's mpirun and checks the rank slices.
# Usage: run_mpi_ranks.sh BINARY SCRATCH NP. Exit 77 (skipped) when mpirun is not installed.
set -euo pipefail
bin="$1" scratch="$2" np="$3"
command -v mpirun >/dev/null || { echo "SKIPPED: mpirun not installed (Debian package openmpi-bin)"; exit 77; }
dir="$scratch/mpi-ranks-$np-$$"
rm -rf "$dir" && mkdir -p "$dir"
# Root is allowed explicitly (CI runs as root); --oversubscribe lets 3 ranks share 2 cores.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --allow-run-as-root --oversubscribe -np "$np" "$bin" "$dir"
"$bin" --check "$dir" "$np"
rm -rf "$dir"
