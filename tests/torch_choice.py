"""Which torch ``make`` installs into the venv, and from where: its words for ``uv pip install`` on
stdout (shell-quoted), and one line saying the choice on stderr.

    python tests/torch_choice.py [--record] [--spec SPEC] [--cpu-index URL] [uv's source options…]
    python tests/torch_choice.py --installed        what was installed, in one line (as recorded)

The package's own torch requirement (``pyproject.toml``), built for this machine:

- ``--spec`` (``make lab TORCH_SPEC=…``): as you asked;
- an NVIDIA GPU here (``nvidia-smi -L`` answers): the build the configured index serves (PyPI's is
  the CUDA one);
- macOS: PyPI's build, which is the CPU (and Apple GPU) one;
- otherwise the CPU build: from the wheels pip is configured with, where they hold one for this
  Python (a folder of wheels, an index on disk); else from PyTorch's CPU index, where it answers
  (uv's ``--torch-backend cpu``); else PyPI's build — on Linux the CUDA one, gigabytes, which runs
  on CPUs too — and the line says so.

Standard library only: it runs in a venv that has nothing but pip and uv yet.
"""

from __future__ import annotations

import itertools
import platform
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SAID = ".torch-choice"          # in the venv: the choice, for --installed
PROBE_S = 5.0


def requirement() -> str:
    """The package's torch requirement, as pyproject.toml declares it."""
    found = re.search(r'"(torch[<>=!~,.\d\s]*)"', (ROOT / "pyproject.toml").read_text())
    return found.group(1).replace(" ", "") if found else "torch"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def allowed(version: str, wanted: str) -> bool:
    """Whether ``version`` meets ``wanted``'s bounds (the ``>=``/``<``/``<=``/``==`` it uses)."""
    mine = _version(version)
    for op, bound in re.findall(r"(>=|<=|==|<|>)([\d.]+)", wanted):
        edge = _version(bound)
        ok = {">=": mine >= edge, "<=": mine <= edge, "<": mine < edge, ">": mine > edge, "==": mine == edge}[op]
        if not ok:
            return False
    return True


def has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def local_cpu_wheels(sources: list[str], wanted: str) -> tuple[str, str] | None:
    """The newest CPU build of torch for this Python in the folders and on-disk indexes pip is
    configured with (``--find-links DIR``, ``--index-url file://…``): its version and where."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
        platform.machine().lower(), "")
    places = []
    for option, value in itertools.pairwise(sources):
        if option in ("--find-links", "--index-url", "--extra-index-url") and value.startswith(("/", "file:")):
            path = Path(unquote(urlparse(value).path) if value.startswith("file:") else value)
            places.append(path / "torch" if option != "--find-links" else path)
    best = None
    for place in places:
        names = [p.name for p in place.glob("*.whl")] if place.is_dir() else []
        if place.is_dir() and (place / "index.html").exists():
            names += re.findall(r"(torch-[^\"#<>/]+\.whl)", (place / "index.html").read_text(errors="replace"))
        for name in names:
            got = re.fullmatch(rf"torch-([\d.]+\+cpu)-{tag}-{tag}-\w*_{machine}\.whl", name)
            if got and allowed(got.group(1), wanted) and (best is None or _version(got.group(1)) > _version(best[0])):
                best = (got.group(1), str(place))
    return best


def answers(url: str) -> bool:
    """Whether a package index answers at ``url`` (its torch page), within a few seconds."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=PROBE_S) as page:
            return page.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def choose(spec: str, cpu_index: str, sources: list[str]) -> tuple[list[str], str]:
    """uv's words for torch, and what they install and from where (said after its version)."""
    wanted = requirement()
    index = next((b for a, b in itertools.pairwise(sources) if a == "--index-url"), "PyPI")
    if spec:
        return [spec], "as you asked (TORCH_SPEC)"
    if has_gpu():
        return [wanted], f"for your NVIDIA GPU, from {index} (PyPI's is the CUDA build)"
    if sys.platform == "darwin":
        return [wanted], f"from {index} (PyPI's macOS build is the CPU and Apple GPU one)"
    local = local_cpu_wheels(sources, wanted)
    if local:
        return [f"torch=={local[0]}"], f"the CPU build, from {local[1]} (no NVIDIA GPU here)"
    if cpu_index and answers(cpu_index):
        return [wanted, "--torch-backend", "cpu"], f"the CPU build, from PyTorch's CPU index {cpu_index} (no NVIDIA " \
                                                   f"GPU here)"
    return [wanted], (f"from {index} — on Linux PyPI's build is the CUDA one, several GB with NVIDIA's libraries, "
                      f"which runs on CPUs too: PyTorch's CPU index ({cpu_index or 'none named'}) did not answer (no "
                      f"NVIDIA GPU here; `make lab TORCH_SPEC=…` picks another)")


def installed(venv: Path) -> str:
    from importlib.metadata import version

    whence = (venv / SAID).read_text().strip() if (venv / SAID).exists() else "from your package index"
    return f"torch {version('torch')} installed, {whence}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--installed"]:
        print(installed(Path(sys.prefix)), flush=True)
        return 0
    spec, cpu_index, sources, record = "", CPU_INDEX, [], False
    while argv:
        flag = argv.pop(0)
        if flag == "--record":      # in this venv, for --installed
            record = True
        elif flag == "--spec":
            spec = argv.pop(0).strip()
        elif flag == "--cpu-index":
            cpu_index = argv.pop(0).strip()
        else:
            sources.append(flag)
    words, whence = choose(spec, cpu_index, sources)
    if record:
        (Path(sys.prefix) / SAID).write_text(whence + "\n")
    print(f"torch: {words[0]}, {whence}", file=sys.stderr, flush=True)
    print(shlex.join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
