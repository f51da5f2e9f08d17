"""The two ways a cell reaches the ranks, each followed to one outcome: {"results": {rank:
result}, "failed": rank, "dead": rank, "stuck": [ranks]} (``workers/outcome.py``).

The group waits on ``pending`` and hands what is done to ``take`` (None: not yet), or every value
at once to ``complete`` when they all came within the first wait.
"""

from __future__ import annotations

import pickle

from ..workers import outcome
from ..workers.outcome import CANCEL_WAIT_S, for_peers
from .results import WorkerDied


class Led:
    """A cell sent to rank 0 once, which hands it on and stops the others if one fails
    (``Worker.execute_all``): one request per cell, whatever the group's size — for a notebook
    that is a Ray Client, where every request crosses the network."""

    def __init__(self, workers: list, call: tuple, pushed):
        self.pending = [workers[0].execute_all.remote(pickle.dumps(call), [pushed] if pushed else None)]

    def complete(self, values: list) -> dict:
        return values[0]

    def take(self, done: list) -> dict:
        import ray

        try:
            return ray.get(done[0])
        except ray.exceptions.RayActorError as exc:
            raise WorkerDied(0, type(exc).__name__) from None


class Sent:
    """A cell sent to every rank by the notebook: for a Ray driver on the cluster's network one
    hop each way is quicker than going through rank 0. The notebook then does what rank 0's lead
    does: a rank that fails or dies stops the others (``CANCEL_WAIT_S``, else they are stuck)."""

    def __init__(self, workers: list, call: tuple, pushed):
        theirs = for_peers(call)
        extra = (pushed,) if pushed else ()
        self.workers, self.cell_id = workers, call[5]
        # rank 0 keeps the cell's journal (the call's job) as its lead does on a Ray Client
        mine = pickle.dumps((*call[:-1], call[-1] or {}))
        self.ranks = {w.execute.remote(theirs if rank else mine, *extra): rank for rank, w in enumerate(workers)}
        self.outcome = outcome.fresh()

    @property
    def pending(self) -> list:
        return list(self.ranks)

    def complete(self, values: list) -> dict:
        for ref, value in zip(list(self.ranks), values, strict=True):
            outcome.judge(self.ranks.pop(ref), value, self.outcome)
        return self.outcome

    def take(self, done: list) -> dict | None:
        """The outcome once every rank has answered (or one failed and the rest stopped), else None."""
        import ray

        for ref in done:
            outcome.collect(self.ranks.pop(ref), ref, self.outcome)
        if self.ranks and (self.outcome["failed"] is not None or self.outcome["dead"] is not None):
            for rank in self.ranks.values():
                self.workers[rank].interrupt.remote(self.cell_id)
            stopped, _ = ray.wait(list(self.ranks), num_returns=len(self.ranks), timeout=CANCEL_WAIT_S)
            for ref in stopped:
                outcome.collect(self.ranks.pop(ref), ref, self.outcome)
            self.outcome["stuck"] = sorted(self.ranks.values())
            self.ranks.clear()
        return None if self.ranks else self.outcome
