"""What a cell asks of a warm worker group, wherever its workers are: ``Group``, which the group
this kernel holds itself (``group/workergroup.WorkerGroup``: a Ray driver on a local, sim or attached cluster)
and the one a remote cluster's keeper holds for it (``linegroup.LineGroup``: over the line) both
are, so ``jobs.group_for``'s type says where a cell goes. ``tests/test_warm_group.py`` holds both
classes to it, ``run``'s keywords included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..group.results import Result
    from ..workers.options import RunOptions


@runtime_checkable
class Group(Protocol):
    """A warm group of workers: started once for a shape (``options``), then given cell after cell."""

    options: RunOptions
    address: str            # the cluster it runs on, as this kernel connected to it
    group_id: str           # its name on the cluster (the kernel that started it, and a counter)
    info: list[dict]        # each rank's description, once started (``Worker.setup``)
    cells: int              # cells sent so far
    broken: bool            # a rank died or stuck: the group is done, the next cell starts another
    keep_s: float | None    # a gone kernel's ended group is kept this long (the cluster's idle window)
    job: dict | None        # the running cell's job (id, name, kernel)
    warming: bool           # its start runs on the keeper while the notebook goes on (``up --workers``)

    def start(self) -> None: ...

    def adopt(self, group_id: str, owner: str) -> None: ...

    def refind(self) -> bool: ...

    def versions(self, names: list[str]) -> list[dict]: ...

    def connected(self) -> bool: ...

    def stop(self) -> None: ...

    def leave(self) -> bool: ...

    @property
    def notes(self) -> list[str]: ...

    def drain_telemetry(self, every: float = 0.0) -> int: ...

    def run(self, source: str, options: RunOptions, *, push: dict | None = None,
            pull: list[str] | None = None, all_ranks: bool = False, on_samples=None, job: dict | None = None,
            on_sent=None) -> Result: ...
