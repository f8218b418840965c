#!/usr/bin/env bash
# Sets up and runs every test: AddressSanitizer + UndefinedBehaviorSanitizer (clang, with the libFuzzer
# targets), ThreadSanitizer (gcc) and the default build (gcc). Exits non-zero on any failure; the last lines
# printed are ctest's summary of the default build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

jobs="${FEEDLINE_JOBS:-$(nproc)}"
mkdir -p build
run_preset() {
  local preset="$1"
  echo "=== ${preset}: configure and build"
  cmake --preset "$preset" > "build/configure-${preset}.log" 2>&1 || { cat "build/configure-${preset}.log"; exit 1; }
  cmake --build --preset "$preset" -j "$jobs" > "build/build-${preset}.log" 2>&1 || { tail -80 "build/build-${preset}.log"; exit 1; }
  echo "=== ${preset}: test"
  ctest --preset "$preset" -j "$jobs" "${@:2}"
}

run_preset asan
run_preset tsan
run_preset default
