"""pip's configured package sources, as ``uv pip install`` options (printed on one line).

``make`` installs the test venv with uv (its downloads and installs run in parallel: ~20 s where
pip took ~150 s here), and uv does not read pip's configuration. A machine whose pip is set to a
mirror, a folder of wheels (the CPU build of torch) or a constraints file gets the same from uv;
pip's order of preference is kept (every index's best match, as pip picks).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's key → uv's option (pip's keys may hold several values, one per line or space)
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}


def pip_config(python: str) -> dict[str, list[str]]:
    """What ``pip config list`` says (its files and PIP_* variables), by key."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in OPTIONS:
            values = found.setdefault(name, [])
            values += [v for v in value.strip().strip("'\"").split() if v not in values]
    return found


def uv_options(config: dict[str, list[str]]) -> list[str]:
    options = [arg for key, values in config.items() for value in values for arg in (OPTIONS[key], value)]
    if config.get("extra-index-url") or config.get("find-links"):
        options += ["--index-strategy", "unsafe-best-match"]
    return options


if __name__ == "__main__":
    print(shlex.join(uv_options(pip_config(sys.argv[1] if len(sys.argv) > 1 else sys.executable))))
