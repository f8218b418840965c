#!/usr/bin/env bash
# Sets up and runs every test: AddressSanitizer + UndefinedBehaviorSanitizer (clang, with the libFuzzer
# targets), ThreadSanitizer (gcc) and the default build (gcc), then the Python package's tests (pytest,
# against its manylinux wheel installed in a fresh venv, compared with the default build's tools). Exits non-zero on any failure.
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

echo "=== python: install the package in a fresh venv and test it"
rm -rf .venv-py
scripts/install-python.sh
# Against the installed wheel, with no compiler, linker, CMake or make on PATH: it must need none.
nobuild="$PWD/build/path-without-build-tools"
rm -rf "$nobuild" && mkdir -p "$nobuild"
for f in /usr/local/bin/* /usr/bin/*; do
  n=$(basename "$f")
  case "$n" in
    cc | c++ | cpp | gcc* | g++* | *-gcc* | *-g++* | clang* | cmake | ctest | cpack | make | ninja | ld | ld.* | *-ld | *-ld.* | as | *-as | nvcc) continue ;;
  esac
  [[ -e $nobuild/$n ]] || ln -s "$f" "$nobuild/$n"
done
PATH="$PWD/.venv-py/bin:$nobuild" FEEDLINE_TEST_NO_BUILD_TOOLS=1 FEEDLINE_BIN_DIR="$PWD/build/default/bin" \
  .venv-py/bin/python -m pytest -q -p no:cacheprovider tests/python
