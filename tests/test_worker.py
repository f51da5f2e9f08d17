"""The worker actor's own bookkeeping, called directly (no Ray, no process group)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from gpugeek_jupyter.workers.options import options
from gpugeek_jupyter.workers.worker import Worker


def call(source: str, cell_id: int) -> bytes:
    return pickle.dumps((source, f"<cell {cell_id}>", [], True, options(), cell_id))


def test_an_interrupt_that_comes_before_its_cell_still_stops_it():
    """Rank 0 hands a cell on while the stop button reaches every rank directly: the two can
    cross, and an interrupt for a cell that has not started yet must still stop it."""
    worker = Worker()
    worker.ns = {"gg": SimpleNamespace(configure=lambda opts: None, flush=lambda: None)}
    assert worker.interrupt(7) is False, "nothing runs yet"
    assert worker.execute(call("ran = True", 7)) == {"ok": False, "interrupted": True, "output": "", "samples": []}
    assert "ran" not in worker.ns
    result = worker.execute(call("ran = True\nran", 8))
    assert result["ok"] and "ran" in worker.ns, "the next cell runs"
