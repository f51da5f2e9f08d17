"""The local group and the remote one are one ``Group`` (``cells/warm.py``): every member the
protocol declares is on both, and ``run`` takes the same keywords on both, so a cell's path reads
the same whichever way it goes."""

from __future__ import annotations

import inspect

import pytest

from gpugeek_jupyter.cells.linegroup import LineGroup
from gpugeek_jupyter.cells.warm import Group
from gpugeek_jupyter.group.workergroup import WorkerGroup
from gpugeek_jupyter.kernel.session import WarmGroup
from gpugeek_jupyter.workers.options import RunOptions

# as jobs._group builds them (nothing is started until ``start``)
MADE = {WorkerGroup: lambda: WorkerGroup(RunOptions(), "127.0.0.1:6379"),
        LineGroup: lambda: LineGroup(RunOptions(), "10.0.0.5:6379", 1, line=None)}


def members(protocol) -> set[str]:
    """What a protocol declares: its annotated attributes, methods and properties."""
    declared = {name for name, value in vars(protocol).items()
                if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    return set(protocol.__annotations__) | declared


@pytest.mark.parametrize("kind", list(MADE), ids=lambda k: k.__name__)
def test_both_groups_are_a_group(kind):
    group = MADE[kind]()
    for protocol in (Group, WarmGroup):          # WarmGroup: what the kernel's session asks of it
        assert not [m for m in members(protocol) if not hasattr(group, m)], (kind.__name__, protocol.__name__)
    assert isinstance(group, Group)
    for name in ("run", "start", "stop", "leave", "adopt", "versions", "drain_telemetry"):
        assert inspect.signature(getattr(kind, name)).parameters.keys() == \
            inspect.signature(getattr(Group, name)).parameters.keys(), (kind.__name__, name)


def test_the_protocol_sees_a_missing_member():
    class Half:
        def run(self, source, options): ...

    assert not isinstance(Half(), Group)
