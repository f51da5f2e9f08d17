"""What the lab's hosts install from and start with, made once from this kernel's own versions and
kept in ``.cache/`` (``make lab-files``):

    index   a wheel index (PEP 503 "simple" pages and the wheels) holding Ray, torch, numpy, pip,
            s3fs, and the training frameworks a cell may import (transformers, accelerate,
            lightning: ``up --env`` installs them for a job), with their dependencies at this
            kernel's versions, which the laptop serves to the hosts on the lab's bridge: the hosts
            reach nothing else
    image   a "machine image": a venv of Debian's python3 with torch and numpy, and no Ray, which
            the lab mounts on every host that is not bare
    kernel  a kernel on another Python than the hosts': a venv of PYTHON (pyenv's 3.12) with this
            kernel's Ray, torch, numpy and pandas (torch from PyPI: another minor has no CPU wheel
            on this machine), which runs the package from the checkout (tests/lab/test_other_python.py)

    .venv/bin/python tests/lab_files.py index .cache/lab-index
    .venv/bin/python tests/lab_files.py image .cache/lab-image .cache/lab-index
    .venv/bin/python tests/lab_files.py kernel .cache/kernel-other PYTHON

Each is made again only when the versions it was made for change (a ``made.json`` beside it).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

BASE_PYTHON = "/usr/bin/python3"     # the OS's own Python: what every lab host has


RUNTIME = ("ray", "torch", "numpy", "pip", "s3fs")       # what a host's runtime holds
# what a job's ``up --env`` may add, and what a cell imports that the kernel sends (pandas: a kernel
# of another Python pulls a DataFrame made on the hosts)
FRAMEWORKS = ("transformers", "accelerate", "lightning", "pandas")


def wanted() -> dict[str, str]:
    """The packages the lab's index serves, at this kernel's versions."""
    return {name: metadata.version(name) for name in (*RUNTIME, *FRAMEWORKS)}


def _made(folder: Path, versions: dict) -> bool:
    try:
        return json.loads((folder / "made.json").read_text()) == versions
    except (OSError, ValueError):
        return False


def index(folder: Path) -> None:
    versions = wanted()
    if _made(folder, versions):
        return
    files = folder / "files"
    shutil.rmtree(folder, ignore_errors=True)
    files.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(files),
                    f"ray[default]=={versions['ray']}", f"torch=={versions['torch']}",
                    f"numpy=={versions['numpy']}", f"pip=={versions['pip']}", f"s3fs=={versions['s3fs']}",
                    *(f"{name}=={versions[name]}" for name in FRAMEWORKS), "setuptools", "wheel"],
                   check=True, timeout=900)
    projects: dict[str, list[str]] = {}
    for wheel in sorted(files.iterdir()):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(wheel.name)
    simple = folder / "simple"
    for name, wheels in projects.items():
        (simple / name).mkdir(parents=True)
        links = "".join(f'<a href="../../files/{html.escape(w)}">{html.escape(w)}</a><br>\n' for w in wheels)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (simple / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "".join(
        f'<a href="{n}/">{n}</a><br>\n' for n in sorted(projects)) + "</body></html>\n")
    (folder / "made.json").write_text(json.dumps(versions))


def image(folder: Path, wheels: Path) -> None:
    """Compiled to bytecode, as pip installs (and as a machine image ships): the hosts mount it read-only,
    so a Python there could never write the bytecode it lacks, and every ``import torch`` on a host
    would compile torch's modules again (4.0 s of CPU against 2.4 s)."""
    versions = {k: v for k, v in wanted().items() if k in ("torch", "numpy")}
    made = {**versions, "bytecode": True}
    if _made(folder, made):
        return
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", str(folder / "bin" / "python"),
                    "--no-index", "--find-links", str(wheels / "files"), *(f"{k}=={v}" for k, v in versions.items())],
                   check=True, timeout=600)
    (folder / "made.json").write_text(json.dumps(made))


# what the package imports in a kernel besides Ray, torch, numpy and pandas (pyproject's
# dependencies, less the Jupyter server's and the front end's)
KERNEL = ("plotly", "psutil", "pyyaml", "ipython", "ipywidgets", "prometheus-client", "uv", "nvidia-ml-py")


def kernel(folder: Path, python: str) -> None:
    versions = {name: metadata.version(name) for name in ("ray", "torch", "numpy", "pandas", *KERNEL)}
    versions["torch"] = versions["torch"].split("+")[0]       # PyPI's build for that Python
    made = {**versions, "python": python}
    if _made(folder, made):
        return
    shutil.rmtree(folder, ignore_errors=True)
    uv = str(Path(sys.executable).parent / "uv")
    subprocess.run([uv, "venv", "-q", "--python", python, str(folder)], check=True, timeout=120)
    wanted = [f"ray[default]=={versions['ray']}", *(f"{name}=={v}" for name, v in versions.items() if name != "ray")]
    subprocess.run([uv, "pip", "install", "-q", "--python", str(folder / "bin" / "python"), *wanted],
                   check=True, timeout=900)
    (folder / "made.json").write_text(json.dumps(made))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("index").add_argument("folder", type=Path)
    made = sub.add_parser("image")
    made.add_argument("folder", type=Path)
    made.add_argument("wheels", type=Path)
    other = sub.add_parser("kernel")
    other.add_argument("folder", type=Path)
    other.add_argument("python")
    args = parser.parse_args()
    if args.what == "index":
        index(args.folder)
    elif args.what == "image":
        image(args.folder, args.wheels)
    else:
        kernel(args.folder, args.python)


if __name__ == "__main__":
    main()
