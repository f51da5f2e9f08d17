"""What kernels sent the keeper for the workers, and the ``runtime_env`` a new group gets from it.

Ray uploads a folder named in a ``runtime_env`` only for a job's own (``ray.init``); a group's
actors take URIs. So the folders are uploaded here, as Ray's driver does at ``ray.init``
(``uploaded``: Ray's private upload functions, used from this module alone; tests/test_ray_contract.py
names them should they move), and the group's ``runtime_env`` names what they became.

The kernel's modules that the workers lack come as archives (``line.messages.Ship``): pure Python
is unpacked here and sent to the nodes by Ray as ``py_modules``, as the package itself is; a module
with compiled parts comes as a pip requirement, which Ray installs on each node with that node's
own Python. ``up --env``'s requirements and ``up --working-dir``'s folder come the same way. All of
it is kept on the head's disk, so a keeper that starts again still has it.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import threading
from pathlib import Path

from ..raynodes import NODE_ENV

PACKAGE = Path(__file__).resolve().parent.parent      # this package, as the head has it
EXCLUDES = ["__pycache__", "labextension", "*.pyc"]


def _unpack(archive: bytes, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        # a kernel that proved the cluster's token sent it; the "data" filter where this Python has it
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


class Shipped:
    """The shipped state, in ``folder`` (``state.json`` and the unpacked files beside it)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self.state = json.loads((folder / "state.json").read_text())
        except (OSError, ValueError):
            self.state = {"modules": {}, "pip": [], "working_dir": None}

    def ship(self, modules: list, pip: list | None, working_dir: bytes | None) -> None:
        """Add the modules (``{name, version, archive, pip}``), and set the requirements and the
        working folder when given."""
        with self._lock:
            for module in modules:
                entry = {"version": module["version"], "pip": module.get("pip"), "paths": []}
                if module.get("archive"):
                    where = self.folder / "modules" / module["name"]
                    _unpack(module["archive"], where)
                    entry["paths"] = sorted(str(p) for p in where.iterdir())
                self.state["modules"][module["name"]] = entry
            if pip is not None:
                self.state["pip"] = list(pip)
            if working_dir is not None:
                _unpack(working_dir, self.folder / "working_dir")
                self.state["working_dir"] = str(self.folder / "working_dir")
            part = self.folder / "state.json.part"
            part.write_text(json.dumps(self.state))
            part.replace(self.folder / "state.json")

    def held(self) -> dict:
        """What was shipped: {"modules": {name: version}, "pip": [...], "working_dir": bool}."""
        return {"modules": {name: entry["version"] for name, entry in self.state["modules"].items()},
                "pip": list(self.state["pip"]), "working_dir": bool(self.state["working_dir"])}

    def job_env(self) -> dict:
        """The keeper's own ``runtime_env``: the package on every node (the node samplers and the
        doctor's probes run its code), the nodes' environment."""
        return {"py_modules": [str(PACKAGE)], "excludes": EXCLUDES, "env_vars": dict(NODE_ENV)}

    def group_env(self, index_url: str | None = None) -> dict:
        """A new group's ``runtime_env``: the package and what was shipped, its folders uploaded
        to the cluster; empty when nothing was (the group then takes the keeper's own)."""
        return uploaded(self._env(index_url), self.folder / "scratch")

    def _env(self, index_url: str | None) -> dict:
        modules = self.state["modules"].values()
        paths = [p for entry in modules for p in entry["paths"]]
        pip = list(self.state["pip"]) + [entry["pip"] for entry in modules if entry.get("pip")]
        env: dict = {}
        if paths:
            env.update(py_modules=[str(PACKAGE), *paths], excludes=EXCLUDES)
        if pip:
            trust = ["--trusted-host", index_url.split("://", 1)[1].split("/", 1)[0].split(":")[0]] \
                if index_url and index_url.startswith("http://") else []
            env["pip"] = pip if not index_url else {
                "packages": pip, "pip_install_options": ["--index-url", index_url, *trust,
                                                         "--disable-pip-version-check", "--no-cache-dir"]}
        if self.state["working_dir"]:
            env["working_dir"] = self.state["working_dir"]
        return env


def uploaded(env: dict, scratch: Path) -> dict:
    """``env`` with its local folders and files (``py_modules``, ``working_dir``) uploaded to the
    cluster and named by the URIs they became, as a group's actors take them."""
    if "py_modules" not in env and "working_dir" not in env:
        return env
    from ..raynodes import upload_folders

    scratch.mkdir(parents=True, exist_ok=True)
    env = upload_folders(env, str(scratch))
    env.pop("excludes", None)        # read by the upload: the URIs are what they are
    return env
