"""``--push`` to a remote cluster's workers: the variables as bytes that any Python loads.

Plain pickle (protocol 5): each type is named by its module, which the workers import (the kernel's
modules a value comes from are sent first: ``kernel/environment.py``). What this notebook defined
itself — a function or class of ``__main__`` — has no module there: it travels as its source and
is defined again on the workers (``workers/values.py``), where it sees the workers' variables. A
pandas object travels in a form of no pandas version's and is made again with the workers' pandas
(``values.neutral``): the notebook's pandas 3 and the hosts' pandas 2 both read it. What can travel
neither way is named in one line, with what to do.
"""

from __future__ import annotations

import inspect
import io
import pickle
import textwrap
import types

from ..errors import GpugeekError
from ..workers.values import define, pandas_reduced


class _Pickler(pickle.Pickler):
    def __init__(self, file, names: dict[int, str]):
        super().__init__(file, protocol=5)
        self.names = names          # id of a pushed value → its name, for a refusal on the workers

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType | type) and getattr(obj, "__module__", None) == "__main__":
            return define, (obj.__name__, source_of(obj), f"<pushed {obj.__name__}>")
        reduced = pandas_reduced(obj, self.names.get(id(obj)))
        return NotImplemented if reduced is None else reduced


def dumps(push: dict) -> bytes:
    """The pushed variables as one blob; one line naming the variable that cannot go, and why."""
    for name, value in push.items():
        _pickled({name: value}, name)
    return _pickled(push, ", ".join(push))


def _pickled(values: dict, name: str) -> bytes:
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, {id(value): key for key, value in values.items()}).dump(values)
    except GpugeekError as exc:
        raise GpugeekError(f"--push {name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - pickle's many errors, said as one line
        raise GpugeekError(f"--push {name}: it cannot be sent ({type(exc).__name__}: {exc}) — push the data it "
                           f"holds (tensors, arrays, lists, dicts), or make it in the cell") from None
    return buffer.getvalue()


def source_of(obj) -> str:
    """The source of a function or class this notebook defined; one line when it has none to send."""
    kind = "class" if isinstance(obj, type) else "function"
    if obj.__name__ == "<lambda>":
        raise GpugeekError("a lambda defined in this notebook has no name to define it by on the workers — "
                           "write it with def, or make it in the cell")
    if isinstance(obj, types.FunctionType) and obj.__code__.co_freevars:
        raise GpugeekError(f"{kind} {obj.__name__} is defined inside another function here (it closes over "
                           f"{', '.join(obj.__code__.co_freevars)}), which its source cannot carry — define it "
                           f"at the top of a cell, or in the cell that uses it")
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        raise GpugeekError(f"{kind} {obj.__name__} is defined in this notebook, and its source cannot be read "
                           f"here — define it in the cell that uses it, or in a module beside the notebook "
                           f"(which is sent to the workers)") from None
    return textwrap.dedent(source)
