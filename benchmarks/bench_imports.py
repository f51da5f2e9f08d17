"""What each process of the system pays to load the package: time and heavy modules.

    python benchmarks/bench_imports.py [--against REV] [--rounds 5]

For each entry point — ``import gpugeek_jupyter``, a Ray worker unpickling the worker actor, the
watchdog, a kernel's ``import ray`` after ours, the Jupyter server answering its first
``/gpugeek/clusters`` — a fresh interpreter imports it and reports wall time and which heavy
modules it loaded. With ``--against REV`` the same entries run on that git revision too (a
temporary worktree), alternated round by round with this tree, since the machine is shared and
noisy; the figures are medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "plotly", "ipywidgets", "IPython", "torch", "numpy", "yaml")
ENTRIES = {
    "import gpugeek_jupyter": "import gpugeek_jupyter",
    "a Ray worker": "import gpugeek_jupyter.{workers}.worker",
    "the watchdog": "import gpugeek_jupyter.guard.watchdog",
    "a kernel's first `import ray`": "import gpugeek_jupyter\nimport ray",
    "the Jupyter server": ("import gpugeek_jupyter.server.handlers\n"
                           "from gpugeek_jupyter.guard import board\nboard.overview()"),
}
PROBE = """
import time
t = time.perf_counter()
{code}
took = time.perf_counter() - t
import sys
print(took * 1000, " ".join(m for m in {heavy!r} if m in sys.modules))
"""


def measure(tree: Path, code: str, home: str) -> tuple[float, str]:
    workers = "workers" if (tree / "gpugeek_jupyter" / "workers").is_dir() else "run"
    probe = PROBE.format(code=code.format(workers=workers), heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=home, env={**os.environ, "PYTHONPATH": str(tree), "GPUGEEK_HOME": home})
    if done.returncode:
        raise SystemExit(f"{tree}: {code!r} failed: {done.stderr.strip().splitlines()[-1]}")
    ms, _, loaded = done.stdout.strip().splitlines()[-1].partition(" ")
    return float(ms), loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision to compare with (e.g. the previous release)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"this tree": ROOT}
        if args.against:
            other = Path(scratch) / "against"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(other), args.against],
                           check=True)
            trees = {args.against: other, **trees}
        try:
            times = {(t, e): [] for t in trees for e in ENTRIES}
            loads = {}
            for _ in range(args.rounds):
                for entry, code in ENTRIES.items():
                    for label, tree in trees.items():
                        ms, loaded = measure(tree, code, scratch)
                        times[label, entry].append(ms)
                        loads[label, entry] = loaded
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=True)
    print(f"python {sys.version.split()[0]}, median of {args.rounds} fresh interpreters, rounds alternated")
    for entry in ENTRIES:
        for label in trees:
            ms = statistics.median(times[label, entry])
            print(f"{entry:24s} {label:12s} {ms:7.0f} ms   loads: {loads[label, entry] or '-'}")
        if len(trees) == 2:
            a, b = (statistics.median(times[label, entry]) for label in trees)
            print(f"{'':24s} {'ratio':12s} {a / b:7.1f} ×")


if __name__ == "__main__":
    main()
