"""The console entry points (`feedline-pack`, `feedline-inspect`, `feedline-iterate`, `feedline-doctor`):
each runs the C++ tool the package carries in feedline/bin/, in place of this Python process (exec),
so its arguments, output, signals and exit status are the tool's own."""
from __future__ import annotations

import os
import sys
from pathlib import Path

_BIN = Path(__file__).resolve().parent / "bin"


def tool_path(name: str) -> Path:
    """The packaged tool `name` (e.g. "feedline-pack"). Raises FileNotFoundError naming it and why
    when the package was built without it (the tools need CLI11, fmt and nlohmann_json at build time;
    feedline-pack sentencepiece too)."""
    path = _BIN / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"{name}: not in this feedline package ({path} is missing): it was built without the C++ tools, which need "
            "CLI11, fmt and nlohmann_json (and sentencepiece for feedline-pack) when `pip install` builds it; "
            "install them (scripts/install-deps.sh) and reinstall, or use the tools of a CMake build")
    return path


def _run(name: str) -> None:
    try:
        path = tool_path(name)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        raise SystemExit(127)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(str(path), [name, *sys.argv[1:]])


def pack() -> None:
    _run("feedline-pack")


def inspect() -> None:
    _run("feedline-inspect")


def iterate() -> None:
    _run("feedline-iterate")


def doctor() -> None:
    _run("feedline-doctor")
