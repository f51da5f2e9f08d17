"""A function of the notebook's goes to the workers as its source and is defined again there
(``cells/pushing.py``, ``workers/values.define``); what the workers' Python cannot define — syntax
newer than theirs (a notebook on 3.13, hosts on 3.10), a definition that fails there — is refused
in one line naming it, never a traceback from the unpickling."""

from __future__ import annotations

import pickle

import pytest

from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.workers import values


class _Sent:
    """As ``pushing`` sends a notebook's function: ``define`` of its name and source."""

    def __init__(self, name: str, source: str):
        self.name, self.source = name, source

    def __reduce__(self):
        return values.define, (self.name, self.source, f"<pushed {self.name}>")


def _refused(name: str, source: str) -> str:
    with pytest.raises(GpugeekError) as refused:
        values.load(pickle.dumps({name: _Sent(name, source)}, protocol=5), {})
    said = str(refused.value)
    assert "\n" not in said and "Traceback" not in said, said
    return said


def test_syntax_newer_than_the_workers_python_is_refused_in_one_line():
    # what a worker older than the notebook sees of PEP 695's ``def newer[T](value: T)``: syntax it lacks
    said = _refused("newer", "def newer[T(value):\n    return value\n")
    assert said.startswith("--push newer: the workers' Python 3.") and "line 1: def newer[T(value):" in said, said
    assert "syntax" in said, said


def test_a_definition_that_fails_on_the_workers_is_refused_in_one_line():
    said = _refused("decorated", "@registered\ndef decorated():\n    return 1\n")
    assert said.startswith("--push decorated: defining it on the workers failed (NameError"), said
    assert "push what its definition uses" in said, said


def test_a_pushed_function_is_defined_in_the_cells_namespace():
    namespace = {"k": 3}
    got = values.load(pickle.dumps({"times": _Sent("times", "def times(x):\n    return x * k\n")}), namespace)
    assert got["times"](2) == 6 and got["times"].__code__.co_filename == "<pushed times>"
