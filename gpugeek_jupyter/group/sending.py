"""How a cell reaches the ranks, followed to one outcome: {"results": {rank: result}, "failed":
rank, "dead": rank, "stuck": [ranks]} (``workers/outcome.py``).

The group waits on ``pending`` and hands what is done to ``take``, or every value at once to
``complete`` when they all came within the first wait.
"""

from __future__ import annotations

import pickle

from .results import WorkerDied, in_words


class Led:
    """A cell sent to rank 0 once, which hands it on over the cell line and stops the others if
    one fails (``Worker.execute_all``): one request per cell, whatever the group's size. For a
    Ray Client every request crosses the network; for a Ray driver on the cluster's own network
    too it is the quicker way — one Ray call fewer than sending it to every rank (0.78 of that
    on a local 2-worker group, side by side: BENCHMARKS.md, run 17) — and rank 0 has every rank's result for the
    cell's journal without asking for it."""

    def __init__(self, workers: list, call: tuple, pushed):
        self.pending = [workers[0].execute_all.remote(pickle.dumps(call), [pushed] if pushed else None)]

    @classmethod
    def following(cls, ref) -> Led:
        """A cell already sent (``ref``: rank 0's ``execute_all``), to wait on or stop."""
        led = cls.__new__(cls)
        led.pending = [ref]
        return led

    def complete(self, values: list) -> dict:
        return values[0]

    def take(self, done: list) -> dict:
        import ray

        try:
            return ray.get(done[0])
        except ray.exceptions.RayActorError as exc:
            raise WorkerDied(0, in_words(exc)) from None
