"""What a cell sent home, kept on the cluster: the job goes on whether or not the notebook reads.

Rank 0 writes every drain it takes (``progress.gather``: the ranks' output and reports, the node
samplers' reports) into the cell's journal, and the cell's outcome when it ends. The notebook
reads from its cursor (``since``), so a kernel whose laptop slept, or a kernel that attaches
later, reads what it missed in order; while nobody reads, a keeper on rank 0 takes the drains
itself every ``KEEP_EVERY_S``, so the ranks' outboxes never wait on the notebook.

Bounded: past ``BOUND_BYTES`` of output the oldest entries go, and a reader from before them is
told how many were dropped. The last ``CELLS_KEPT`` cells' journals are kept.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from .outcome import died, judge

BOUND_BYTES = 16 * 2**20     # a cell's output and reports kept on rank 0, at most
PEERS_WAIT_S = 60.0          # how long rank 0 waits for the other ranks' results of a sent cell
PEERS_POLL_S = 0.1
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
        self.read_at = time.monotonic()     # the notebook's last read: the keeper drains after a gap
        self.step: int | None = None        # the latest step a rank reported
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

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

    def since(self, cursor: int, wait_s: float = 0.0) -> dict:
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


class Keeper:
    """Rank 0's keeper, one for its life (no thread started per cell: the hot path stays as it
    was). While a cell runs it drains into the cell's journal whenever the notebook has not read
    for ``KEEP_EVERY_S`` — the ranks' output and reports are kept on rank 0, not left to pile up
    in their outboxes — and tells the cluster's watchdogs that the job works (``report``), so that
    no idle clock runs while it does. What a cell's end leaves to do (telling the watchdogs,
    waiting for the other ranks' last results) runs on a second thread, off the cell's path."""

    def __init__(self, drain, report=None):
        self.drain, self.report = drain, report
        self.current: Journal | None = None
        self._lock = threading.Lock()          # a drain in progress: a cell's release waits for it
        self._told_at = 0.0
        self._untold: Journal | None = None     # a cell's end, told with the keeper's next beat
        self._untold_lock = threading.Lock()
        self._later: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._keep, name="gpugeek-journal", daemon=True).start()
        threading.Thread(target=self._run_later, name="gpugeek-journal-end", daemon=True).start()

    def keep(self, journal: Journal) -> None:
        with self._lock:
            self.current, self._told_at = journal, 0.0

    def release(self, journal: Journal) -> None:
        """No more drains into ``journal``: its cell ended."""
        with self._lock:
            if self.current is journal:
                self.current = None

    def end_with_peers(self, journal: Journal, outcome: dict, peers: list) -> None:
        """End ``journal`` with the other ranks' results of its cell, off the cell's path
        (``end_with_peers``, batched with the cells that ended meanwhile)."""
        self._later.put((journal, outcome, peers))

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

    def _run_later(self) -> None:
        while True:
            ends = [self._later.get()]
            while True:           # and every end queued meanwhile: one request per rank for all
                try:
                    ends.append(self._later.get_nowait())
                except queue.Empty:
                    break
            for journal, outcome, _ in ends[:-CELLS_KEPT]:   # gone from the journals kept: nobody can read
                journal.end(outcome)                        # them, so no rank is asked for them
            by_group: dict[int, list] = {}
            for journal, outcome, peers in ends[-CELLS_KEPT:]:   # a group rebuilt meanwhile has other peers
                by_group.setdefault(id(peers), [peers, []])[1].append((journal, outcome))
            for peers, batch in by_group.values():
                try:
                    end_with_peers(batch, peers, self.tell_soon)
                except Exception:  # noqa: BLE001 - a journal's end must not stop the next one's
                    pass


def _steps(ranks) -> list[int]:
    """The steps the ranks' reports name (a drain's ranks, or an outcome's results)."""
    return [s["step"] for d in ranks for s in d.get("samples", ()) if s.get("step") is not None]


def told(journal: Journal) -> dict:
    """What the watchdogs read of a job (``raynodes.kv_all(JOB_PREFIX)``)."""
    return {"at": time.time(), "every": KEEP_EVERY_S, "job": journal.job.get("id"),
            "name": journal.job.get("name"), "kernel": journal.job.get("kernel"),
            "running": journal.outcome is None, "step": journal.step,
            "began": journal.began, "ended": journal.ended, "state": journal.state}


class Ended:
    """A rank's last results, by cell: for a cell the notebook sent to every rank (a Ray driver on
    the cluster's network), rank 0 ends the journal with them, so it holds every rank's last
    output and reports, as when rank 0 leads the cell."""

    KEYS = ("ok", "interrupted", "error", "type", "said", "output", "samples", "memory")

    def __init__(self):
        self._by_cell: dict[int, dict] = {}
        self._upto = 0             # the latest cell this rank ended: it runs them in order
        self._lock = threading.Lock()

    def keep(self, result: dict) -> None:
        if result.get("cell") is None:
            return
        with self._lock:
            self._by_cell[result["cell"]] = {k: result[k] for k in self.KEYS if k in result}
            self._upto = max(self._upto, result["cell"])
            while len(self._by_cell) > CELLS_KEPT:
                self._by_cell.pop(min(self._by_cell))

    def get(self, cell_id: int) -> dict | None:
        """The cell's result; None while it runs here (or has not come yet); {"forgotten": True}
        for one it ended whose result it no longer keeps (a reader asked too late)."""
        with self._lock:
            kept = self._by_cell.get(cell_id)
            return kept if kept is not None or cell_id > self._upto else {"forgotten": True}


def end_with_peers(ends: list[tuple[Journal, dict]], peers: list, told) -> None:
    """End each journal of ``ends`` (cells in the order they ran) once every other rank has its
    result of the cell (``Worker.ended``), asked without waiting on them — their second thread
    stays free for interrupts — with one request per rank for all of them: cells run back to back
    cost a rank one request a batch, not one each. A rank that never answers within
    ``PEERS_WAIT_S`` is named stuck, one that died dead; then ``told`` the last one ended."""
    import ray

    waiting = [(kept, outcome, dict(enumerate(peers, 1))) for kept, outcome in ends]
    deadline = time.monotonic() + PEERS_WAIT_S
    while any(missing for _, _, missing in waiting) and time.monotonic() < deadline:
        for rank, peer in enumerate(peers, 1):
            asked = [(kept, outcome, missing) for kept, outcome, missing in waiting if rank in missing]
            if not asked:
                continue
            try:
                got = ray.get(peer.ended.remote([kept.cell_id for kept, _, _ in asked]), timeout=10)
            except Exception:  # noqa: BLE001 - a dead or unreachable rank: the outcomes say so
                got = None
            for i, (_, outcome, missing) in enumerate(asked):
                if got is None:
                    died(rank, outcome)
                elif got[i] is None:
                    continue
                elif not got[i].get("forgotten"):
                    judge(rank, got[i], outcome)      # (a forgotten result: the journal has rank 0's)
                del missing[rank]
        while waiting and not waiting[0][2]:       # the ones complete, in order
            kept, outcome, _ = waiting.pop(0)
            kept.end(outcome)
            told(kept)
        if waiting:
            time.sleep(PEERS_POLL_S)          # the ranks' cells are ending: asked again shortly
    for kept, outcome, missing in waiting:
        outcome["stuck"] = sorted({*outcome["stuck"], *missing})
        kept.end(outcome)
        told(kept)


def tell_watchdogs(kept: Journal) -> None:
    """The job's state into the cluster's KV store, under this group's name: the watchdogs (the
    head's, the notebook machine's) see a job working while no notebook watches it."""
    import json

    import ray
    from ray.experimental import internal_kv

    from ..raynodes import JOB_PREFIX, NOTICE_NAMESPACE

    name = ray.get_runtime_context().get_actor_name() or f"pid-{os.getpid()}"
    try:
        internal_kv._internal_kv_put(f"{JOB_PREFIX}{name}", json.dumps(told(kept)), True,
                                     namespace=NOTICE_NAMESPACE)
    except Exception:  # noqa: BLE001 - the GCS busy or going: the next tell says it again
        pass
