"""What a cell gives back to the notebook: its value and pulled variables, a rank's error, the
stop button's, and the ranks' output as it arrives (rank 0's as is, or every rank's labelled)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..errors import GpugeekError


class RemoteError(GpugeekError):
    """An exception in the user's cell on a worker: its traceback, labelled with the rank; out of
    GPU memory, the rank's reading of the GPU then (``oom.memory_at``)."""

    def __init__(self, rank: int, traceback_text: str, extra: str = "", preempted: dict | None = None,
                 memory: dict | None = None):
        super().__init__(f"rank {rank}: {traceback_text.strip().splitlines()[-1]}")
        self.rank, self.traceback_text, self.extra, self.memory = rank, traceback_text, extra, memory
        self.preempted = preempted    # the job stopped on a preemption notice: {step, deadline, nodes}

    def _render_traceback_(self) -> list[str]:
        lines = [f"\x1b[0;31mgpugeek: the cell failed on rank {self.rank}\x1b[0m",
                 *self.traceback_text.rstrip().splitlines()]
        return lines + (self.extra.splitlines() if self.extra else [])


class Interrupted(GpugeekError):
    """The stop button: every worker was interrupted."""


@dataclass
class Result:
    """What a cell gave back: rank 0's last value, the pulled variables, the wall time."""

    value: dict | None = None
    pulled: dict = field(default_factory=dict)
    seconds: float = 0.0

    def shown(self):
        """The value as the notebook should display it (None: nothing to display)."""
        if not self.value:
            return None
        if "pickle" in self.value:
            from ray import cloudpickle

            try:
                return cloudpickle.loads(self.value["pickle"])
            except Exception:  # noqa: BLE001 - a class the notebook does not have
                return _Text("<a value of a type this notebook cannot load>")
        return _Text(self.value["repr"])


class _Text:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Printer:
    """Worker output into the cell: rank 0 as is, or every rank with a ``[rank N]`` prefix."""

    def __init__(self, all_ranks: bool):
        self.all_ranks = all_ranks
        self.at_line_start: dict[int, bool] = {}

    def show(self, rank: int, text: str) -> None:
        if not text or (rank != 0 and not self.all_ranks):
            return
        if self.all_ranks:
            out = []
            for piece in text.splitlines(keepends=True):
                if self.at_line_start.get(rank, True):
                    out.append(f"[rank {rank}] ")
                out.append(piece)
                self.at_line_start[rank] = piece.endswith("\n")
            text = "".join(out)
        sys.stdout.write(text)
        sys.stdout.flush()
