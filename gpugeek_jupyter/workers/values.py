"""Values between the notebook and the workers: a cell's value and its pulled variables pickled to
go home, and the pushed variables loaded here.

Plain pickle (protocol 5) first: it names each type by its module, so any Python with those
modules loads it — the notebook's may be another minor version than the workers' (a remote
cluster's keeper passes the bytes on untouched). cloudpickle only for what plain pickle cannot
name (a class or function defined in a cell), which only a notebook on the workers' Python loads.

A function or class the notebook defined comes as its source (``cells/pushing.py`` reduces it to
``define``) and is defined again here, in the cell's namespace: it sees the workers' variables.
"""

from __future__ import annotations

import linecache
import pickle
import threading

_loading = threading.local()     # the namespace that ``define`` puts what it defines in, while loading


def dumps(value) -> bytes:
    """``value`` as bytes the notebook can load: plain pickle where it can, else cloudpickle."""
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - a class or function of the cell's own: by value
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=5)


def load(blob: bytes, namespace: dict) -> dict:
    """The pushed variables, ``{name: value}``; what the notebook defined is defined in ``namespace``."""
    _loading.namespace = namespace
    try:
        return pickle.loads(blob)
    finally:
        _loading.namespace = None


def define(name: str, source: str, filename: str):
    """What unpickling a notebook's function or class calls: its source run in the cell's
    namespace (under ``filename``, so a traceback shows its lines), and the object it defined."""
    namespace = getattr(_loading, "namespace", None)
    if namespace is None:
        namespace = {"__name__": "__main__"}
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]
