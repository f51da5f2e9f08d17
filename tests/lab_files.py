"""What the lab's hosts install from and start with, made once from this kernel's own versions and
kept in ``.cache/`` (``make lab-files``):

    index   a wheel index (PEP 503 "simple" pages and the wheels) holding Ray, torch, numpy, pip,
            s3fs, and the training frameworks a cell may import (transformers, accelerate,
            lightning: ``up --env`` installs them for a job), with their dependencies at this
            kernel's versions, which the laptop serves to the hosts on the lab's bridge: the hosts
            reach nothing else; and, for hosts on an older Python (SKEW_PYTHON), the wheels of their
            runtime (Ray at this kernel's version, numpy, pip, s3fs) built for that Python
    image   a "machine image": a venv of Debian's python3 with torch and numpy, and no Ray, which
            the lab mounts on every host that is not bare
    host-image  a machine image of another Python (pyenv's SKEW_PYTHON, which a host cannot see: its
            /root is its own): a copy of that install with torch, numpy and pandas SKEW_PANDAS, and
            no Ray, which the lab mounts on the hosts told to take it (tests/lab/test_python_skew.py)
    kernel  a kernel on another Python than the hosts': a venv of PYTHON (pyenv's 3.12; 3.13 for
            tests/lab/test_python_skew.py) with this kernel's Ray, torch, numpy and pandas (torch
            from PyPI: another minor has no CPU wheel on this machine), compiled to bytecode, which
            runs the package from the checkout (tests/lab/test_other_python.py)

    .venv/bin/python tests/lab_files.py index .cache/lab-index
    .venv/bin/python tests/lab_files.py image .cache/lab-image .cache/lab-index
    .venv/bin/python tests/lab_files.py kernel .cache/kernel-other PYTHON
    .venv/bin/python tests/lab_files.py host-image .cache/lab-image-310 PYENV_PYTHON_HOME

Each is made again only when the versions it was made for change (a ``made.json`` beside it).
"""

from __future__ import annotations

import argparse
import html
import json
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

BASE_PYTHON = "/usr/bin/python3"     # the OS's own Python: what every lab host has


RUNTIME = ("ray", "torch", "numpy", "pip", "s3fs", "boto3")   # what a host's runtime holds (a cloud head's: boto3)
# what a job's ``up --env`` may add, and what a cell imports that the kernel sends (pandas: a kernel
# of another Python pulls a DataFrame made on the hosts)
FRAMEWORKS = ("transformers", "accelerate", "lightning", "pandas")
# hosts older than the kernel (tests/lab/test_python_skew.py): their Python, and the pandas their
# image holds (pandas 3 needs Python >= 3.11, so such a host keeps a pandas 2)
SKEW_PYTHON = "3.10"
SKEW_PANDAS = "2.3.3"


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
    if not _made(folder, versions):
        _whole_index(folder, versions)
    _older_python(folder, SKEW_PYTHON, versions)


def _older_python(folder: Path, minor: str, versions: dict) -> None:
    """The runtime's wheels for hosts on Python ``minor`` added to the index: Ray at this kernel's
    version and its closure, pip, s3fs, and the newest numpy for that Python (this kernel's may need a
    newer one); torch is the image's own there (``host_image``)."""
    made = {**{k: versions[k] for k in ("ray", "pip", "s3fs")}, "python": minor}
    marker = folder / f"made-cp{minor.replace('.', '')}.json"
    try:
        if json.loads(marker.read_text()) == made:
            return
    except (OSError, ValueError):
        pass
    # resolved by uv for that Python (pip's --python-version judges markers by this Python: it would
    # leave out what only 3.10 needs, async-timeout, exceptiongroup, tomli), then fetched one by one
    wanted = "\n".join([f"ray[default]=={versions['ray']}", "numpy", f"pip=={versions['pip']}",
                        f"s3fs=={versions['s3fs']}", "setuptools", "wheel"])
    uv = Path(sys.executable).parent / "uv"
    glibc = "_".join(platform.libc_ver()[1].split(".")[:2]) or "2_28"      # the hosts' OS is this machine's
    pins = subprocess.run([str(uv), "pip", "compile", "-q", "--no-header", "--no-annotate", "--python-version", minor,
                           "--python-platform", f"{platform.machine()}-manylinux_{glibc}", "-"], input=wanted,
                          capture_output=True, text=True, check=True, timeout=300).stdout.split()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d",
                    str(folder / "files"), "--python-version", minor, "--only-binary=:all:", "--no-deps", *pins],
                   check=True, timeout=900)
    _pages(folder)
    marker.write_text(json.dumps(made))


def _whole_index(folder: Path, versions: dict) -> None:
    files = folder / "files"
    shutil.rmtree(folder, ignore_errors=True)
    files.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(files),
                    f"ray[default]=={versions['ray']}", f"torch=={versions['torch']}",
                    f"numpy=={versions['numpy']}", f"pip=={versions['pip']}", f"s3fs=={versions['s3fs']}",
                    f"boto3=={versions['boto3']}",
                    *(f"{name}=={versions[name]}" for name in FRAMEWORKS), "setuptools", "wheel"],
                   check=True, timeout=900)
    _pages(folder)
    (folder / "made.json").write_text(json.dumps(versions))


def _pages(folder: Path) -> None:
    """The PEP 503 pages of every wheel in ``folder/files``."""
    projects: dict[str, list[str]] = {}
    for wheel in sorted((folder / "files").iterdir()):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        projects.setdefault(name, []).append(wheel.name)
    simple = folder / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    for name, wheels in projects.items():
        (simple / name).mkdir(parents=True)
        links = "".join(f'<a href="../../files/{html.escape(w)}">{html.escape(w)}</a><br>\n' for w in wheels)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (simple / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "".join(
        f'<a href="{n}/">{n}</a><br>\n' for n in sorted(projects)) + "</body></html>\n")


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


def host_image(folder: Path, home: str) -> None:
    """A machine image of pyenv's Python at ``home`` (SKEW_PYTHON) for hosts that cannot see it: a
    copy of the install (its test suite and site-packages left out), its interpreter told to find
    libpython beside itself (pyenv's build names its own folder, which a host does not have), with
    PyPI's torch at this kernel's version (the CUDA build: no CPU wheel for that Python here),
    numpy and pandas SKEW_PANDAS; compiled to bytecode, as ``image``."""
    torch = metadata.version("torch").split("+")[0]
    made = {"python": home, "torch": torch, "pandas": SKEW_PANDAS, "bytecode": True}
    if _made(folder, made):
        return
    shutil.rmtree(folder, ignore_errors=True)
    minor = f"python{SKEW_PYTHON}"
    lib = f"{home}/lib/{minor}"

    def skipped(where: str, names: list[str]) -> list[str]:
        if where == lib:
            return [n for n in names if n in ("test", "idlelib", "tkinter", "turtledemo")]
        if where == f"{lib}/site-packages":
            return [n for n in names if n != "README.txt"]
        return [n for n in names if where == f"{home}/bin" and n.startswith(("pip", "idle", "2to3", "pydoc"))]

    shutil.copytree(home, folder, symlinks=True, ignore=skipped)
    old = f"{home}/lib".encode() + b"\0"
    new = b"$ORIGIN/../lib\0".ljust(len(old), b"\0")
    for binary in (folder / "bin" / minor, folder / "lib" / f"lib{minor}.so.1.0"):
        if binary.is_file() and old in (data := binary.read_bytes()):   # its RUNPATH, in place
            binary.write_bytes(data.replace(old, new))
    uv = Path(sys.executable).parent / "uv"
    subprocess.run([str(uv), "pip", "install", "-q", "--compile-bytecode", "--python", str(folder / "bin" / minor),
                    f"torch=={torch}", "numpy", f"pandas=={SKEW_PANDAS}"], check=True, timeout=1200)
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
    subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(folder / "bin" / "python"),
                    *wanted], check=True, timeout=900)
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
    older = sub.add_parser("host-image")
    older.add_argument("folder", type=Path)
    older.add_argument("home", help="pyenv's install of Python SKEW_PYTHON, e.g. ~/.pyenv/versions/3.10.13")
    args = parser.parse_args()
    if args.what == "index":
        index(args.folder)
    elif args.what == "image":
        image(args.folder, args.wheels)
    elif args.what == "host-image":
        host_image(args.folder, str(Path(args.home).expanduser().resolve()))
    else:
        kernel(args.folder, args.python)


if __name__ == "__main__":
    main()
