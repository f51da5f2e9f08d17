"""How the process that drives a worker group reaches its cluster, in the words the group needs: a
kernel's connection (``cells/away.KernelLink``: stopped elsewhere by the watcher, and a Ray
Client's link that can go down under a cell) or the keeper's on its head (``OnCluster``: a Ray
driver there for its whole life). The group asks only these; it never reads a kernel's session."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class StoppedElsewhere(Exception):
    """The cluster's stop began elsewhere while a cell's Ray calls were under way."""


@runtime_checkable
class Link(Protocol):
    def connected_address(self) -> str | None:
        """The address this process is a Ray driver of, as ``ray.init`` was given it; None: none now."""
        ...

    def check_stop(self) -> None:
        """Raise ``StoppedElsewhere`` once the cluster's stop has begun elsewhere."""
        ...

    def lost(self, group, exc: BaseException) -> bool:
        """Whether ``exc``, raised under a running cell, is this link going down (to be ridden
        out), rather than the cell's error, ours, or a stop."""
        ...

    def ride_out(self, group, cell_id: int, printer, on_samples) -> dict:
        """The cell's outcome once the cluster answers again (the job went on there)."""
        ...


class OnCluster:
    """A Ray driver on the cluster's own head (the keeper): connected for its whole life, stopped
    with its cluster, and never behind a link that goes down."""

    def __init__(self, address: str):
        self.address = address

    def connected_address(self) -> str | None:
        return self.address

    def check_stop(self) -> None:
        return None

    def lost(self, group, exc: BaseException) -> bool:
        return False

    def ride_out(self, group, cell_id: int, printer, on_samples) -> dict:
        raise AssertionError("a driver on the cluster's head has no link to ride out")
