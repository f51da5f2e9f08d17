"""The kernel's packages on a remote cluster's workers, through Ray's ``runtime_env``.

A cell runs on machines that are not the notebook's. What it imports there must be what the
notebook has, or a cell that worked here fails there (a ``ModuleNotFoundError`` on rank 2) or,
worse, runs another version of the user's code. So before a cell runs on a remote cluster, the
modules it imports (and those its pushed values come from) are looked up here and asked of every
worker of its group, once per module:

- a module the nodes have at the kernel's version: nothing to do;
- missing or at another version, pure Python (an installed package, or the user's own
  ``mymodel.py`` beside the notebook): sent with the job as Ray's ``py_modules``, its
  ``.dist-info`` too, so the nodes report the kernel's version (and ``doctor`` agrees);
- missing or at another version, with compiled parts: ``pip install name==version`` on the nodes,
  in the job's ``runtime_env`` (Ray builds and caches that environment per node).

The job's ``runtime_env`` is fixed when the kernel connects, so a cell that needs more connects
again (its worker group starts afresh, and it says so). ``up --env requirements.txt`` (or a
``pyproject.toml``) adds pip packages to every job on the cluster. Local and sim clusters run on
this machine, in this environment: nothing is looked up for them.
"""

from __future__ import annotations

import ast
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from ..errors import GpugeekError
from ..versions import PYTHON, KernelModule, locate
from .session import current

PACKAGE = "gpugeek_jupyter"
NEVER_SHIPPED = {PACKAGE, "ray", "torch"}     # this package travels anyway; Ray's and torch's
                                              # versions are the hosts' own (`doctor` compares them)


def shipment():
    """What this kernel's jobs send along to the cluster it uses (the kernel's session holds it)."""
    return current().shipment


# -- what a cell needs ---------------------------------------------------------------------------

@lru_cache(maxsize=512)
def imports(source: str) -> frozenset[str]:
    """The top-level modules a cell's source imports (absolute imports, anywhere in it)."""
    if "import" not in source:
        return frozenset()
    try:
        tree = ast.parse(source)
    except SyntaxError:         # the worker says so, with the line
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return frozenset(names)


def beside(folder: str, source: str) -> set[str]:
    """The modules in a script's own ``folder`` that it imports, and those they import in turn:
    what ``torchrun`` finds there (its folder first on ``sys.path``), and so what goes with the
    script to a remote cluster."""
    root = Path(folder)
    found: set[str] = set()
    todo = [source]
    while todo:
        for name in imports(todo.pop()) - found:
            file = next((f for f in (root / f"{name}.py", root / name / "__init__.py") if f.is_file()), None)
            if file is None:
                continue
            found.add(name)
            try:
                todo.extend([file.read_text()] if file.name != "__init__.py" else
                            [f.read_text() for f in file.parent.rglob("*.py") if "__pycache__" not in f.parts])
            except (OSError, UnicodeDecodeError):
                continue
    return found


@contextmanager
def first_on_path(folder: str | None):
    """``folder`` first on this kernel's ``sys.path`` while the modules a script imports are
    looked up (its own folder, as the workers will have it)."""
    if not folder:
        yield
        return
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)


def pushed_modules(push: dict | None) -> set[str]:
    """Where pushed values' types come from: unpickling one on a worker imports its module."""
    names = set()
    for value in (push or {}).values():
        module = getattr(value, "__module__", None) or type(value).__module__
        if isinstance(module, str):
            names.add(module.split(".")[0])
    return names


# -- the job's runtime_env --------------------------------------------------------------------------

def runtime_env(pip: list[str] | None = None, modules: list[KernelModule] | None = None,
                package: bool = True, folder: str | None = None, index_url: str | None = None) -> dict:
    """The job's ``runtime_env``: this package (for a remote cluster), the kernel's modules the
    nodes lack, pip packages (``up --env``, and modules with compiled parts; from ``index_url``
    when given, as the hosts' runtime was) and the folder the cells start in (``up --working-dir``)."""
    paths = [str(Path(__file__).resolve().parent.parent)] if package else []
    wheels = list(pip or [])
    for module in modules or []:
        if module.compiled:
            if not module.dist:
                raise GpugeekError(f"{module.name} (local, {module.path}) has compiled parts and is not installed "
                                   f"from a package — install it on the hosts, or `up --env` a package of it")
            wheels.append(f"{module.dist}=={module.version}")
        else:
            paths += [module.path, *([module.dist_info] if module.dist_info else [])]
    env: dict = {}
    if paths:
        env["py_modules"] = paths
        env["excludes"] = ["__pycache__", "labextension", "*.pyc"]
    if folder:
        env["working_dir"] = folder
        env["excludes"] = sorted({*env.get("excludes", []), *WORKING_DIR_EXCLUDES})
    if wheels:
        # pip ignores a plain-http mirror unless told to trust its host
        trust = ["--trusted-host", index_url.split("://", 1)[1].split("/", 1)[0].split(":")[0]] \
            if index_url and index_url.startswith("http://") else []
        env["pip"] = wheels if not index_url else {
            "packages": wheels,
            "pip_install_options": ["--index-url", index_url, *trust, "--disable-pip-version-check", "--no-cache-dir"]}
    return env


def packed(modules: list[KernelModule]) -> list[dict]:
    """The modules as a remote cluster's keeper takes them (``line.messages.Ship``): pure Python as a
    gzipped tar of its files and its ``.dist-info``, which the keeper sends on as ``py_modules``; a
    module with compiled parts as ``name==version`` for pip, which installs it on each node for
    that node's own Python."""
    import io
    import tarfile

    out = []
    for module in modules:
        if module.compiled:
            if not module.dist:
                raise GpugeekError(f"{module.name} (local, {module.path}) has compiled parts and is not installed "
                                   f"from a package — install it on the hosts, or `up --env` a package of it")
            out.append({"name": module.name, "version": module.version, "pip": f"{module.dist}=={module.version}"})
            continue
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for path in filter(None, (module.path, module.dist_info)):
                tar.add(path, arcname=Path(path).name, filter=_no_caches)
        out.append({"name": module.name, "version": module.version, "archive": buffer.getvalue()})
    return out


def packed_folder(folder: str) -> bytes:
    """``up --working-dir``'s folder as a gzipped tar, without what Ray would leave out
    (``WORKING_DIR_EXCLUDES``), for a remote cluster's keeper."""
    import io
    import tarfile

    root = Path(folder)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for file in _files(root):
            tar.add(file, arcname=str(file.relative_to(root)))
    return buffer.getvalue()


def _no_caches(info):
    return None if "__pycache__" in info.name.split("/") or info.name.endswith(".pyc") else info


def read_env_file(path: str) -> list[str]:
    """``up --env``: the pip requirements in a requirements file or a pyproject's
    ``[project] dependencies``; one line saying what is wrong otherwise."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise GpugeekError(f"--env {path}: no such file — give a requirements.txt or a pyproject.toml")
    if file.suffix == ".toml":
        from ..config import read_toml

        try:
            project = read_toml(file.read_text()).get("project", {})
        except ValueError as exc:       # TOML's error, or not UTF-8
            raise GpugeekError(f"--env {path}: not valid TOML ({exc}) — correct the file") from None
        wanted = project.get("dependencies")
        if not isinstance(wanted, list) or not all(isinstance(w, str) for w in wanted):
            raise GpugeekError(f"--env {path}: no [project] dependencies list to install — add one, or give a "
                               "requirements.txt")
        return list(wanted)
    try:
        lines = [line.split(" #")[0].strip() for line in file.read_text().splitlines()]
    except UnicodeDecodeError:
        raise GpugeekError(f"--env {path}: not a text file — give a requirements.txt or a pyproject.toml") from None
    wanted = [line for line in lines if line and not line.startswith("#")]
    local = [line for line in wanted if line.startswith(("-e", "--editable", "-r", "--requirement"))]
    if local:
        raise GpugeekError(f"--env {path}: {local[0]!r} names a path on this machine, which the hosts do not have — "
                           f"list the packages themselves")
    return wanted


WORKING_DIR_MAX_MIB = 500     # Ray sends a job's folder through its GCS, at most 512 MiB
WORKING_DIR_EXCLUDES = [".git", ".venv", "venv", "__pycache__", ".ipynb_checkpoints", "checkpoints", "*.pyc"]


def working_dir(path: str) -> str:
    """``up --working-dir``: the folder every worker starts a cell in (a copy, sent once per
    connection by Ray, without ``.gitignore``'d files and ``WORKING_DIR_EXCLUDES``), so
    ``open("data/train.csv")`` in a cell reads the copy of the notebook's file on every host.
    One line when it is missing or too large to send."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise GpugeekError(f"--working-dir {path}: no such folder here — name the folder beside your notebook "
                           f"whose files the cells open")
    size = sum(f.stat().st_size for f in _files(folder))
    if size > WORKING_DIR_MAX_MIB * 2**20:
        raise GpugeekError(f"--working-dir {path} holds {size / 2**20:.0f} MiB to send, over the "
                           f"{WORKING_DIR_MAX_MIB} MiB a job's folder may be — put large data in object storage "
                           f"(s3://…) and read it from there, or list it in the folder's .gitignore")
    return str(folder)


def _files(folder: Path):
    """The files Ray would send: ``WORKING_DIR_EXCLUDES`` left out (``.gitignore``'d ones are
    counted: an upper bound)."""
    import fnmatch

    for entry in folder.iterdir():
        if any(fnmatch.fnmatch(entry.name, pattern) for pattern in WORKING_DIR_EXCLUDES) or entry.is_symlink():
            continue
        if entry.is_dir():
            yield from _files(entry)
        elif entry.is_file():
            yield entry


STORAGE_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


def storage_url(where: str) -> str:
    """``up --storage``: a URL of object storage (its file system installed on the hosts) or an
    absolute path that every host shares; one line otherwise."""
    scheme, sep, rest = where.partition("://")
    if sep:
        if scheme not in STORAGE_PACKAGES or not rest.strip("/"):
            raise GpugeekError(f"--storage {where} is not a place to keep files — give s3://BUCKET/PREFIX, "
                               "gs://BUCKET/PREFIX, az://CONTAINER/PREFIX "
                               f"or a path every host shares")
        return where.rstrip("/")
    if not where.startswith("/"):
        raise GpugeekError(f"--storage {where} is not an absolute path — give one that is the same on every host (a "
                           f"shared filesystem's mount point)")
    return where.rstrip("/") or "/"


def storage_packages(where: str) -> list[str]:
    """The fsspec file system the hosts need for ``where``, at this kernel's version when it has one."""
    from importlib import metadata

    scheme = where.partition("://")[0] if "://" in where else ""
    package = STORAGE_PACKAGES.get(scheme)
    if package is None:
        return []
    try:
        return [f"{package}=={metadata.version(package)}"]
    except metadata.PackageNotFoundError:
        return [package]


# -- before a cell ------------------------------------------------------------------------------------

def needed(cluster_id: int, names: set[str], ask) -> list[KernelModule]:
    """Of ``names``, the modules some worker lacks or has at another version than the kernel's:
    ``ask(names)`` gives each worker's ``{name: version_of(name)}``. Asked once per module, and
    again when a local module's files change."""
    state = shipment().for_cluster(cluster_id)
    fresh: dict[str, KernelModule] = {}
    for name in sorted(names - NEVER_SHIPPED):
        if name in state.checked and not state.checked[name].startswith("local:"):
            continue
        module = locate(name)
        if module is None or state.checked.get(name) == module.version:
            continue
        fresh[name] = module
    if not fresh:
        return []
    found = ask([*sorted(fresh), PYTHON])
    missing = [m for m in fresh.values() if any(f.get(m.name) != m.version for f in found)]
    pythons = sorted({f[PYTHON] for f in found if f.get(PYTHON)})
    missing = [m for m in missing if installs_there(m, pythons, [f.get(m.name) for f in found])]
    for module in fresh.values():
        state.checked[module.name] = module.version
    return missing


class CannotGo(GpugeekError):
    """A module the cell needs that cannot go to the hosts, nor is there: the one line is the whole story."""


def installs_there(module: KernelModule, pythons: list[str], theirs: list[str | None]) -> bool:
    """Whether the kernel's version of ``module`` can go to hosts running ``pythons``: it can
    where its ``Requires-Python`` holds them (or says nothing). Where it does not, the hosts' own
    version serves, said in one line (False); with none there, one line says what to do."""
    needs = module.requires_python()
    if not needs or not pythons:
        return True
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:      # nothing to judge by: pip, on the hosts, will say
        return True
    try:
        if all(SpecifierSet(needs).contains(Version(p)) for p in pythons):
            return True
    except (InvalidSpecifier, InvalidVersion):
        return True
    what, hosts = f"{module.dist or module.name} {module.version}", " and ".join(f"Python {p}" for p in pythons)
    if all(theirs):
        own = sorted(set(theirs))
        print(f"note: this kernel's {what} needs Python {needs} and the hosts run {hosts}, so it cannot go there: "
              f"the cells use the hosts' own {module.dist or module.name} {' / '.join(own)}", flush=True)
        return False
    raise CannotGo(f"this kernel's {what} needs Python {needs}, and the hosts run {hosts} without "
                       f"{module.name} — install a {module.dist or module.name} for {hosts} on the hosts (`%gpugeek up "
                       f"… --env requirements.txt`), or run this notebook on a kernel of the hosts' Python")


def forget(modules: list[KernelModule]) -> None:
    """Sending these failed: they are neither shipped nor checked any more."""
    state = shipment()
    for module in modules:
        state.shipped.pop(module.name, None)
        state.checked.pop(module.name, None)
