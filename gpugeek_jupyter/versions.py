"""Which version of a module this Python has: a distribution's version, or a digest of a local
module's files. Standard library only, so a Ray worker asks it without loading the kernel's session.

The kernel looks up what a cell imports (``kernel/environment.py``); every worker answers the same
question about itself (``workers/worker.py``), and the two answers are compared.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

PACKAGE_VERSION = "0.1.0"       # this package's (``pyproject.toml``'s): what a kernel and a keeper tell each other
COMPILED = {".so", ".pyd", ".dylib"}
LOCAL_FILES_MAX = 2000          # a "module" with more files than this is not a notebook's helper


@dataclass(frozen=True)
class KernelModule:
    """A module a cell imports, as this kernel has it."""

    name: str
    version: str                  # the distribution's version, or ``local:<digest of its files>``
    path: str                     # the package's folder, or the module's file
    dist: str | None = None       # the installed distribution it comes from
    dist_info: str | None = None  # that distribution's metadata folder (shipped beside it)
    compiled: bool = False

    def describe(self) -> str:
        return f"{self.dist or self.name} {self.version}" if self.dist else f"{self.name} (local: {self.path})"

    def requires_python(self) -> str | None:
        """The Pythons this version says it installs on (its ``Requires-Python``), where it says."""
        if not self.dist_info:
            return None
        try:
            return metadata.PathDistribution(Path(self.dist_info)).metadata["Requires-Python"]
        except (OSError, KeyError):
            return None



PYTHON = "<python>"     # asked as if a module: the Python itself (``3.10.13``), which a package's own needs are held to


def version_of(name: str) -> str | None:
    """The version of ``name`` this Python imports: its distribution's, else a digest of its
    files (``local:…``); None when it is not there. Run in the kernel and on every node alike."""
    if name == PYTHON:
        import platform

        return platform.python_version()
    found = locate(name)
    return found.version if found else None


def locate(name: str) -> KernelModule | None:
    """``name`` as this Python would import it; None for the standard library, built-ins and
    what is not there."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names or name == "__main__":
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if folders:
        if spec.origin is None:     # a namespace package (``google``): many distributions share it
            return None
        path = Path(folders[0])
    elif spec.origin and spec.origin not in ("built-in", "frozen"):
        path = Path(spec.origin)
    else:
        return None
    dist = _distribution(name, path)
    if dist is not None:
        files = [str(f) for f in dist.files or []]
        compiled = any(Path(f).suffix in COMPILED for f in files) or path.suffix in COMPILED
        info = next((f.split("/")[0] for f in files if f.split("/")[0].endswith(".dist-info")), None)
        return KernelModule(name, dist.version, str(path), dist.metadata["Name"],
                            str(dist.locate_file(info)) if info else None, compiled)
    digest, compiled = _digest(path)
    return KernelModule(name, f"local:{digest}", str(path), compiled=compiled)


def _distribution(name: str, path: Path) -> metadata.Distribution | None:
    """The installed distribution whose files ``name`` is: a ``.dist-info`` beside it that lists
    it (one named like it first; a folder of the same name elsewhere on the path is local)."""
    def likely(info: Path) -> bool:
        return _normal(info.name.split("-")[0]) != _normal(name)

    for info in sorted(path.parent.glob("*.dist-info"), key=likely):
        dist = metadata.PathDistribution(info)
        top = (dist.read_text("top_level.txt") or "").split()
        if name in top or (not top and any(str(f).split("/")[0] in (name, f"{name}.py") for f in dist.files or [])):
            return dist
    return None


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _digest(path: Path) -> tuple[str, bool]:
    """A digest of a local module's Python files (the same here and on a node, so an edit here is
    seen), and whether it has compiled parts. Read again only when a file's size or time changed."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
        if path.is_dir() else [path]
    files = files[:LOCAL_FILES_MAX]
    stats = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.suffix == ".py")
    return _read_digest(str(path.parent), stats), any(f.suffix in COMPILED for f in files)


@lru_cache(maxsize=64)
def _read_digest(parent: str, stats: tuple) -> str:
    digest = hashlib.sha1()
    for file, _, _ in stats:
        digest.update(str(Path(file).relative_to(parent)).encode())
        digest.update(Path(file).read_bytes())
    return digest.hexdigest()[:12]
