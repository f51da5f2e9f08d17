"""How the keeper reaches rank 0 of a group it holds: over the lead line (``workers/lead.py``), a
message each way, or — where rank 0 could not open one — by Ray actor calls, as a local kernel
does. Either way a cell sent is a handle to wait on, then its outcome; and the cell's journal is
read from a cursor."""

from __future__ import annotations

import sys
from concurrent.futures import Future
from concurrent.futures import TimeoutError as NotYet

from ..workers import outcome as outcomes
from ..workers import progress
from ..workers.lead import DrainCell, LeadCell, LeadLine

OPEN_TIMEOUT_S = 30.0


class Rank0:
    """One group's rank 0, as the keeper talks to it."""

    def __init__(self, group):
        import ray

        self.group, self.line = group, None
        try:
            address, key = ray.get(group.workers[0].open_lead.remote(), timeout=OPEN_TIMEOUT_S)
            self.line = LeadLine(address, key)
        except Exception as exc:  # noqa: BLE001 - said in the log; Ray's calls do the same, slower
            print(f"keeper: group {group.group_id}: no lead line to rank 0 ({type(exc).__name__}: {exc}); "
                  f"Ray calls instead", file=sys.stderr, flush=True)

    @property
    def lined(self) -> bool:
        return self.line is not None and not self.line.broken

    def lead(self, call: bytes, push: bytes | None):
        """Rank 0 leads the cell on every rank (``Worker.execute_all``): the handle to wait on."""
        if self.lined:
            return self.line.ask(LeadCell(call, [push] if push else None))
        import ray

        pushed = ray.put(push) if push else None
        return self.group.workers[0].execute_all.remote(call, [pushed] if pushed else None)

    def drain(self, wait_s: float, cursor: int, number: int) -> dict | None:
        """Rank 0's drain into the cell's journal, and the journal from ``cursor`` on (None: rank 0
        is gone, or keeps no such cell)."""
        timeout = wait_s + progress.ANSWER_WITHIN_S
        try:
            if self.lined:
                return self.line.ask(DrainCell(wait_s, cursor, number)).result(timeout=timeout)
            import ray

            return ray.get(self.group.workers[0].drain_all.remote(wait_s, cursor, number), timeout=timeout)
        except Exception:  # noqa: BLE001 - a dying rank 0 shows in the cell's outcome
            return None

    def close(self) -> None:
        if self.line is not None:
            self.line.close()


def done(handle, within: float = 0.0) -> bool:
    """Whether the cell sent as ``handle`` has ended (rank 0 answered, or died), within ``within`` s."""
    if isinstance(handle, Future):
        try:
            handle.exception(timeout=within)
        except NotYet:
            return False
        return True
    import ray

    return bool(ray.wait([handle], timeout=within)[0])


def ended(handle, within: float | None = None) -> dict | None:
    """The cell's outcome (a dead rank 0's: said so); None when it has not come ``within`` seconds."""
    if isinstance(handle, Future):
        try:
            return handle.result(timeout=within)
        except NotYet:
            return None
        except Exception:  # noqa: BLE001 - the line broke: rank 0 is gone
            return outcomes.fresh(dead=0)
    import ray

    try:
        return ray.get(handle, timeout=within)
    except ray.exceptions.GetTimeoutError:
        return None
    except ray.exceptions.RayActorError:
        return outcomes.fresh(dead=0)
