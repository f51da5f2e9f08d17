"""The worker actor's own bookkeeping, called directly (no Ray, no process group)."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from gpugeek_jupyter.workers.options import CellCall, options
from gpugeek_jupyter.workers.worker import Worker


def call(source: str, cell_id: int) -> bytes:
    # no job: not rank 0
    return pickle.dumps(CellCall(source, f"<cell {cell_id}>", options(), cell_id, want_value=True))


def test_an_interrupt_that_comes_before_its_cell_still_stops_it():
    """Rank 0 hands a cell on while the stop button reaches every rank directly: the two can
    cross, and an interrupt for a cell that has not started yet must still stop it."""
    worker = Worker()
    worker.ns = {"gg": SimpleNamespace(configure=lambda opts: None, flush=lambda: None)}
    assert worker.interrupt(7) is False, "nothing runs yet"
    assert worker.execute(call("ran = True", 7)) == {"ok": False, "interrupted": True, "output": "", "samples": [],
                                                     "cell": 7}
    assert "ran" not in worker.ns
    result = worker.execute(call("ran = True\nran", 8))
    assert result["ok"] and "ran" in worker.ns, "the next cell runs"


def test_a_report_carries_every_value_logged_since_the_last_by_step():
    """``gg.log`` at every step, reports at most once a second: each report carries every value
    logged since the one before, by step (what the job's figure draws), not only the latest."""
    import torch

    from gpugeek_jupyter.workers.helper import Helper
    from gpugeek_jupyter.workers.options import options

    reports = []
    gg = Helper(0, 1, torch.device("cpu"), options(), reports.append)
    gg._last_report = float("inf")          # no report until flushed: all of these fall in one window
    for step in range(1, 6):
        gg.step = step
        gg.log(loss=1.0 / step, **({"lr": 0.1} if step == 3 else {}))
    gg._last_report = 0.0
    gg.flush()
    logged = reports[-1]["logged"]
    assert logged["step"] == [1, 2, 3, 4, 5]
    assert logged["loss"] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert logged["lr"] == [None, None, 0.1, None, None]
    assert reports[-1]["loss"] == 0.2 and gg._logged == {}, "the next report would carry these again"
