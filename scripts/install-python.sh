#!/usr/bin/env bash
# Builds and installs feedline's Python package into .venv-py, a fresh virtual environment over
# Debian's python3 (whose torch and numpy it uses), then checks that it imports. `pip install .`
# fetches its build requirements (scikit-build-core, nanobind) from PyPI. Run scripts/install-deps.sh
# first; `tokenizers` (PyPI) comes too, for the tests. Safe to run repeatedly: the CMake build under build/python/ is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-py
[[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check .
# The `tokenizers` package, for the differential tests of feedline's tokenizer.json encoder (and its benchmark).
"$venv/bin/pip" install -q --disable-pip-version-check "tokenizers==0.23.3"
# Imported from outside the source tree, so it is the installed package that is found.
python="$PWD/$venv/bin/python"
(cd / && "$python" -c "import feedline, feedline.torch; print('feedline', feedline.__version__, 'for Python: installed at', feedline.__file__)")
