"""What a cell sent home, kept on the cluster: the job goes on whether or not the notebook reads.

Rank 0 writes every drain it takes (``progress.gather``: the ranks' output and reports, the node
samplers' reports) into the cell's journal, and the cell's outcome when it ends. The notebook
reads from its cursor (``since``), so a kernel whose laptop slept, or a kernel that attaches
later, reads what it missed in order; while nobody reads, a scribe on rank 0 takes the drains
itself every ``KEEP_EVERY_S``, so the ranks' outboxes never wait on the notebook.

Bounded: past ``BOUND_BYTES`` of output the oldest entries go, and a reader from before them is
told how many were dropped. The last ``CELLS_KEPT`` cells' journals are kept.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..line.news import News

BOUND_BYTES = 16 * 2**20     # a cell's output and reports kept on rank 0, at most
CELLS_KEPT = 4               # journals kept: the running cell's and the last ones before it
KEEP_EVERY_S = 2.0           # while nobody reads, rank 0 drains this often itself


class Journal:
    """One cell's entries (a drain each), numbered from 0, and its outcome once it ended."""

    def __init__(self, cell_id: int, job: dict | None = None):
        self.cell_id = cell_id
        self.job = dict(job or {})      # the notebook's job: its id, name and kernel
        self.began = time.time()
        self.entries: list[tuple[int, dict, int]] = []     # (number, drain, size)
        self.next = 0
        self.size = 0
        self.dropped = 0           # entries let go past the bound
        self.outcome: dict | None = None
        self.ended: float | None = None
        self.read_at = time.monotonic()     # the notebook's last read: the scribe drains after a gap
        self.step: int | None = None        # the latest step a rank reported
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._taking = threading.Lock()

    def take(self, gather) -> None:
        """``gather()`` (what rank 0's outbox holds now) added as one step: the reader's drain and
        the scribe's, each a take then an add, would otherwise file a later take first."""
        with self._taking:
            self.add(gather())

    def add(self, drained: dict) -> None:
        """A drain's answer, unless it carried nothing."""
        ranks = {r: d for r, d in drained.get("ranks", {}).items() if d.get("output") or d.get("samples")}
        nodes = drained.get("nodes") or []
        if not ranks and not nodes:
            return
        size = sum(len(d.get("output", "")) + 200 * len(d.get("samples", ())) for d in ranks.values()) \
            + 200 * len(nodes)
        steps = _steps(ranks.values())
        with self._changed:
            self.entries.append((self.next, {"ranks": ranks, "nodes": nodes}, size))
            self.next += 1
            self.size += size
            if steps:
                self.step = max(steps) if self.step is None else max(self.step, *steps)
            while self.size > BOUND_BYTES and len(self.entries) > 1:
                _, _, gone = self.entries.pop(0)
                self.size -= gone
                self.dropped += 1
            self._changed.notify_all()

    def end(self, outcome: dict) -> None:
        """The cell ended: its outcome, whose ranks' last reports carry its last step."""
        steps = _steps(outcome.get("results", {}).values())
        with self._changed:
            self.outcome, self.ended = outcome, time.time()
            if steps:
                self.step = max(steps) if self.step is None else max(self.step, *steps)
            self._changed.notify_all()

    def since(self, cursor: int, wait_s: float = 0.0) -> News:
        """Every entry from ``cursor`` on, merged as one drain ({"ranks": {rank: {"output",
        "samples"}}, "nodes": [...]}), with "next" (the reader's next cursor), "dropped" (entries
        before it that the bound let go), "running", "step", and "outcome" once the cell ended.
        Held up to ``wait_s`` for something new."""
        with self._changed:
            if wait_s > 0 and self.outcome is None and self.next <= cursor:
                self._changed.wait(wait_s)
            self.read_at = time.monotonic()
            kept = [(n, d) for n, d, _ in self.entries if n >= cursor]
            first = self.entries[0][0] if self.entries else self.next
            lost = max(0, min(first, self.next) - cursor)
            return {**merge([d for _, d in kept]), "next": self.next, "dropped": lost,
                    "running": self.outcome is None, "step": self.step, "cell": self.cell_id, "job": self.job,
                    "outcome": self.outcome}

    @property
    def state(self) -> str:
        """running, finished, failed, interrupted, or preempted (its job resumes on other nodes)."""
        outcome = self.outcome
        if outcome is None:
            return "running"
        results = outcome.get("results", {})
        if any(r.get("type") == "Preempted" for r in results.values()):
            return "preempted"
        if any(r.get("interrupted") for r in results.values()):
            return "interrupted"
        return "failed" if outcome.get("failed") is not None or outcome.get("dead") is not None else "finished"

    def unread_for(self, seconds: float) -> bool:
        return time.monotonic() - self.read_at >= seconds


def merge(drains: list[dict]) -> dict:
    """Several drains as one: each rank's output joined, reports and node samples in order."""
    ranks: dict = {}
    nodes: list = []
    for drained in drains:
        for rank, part in drained["ranks"].items():
            mine = ranks.setdefault(rank, {"output": "", "samples": []})
            mine["output"] += part.get("output", "")
            mine["samples"].extend(part.get("samples", ()))
        nodes.extend(drained.get("nodes", ()))
    return {"ranks": ranks, "nodes": nodes}


class Journals:
    """Rank 0's journals, the running cell's and the last ``CELLS_KEPT`` before it."""

    def __init__(self):
        self._by_cell: dict[int, Journal] = {}
        self._lock = threading.Lock()

    def open(self, cell_id: int, job: dict | None = None) -> Journal:
        """The cell's journal, made now — or the one a drain that came first made (``drain_all``)."""
        with self._lock:
            journal = self._by_cell.get(cell_id)
            if journal is None:
                journal = self._by_cell[cell_id] = Journal(cell_id, job)
            elif job:
                journal.job = dict(job)
            for old in sorted(self._by_cell)[:-CELLS_KEPT]:
                del self._by_cell[old]
            return journal

    def summaries(self) -> list[dict]:
        """Each kept cell as a job: the notebook's id, name and kernel, its state and step."""
        with self._lock:
            kept = list(self._by_cell.values())
        return [{**j.job, "cell": j.cell_id, "state": j.state, "step": j.step, "began": j.began, "ended": j.ended}
                for j in kept]

    def get(self, cell_id: int | None = None) -> Journal | None:
        """The cell's journal (None: the latest one)."""
        with self._lock:
            if cell_id is None:
                return self._by_cell[max(self._by_cell)] if self._by_cell else None
            return self._by_cell.get(cell_id)


class Scribe:
    """Rank 0's scribe, one for its life (no thread started per cell: the hot path stays as it
    was). While a cell runs it drains into the cell's journal whenever the notebook has not read
    for ``KEEP_EVERY_S`` — the ranks' output and reports are kept on rank 0, not left to pile up
    in their outboxes — and tells the cluster's watchdogs that the job works (``report``), so that
    no idle clock runs while it does. A cell's end is told with its next beat, off the cell's path."""

    def __init__(self, drain, report=None):
        self.drain, self.report = drain, report
        self.current: Journal | None = None
        self._lock = threading.Lock()          # a drain in progress: a cell's release waits for it
        self._told_at = 0.0
        self._untold: Journal | None = None     # a cell's end, told with the scribe's next beat
        self._untold_lock = threading.Lock()
        threading.Thread(target=self._keep, name="gpugeek-journal", daemon=True).start()

    def keep(self, journal: Journal) -> None:
        with self._lock:
            self.current, self._told_at = journal, 0.0

    def release(self, journal: Journal) -> None:
        """No more drains into ``journal``: its cell ended."""
        with self._lock:
            if self.current is journal:
                self.current = None

    def tell_soon(self, journal: Journal) -> None:
        """Tell the watchdogs of ``journal``'s end within ``KEEP_EVERY_S / 2``: cells run back to back
        then cost one write to the cluster's store a beat, not one each (an idle clock counts
        minutes; a second's delay changes nothing)."""
        with self._untold_lock:
            self._untold = journal

    def _keep(self) -> None:
        while True:
            time.sleep(KEEP_EVERY_S / 2)
            with self._untold_lock:
                untold, self._untold = self._untold, None
            if untold is not None and self.report is not None:
                self.report(untold)
            with self._lock:
                kept = self.current
                if kept is None:
                    continue
                if kept.unread_for(KEEP_EVERY_S):
                    self.drain(kept)
                if self.report is not None and time.monotonic() - self._told_at >= KEEP_EVERY_S:
                    self.report(kept)
                    self._told_at = time.monotonic()

def _steps(ranks) -> list[int]:
    """The steps the ranks' reports name (a drain's ranks, or an outcome's results)."""
    return [s["step"] for d in ranks for s in d.get("samples", ()) if s.get("step") is not None]


def told(journal: Journal) -> dict:
    """What the watchdogs read of a job (``raynodes.kv_all(JOB_PREFIX)``)."""
    return {"at": time.time(), "every": KEEP_EVERY_S, "job": journal.job.get("id"),
            "name": journal.job.get("name"), "kernel": journal.job.get("kernel"),
            "running": journal.outcome is None, "step": journal.step,
            "began": journal.began, "ended": journal.ended, "state": journal.state}


def tell_watchdogs(kept: Journal) -> None:
    """The job's state into the cluster's KV store, under this group's name: the watchdogs (the
    head's, the notebook machine's) see a job working while no notebook watches it."""
    import json

    import ray

    from ..raynodes import JOB_PREFIX, put_from_worker

    name = ray.get_runtime_context().get_actor_name() or f"pid-{os.getpid()}"
    try:
        put_from_worker(f"{JOB_PREFIX}{name}", json.dumps(told(kept)))
    except Exception:  # noqa: BLE001 - the GCS busy or going: the next tell says it again
        pass
