"""A kernel that exits takes its warm group along (``Group.leave``), unless a job still
runs there: only a kernel that dies leaves its group behind, for `%gpugeek attach`."""

from __future__ import annotations

import atexit


def leave_with_this_kernel() -> None:
    """A kernel that exits (shut down, restarted) takes its warm group along, unless a job still
    runs there; only a kernel that dies leaves its group behind (kept for `attach`: ``group/orphans``).
    Registered anew with each group, after Ray's own exit handler (these run last first)."""
    atexit.unregister(_stop_at_exit)
    atexit.register(_stop_at_exit)


def _stop_at_exit() -> None:
    from ..kernel.session import current

    group = current().group
    if group is not None:
        group.leave()      # a local group: ``group/orphans.leave``; a remote one asks its keeper
