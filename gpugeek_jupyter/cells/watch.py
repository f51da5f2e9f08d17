"""What watches a job from the kernel (the notebook's job monitor): the ``JobWatch`` protocol it
serves, and the ``Watcher`` that keeps it from ever breaking the job. Torch- and Ray-free: the
widgets name the protocol as a type.
"""

from __future__ import annotations

from typing import Protocol

from ..workers.options import Report


class JobWatch(Protocol):
    """What watches a running job: made per job, fed the reports as they arrive (in the kernel's
    main thread), told how the job ended. Its errors never fail the job."""

    def __init__(self, *, cluster_id: int, job_id: str, name: str, workers: int,
                 simulated: bool) -> None: ...

    def update(self, samples: list[Report]) -> None: ...

    def finish(self, status: str) -> None: ...


class Watcher:
    """The monitor, kept from ever breaking a job: its first error is said once and it stops."""

    def __init__(self, monitor: JobWatch | None):
        self.monitor = monitor

    def update(self, samples: list[Report]) -> None:
        self._call("update", samples)

    def finish(self, status: str) -> None:
        self._call("finish", status)

    def _call(self, method: str, arg) -> None:
        if self.monitor is None:
            return
        try:
            getattr(self.monitor, method)(arg)
        except Exception as exc:  # noqa: BLE001 - the job matters more than its picture
            print(f"gpugeek: the job monitor stopped ({type(exc).__name__}: {exc}); the job goes on",
                  flush=True)
            self.monitor = None
