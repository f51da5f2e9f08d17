"""Run by another Python (tests/test_minors.py): does the package start there?

    python minors_check.py HEAD_FOLDER PACKAGE_FOLDER SCRATCH

Standard library only, as it runs on a bare interpreter (pyenv's 3.10 … 3.13). It

- compiles every module of the package (PACKAGE_FOLDER): its syntax on this minor;
- imports every module of the part a head runs (HEAD_FOLDER: ``remote/headguard.py``'s archive,
  unpacked), with the packages a bare interpreter lacks (Ray, torch, yaml…) stood in for by empty
  modules: what is checked is this Python's own language and standard library;
- starts the entry points a host runs: the host script (``onhost.py facts``), the runtime's
  (``runtime.py check``) and the reader of a head's logs (``headlogs.py``) for real, as
  subprocesses (they need nothing but the standard library);
  the head's watchdog and the keeper as far as reading their order (a missing file: their ``main``
  was reached); the Slurm job's script loaded.

It prints one JSON object: what failed, each with its module and error.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import platform
import subprocess
import sys
import traceback
import types

STANDARD = set(sys.stdlib_module_names) | set(sys.builtin_module_names)


class Absent:
    """What a missing package's names are here: callable, subscriptable, a base class, a decorator."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Absent(f"{self._name}.{name}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):   # a decorator: what it decorates
            return args[0]
        return Absent(f"{self._name}()")

    def __mro_entries__(self, bases):
        return ()

    def __getitem__(self, key):
        return self

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __iter__(self):
        return iter(())

    def __str__(self):
        return self._name


class AbsentModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Absent(f"{self.__name__}.{name}")


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on the path: any package this interpreter lacks, outside the standard library and ours."""

    def find_spec(self, name, path, target=None):
        top = name.partition(".")[0]
        if top in STANDARD or top == "gpugeek_jupyter":
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = AbsentModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _failure(where, exc):
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    at = f" ({os.path.basename(last.filename)}:{last.lineno})" if last else ""
    return {"where": where, "error": f"{type(exc).__name__}: {exc}{at}"}


def compiled(package):
    failed, count = [], 0
    for folder, _, files in os.walk(package):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                count += 1
                try:
                    with open(path, encoding="utf-8") as f:
                        compile(f.read(), path, "exec", dont_inherit=True)
                except SyntaxError as exc:
                    failed.append(_failure(os.path.relpath(path, package), exc))
    return count, failed


def imported(head):
    root = os.path.join(head, "gpugeek_jupyter")
    names = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, name), head)[:-3].split(os.sep)
                names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    failed = []
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - each module's failure is reported, whatever it is
            failed.append(_failure(name, exc))
    return names, failed


def started(head, package, scratch):
    """The entry points a host runs, each as far as it gets without a cluster: the host script as
    the head's archive has it, the runtime's and the Slurm job's scripts as they travel (files)."""
    failed, said = [], {}
    onhost = os.path.join(package, "onhost")
    env = dict(os.environ, HOME=scratch)
    runs = {"onhost.py facts": [os.path.join(head, "gpugeek_jupyter", "onhost", "script.py"), "facts"],
            "runtime.py check": [os.path.join(onhost, "runtime.py"), "check",
                                 json.dumps({"ray": "2.60.0", "torch": "2.13.0", "root": scratch})],
            "headlogs.py": [os.path.join(onhost, "headlogs.py"), scratch]}
    for what, argv in runs.items():
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, env=env,
                              stdin=subprocess.DEVNULL)
        try:
            said[what] = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            failed.append({"where": what, "error": (done.stderr.strip() or done.stdout.strip())[-600:]})
    missing = os.path.join(scratch, "no-such-order.json")
    for name in ("gpugeek_jupyter.guard.headwatch", "gpugeek_jupyter.keeper.serve"):
        try:
            importlib.import_module(name).main(["entry", missing])
            failed.append({"where": f"{name}.main", "error": "it went on without its order"})
        except FileNotFoundError as exc:
            if exc.filename != missing:
                failed.append(_failure(f"{name}.main", exc))
        except BaseException as exc:  # noqa: BLE001
            failed.append(_failure(f"{name}.main", exc))
    try:
        spec = importlib.util.spec_from_file_location("slurmjob", os.path.join(onhost, "slurmjob.py"))
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except BaseException as exc:  # noqa: BLE001
        failed.append(_failure("onhost/slurmjob.py", exc))
    return said, failed


def main(argv):
    head, package, scratch = argv
    os.environ["GPUGEEK_HOME"] = os.path.join(scratch, "home")
    count, syntax = compiled(package)
    sys.path.insert(0, head)
    sys.meta_path.append(StandIns())
    names, imports = imported(head)
    said, entries = started(head, package, scratch)
    print(json.dumps({"python": platform.python_version(), "compiled": count, "imported": len(names),
                      "failed": syntax + imports + entries,
                      "facts_python": said.get("onhost.py facts", {}).get("python")}))


if __name__ == "__main__":
    main(sys.argv[1:])
