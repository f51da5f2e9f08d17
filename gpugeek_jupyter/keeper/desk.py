"""The keeper's answers: each request of the line (``line.messages``) run with the code a local
kernel runs — the warm groups (``group/workergroup.py``), their cells led by rank 0 and kept in its
journal, and the cluster's questions (``group/driver.RayDriver``).

A cell is known by the kernel's id for it: sent again after the line came back, it is not run
again, and after a keeper restart it is found in rank 0's journals by that id. A group is known by
its id: a keeper that started again finds its workers by name.
"""

from __future__ import annotations

import pickle
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from ..errors import GpugeekError
from ..group.driver import RayDriver
from ..group.link import OnCluster
from ..group.sending import Led
from ..group.workergroup import WorkerGroup
from ..health.nodes import examine
from ..line import messages as m
from ..workers.options import CellCall, RunOptions
from ..workers.outcome import CANCEL_WAIT_S
from . import rank0
from .shipped import Shipped

SAMPLES_KEPT = 10_000      # node samples kept for a kernel that has not asked for them
FIRST_WAIT_S = 0.05        # a cell done within this needs no read of its journal
CELLS_KEPT = 4096          # cells known by their id (sent again after a cut, or read again)


@dataclass
class Sent:
    """A cell on its way: the group it went to, its number there, rank 0's call (None after a
    keeper restart: it is followed through the journal alone)."""

    group_id: str
    number: int
    ref: object = None
    read: bool = False      # its journal was read once: news from now on come from there


class Desk:
    """Every group and cell the keeper holds, and a handler per request type (``handle``)."""

    def __init__(self, gcs: str, shipped: Shipped, index_url: str | None = None):
        self.gcs, self.shipped, self.index_url = gcs, shipped, index_url
        self.driver = RayDriver()
        self.groups: dict[str, WorkerGroup] = {}
        self.cells: dict[str, Sent] = {}
        self.numbered: dict[tuple[str, int], Sent] = {}
        self.interrupted: set[str] = set()     # cells stopped before they came
        self.unwanted: set[str] = set()        # groups stopped while they started
        self.found: set[str] = set()           # groups found by name (this keeper started again since)
        self.rank0s: dict[str, rank0.Rank0] = {}   # how each group's rank 0 is reached
        self.samples: dict[str, list] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._answers: dict[type, object] = {}
        self._lock = threading.Lock()

    def handle(self, request, caller):
        """The request's answer, by the handler named like its type (``RunCell`` → ``run_cell``)."""
        kind = type(request)
        answer = self._answers.get(kind)
        if answer is None:
            answer = getattr(self, re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower(), None)
            if answer is None:
                raise GpugeekError("the cluster's gpugeek-jupyter does not know this request — run the kernel with "
                                   "the gpugeek-jupyter version that started the cluster")
            self._answers[kind] = answer
        return answer(request, caller)

    def _locked(self, key: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(key, threading.Lock())

    # -- groups ---------------------------------------------------------------------------------

    def _held(self, options: RunOptions, group_id: str, **flags) -> WorkerGroup:
        """A group this keeper drives: on the head, a Ray driver for its whole life (``OnCluster``)."""
        return WorkerGroup(options, self.gcs, link=OnCluster(self.gcs),
                           on_node_samples=lambda s: self._sampled(group_id, s), **flags)

    def _new(self, options: RunOptions, group_id: str, **flags) -> WorkerGroup:
        group = self._held(options, group_id, **flags)
        group.group_id = group_id
        group.runtime_env = self.shipped.group_env(self.index_url)
        return group

    def _sampled(self, group_id: str, samples: list) -> None:
        kept = self.samples.setdefault(group_id, [])
        kept.extend(samples)
        del kept[:-SAMPLES_KEPT]

    def _started(self, group: WorkerGroup) -> m.GroupStarted:
        return m.GroupStarted(group_id=group.group_id, options=group.options, info=list(group.info),
                              notes=group.notes)

    def group(self, group_id: str) -> WorkerGroup:
        """The group, held here or found again by name (this keeper started again)."""
        group = self.groups.get(group_id)
        if group is not None and not group.broken:
            return group
        state = self.driver.lead_state(group_id)
        if state is None:
            raise GpugeekError("the worker group is gone from the cluster (its rank 0 is) — run the cell again: "
                               "a new group starts")
        found = self._held(RunOptions(), group_id)
        found.adopt(group_id, state.get("owner") or group_id.rsplit(":", 1)[0])
        found.cells = state.get("cell") or 0
        self.groups[group_id] = found
        self.found.add(group_id)
        return found

    def start_group(self, request: m.StartGroup, caller) -> m.GroupStarted | m.Done:
        """The group built (or found built: asked again after the line came back). ``background``:
        built after the reply (``up --workers``: the first cell finds it started, or waits here for
        the rest of its start)."""
        lock = self._locked(request.group_id)
        lock.acquire()
        if request.background:
            threading.Thread(target=self._start, args=(request, lock), name="gpugeek-warm", daemon=True).start()
            return m.Done()
        return self._start(request, lock)

    def _start(self, request: m.StartGroup, lock: threading.Lock) -> m.GroupStarted:
        try:
            held = self.groups.get(request.group_id)
            if held is not None and not held.broken:
                return self._started(held)
            group = self._new(request.options, request.group_id, sample_gpus=request.sample_gpus,
                              notices=request.notices, grows=request.grows)
            group.keep_s = request.keep_s
            try:
                group.start()
            except Exception as exc:
                if request.background:    # said in the log; the first cell starts it again, and is told
                    print(f"keeper: the warm group {request.group_id} did not start ({type(exc).__name__}: "
                          f"{exc})", flush=True)
                    return None
                raise
            if request.group_id in self.unwanted:      # stopped while it started
                self.unwanted.discard(request.group_id)
                group.stop()
                raise GpugeekError("the worker group was stopped while it started — run the cell again")
            self.groups[request.group_id] = group
            if request.background:
                print(f"keeper: the warm group {request.group_id} of {group.options.workers} workers is ready",
                      flush=True)
            return self._started(group)
        finally:
            lock.release()

    def adopt_group(self, request: m.AdoptGroup, caller) -> m.GroupStarted:
        group = self._held(RunOptions(), request.group_id)
        group.adopt(request.group_id, request.owner)
        self.groups[request.group_id] = group
        return self._started(group)

    def stop_group(self, request: m.StopGroup, caller) -> m.Done:
        group_id = request.group_id
        lock = self._locked(group_id)
        if not lock.acquire(blocking=False):    # a start under way: the group is stopped as it ends
            self.unwanted.add(group_id)
            return m.Done()
        try:
            group = self.groups.pop(group_id, None)
        finally:
            lock.release()
        if group is not None:
            group.stop()
        else:
            self.driver.remove_group(group_id)
        return m.Done()

    def leave_group(self, request: m.LeaveGroup, caller) -> m.Staying:
        group_id = request.group_id
        if (self.driver.lead_state(group_id) or {}).get("running"):
            return m.Staying(running=True)
        self.stop_group(m.StopGroup(group_id=group_id), caller)
        return m.Staying(running=False)

    def versions(self, request: m.Versions, caller) -> m.RankVersions:
        return m.RankVersions(ranks=self.group(request.group_id).versions(request.names))

    def drain_telemetry(self, request: m.DrainTelemetry, caller) -> m.NodeSamples:
        group_id = request.group_id
        group = self.groups.get(group_id)
        if group is not None and not group.broken:
            group.drain_telemetry(every=request.every)
        taken, self.samples[group_id] = self.samples.get(group_id, []), []
        return m.NodeSamples(samples=taken)

    def ship(self, request: m.Ship, caller) -> m.Held:
        if request.modules or request.pip is not None or request.working_dir is not None:
            self.shipped.ship(request.modules, request.pip, request.working_dir)
        return m.Held(**self.shipped.held())

    # -- cells ----------------------------------------------------------------------------------

    def run_cell(self, request: m.RunCell, caller) -> m.CellNews:
        with self._locked(request.uid):
            sent = self.cells.get(request.uid)
            if sent is None:
                if request.uid in self.interrupted:
                    raise GpugeekError("the cell was interrupted before it reached the workers — run it again")
                sent = self._send(request)
                self.cells[request.uid] = self.numbered[sent.group_id, sent.number] = sent
                self._forget_old_cells()
        with self._lock:
            self._locks.pop(request.uid, None)     # known by its id from now on
        return self._news(sent, 0, request.wait_s)

    def _forget_old_cells(self) -> None:
        """The oldest cells' entries go past ``CELLS_KEPT`` (rank 0 keeps only its last journals anyway)."""
        while len(self.cells) > CELLS_KEPT:
            uid = next(iter(self.cells))
            gone = self.cells.pop(uid)
            self.numbered.pop((gone.group_id, gone.number), None)
            self.interrupted.discard(uid)

    def _send(self, request: m.RunCell) -> Sent:
        """The cell to rank 0, which leads it on every rank — unless rank 0 already keeps it (this
        keeper started again after it came, and found the group by name)."""
        import ray

        group = self.group(request.group_id)
        if group.group_id in self.found:
            for kept in ray.get(group.workers[0].jobs.remote(), timeout=30):
                if kept.get("uid") == request.uid:
                    return Sent(group.group_id, kept["cell"])
        group.cells += 1
        job = {**request.job, "uid": request.uid}
        call = CellCall.for_rank0(request.source, request.options, group.cells, request.pull, job)
        group.job = job
        ref = self._rank0(group).lead(pickle.dumps(call), request.push)
        return Sent(group.group_id, group.cells, ref)

    def read_cell(self, request: m.ReadCell, caller) -> m.CellNews:
        sent = self.numbered.get((request.group_id, request.number)) or Sent(request.group_id, request.number)
        return self._news(sent, request.cursor, request.wait_s)

    def _news(self, sent: Sent, cursor: int, wait_s: float) -> m.CellNews:
        """The cell's journal from ``cursor`` on: held up to ``wait_s`` for news while it runs,
        with its outcome once it ended (a group a rank died or stuck in is stopped then). A cell
        done at once costs no read at all: nothing was drained from it into the journal yet, so
        its outcome holds all it printed (as for a local group: ``WorkerGroup._gather``)."""
        group = self.groups.get(sent.group_id)     # a group its cell's end stopped still has that end to tell
        if group is None or (group.broken and sent.ref is None):
            group = self.group(sent.group_id)
        if sent.ref is not None and cursor == 0 and not sent.read:
            outcome = rank0.ended(sent.ref, within=min(wait_s, FIRST_WAIT_S))      # one wait, done at once
            if outcome is not None:
                return self._ended(group, sent, {"ranks": {}, "nodes": [], "next": 0, "dropped": 0,
                                                 "running": False, "step": None, "outcome": outcome})
        sent.read = True
        if sent.ref is None:          # sent before this keeper started again: the journal alone
            drained = self._journal(group.group_id, sent.number, cursor, wait_s)
        else:
            lead = self._rank0(group)
            began = time.monotonic()
            drained = lead.drain(wait_s, cursor, sent.number)
            early = time.monotonic() - began < wait_s / 2       # asked before its cell began: wait on the cell
            if drained is not None and drained["outcome"] is None and drained["next"] == cursor and early \
                    and rank0.done(sent.ref, wait_s / 2):
                drained = None
            if drained is None or (drained["outcome"] is None and rank0.done(sent.ref)):
                outcome = rank0.ended(sent.ref)       # ended (rank 0's journal of it is whole now), or rank 0 died
                drained = lead.drain(0.0, cursor, sent.number) or {
                    "ranks": {}, "nodes": [], "next": cursor, "dropped": 0, "running": False, "step": None}
                drained["outcome"] = outcome
        if drained is None:
            raise GpugeekError("this cell's output is no longer kept on the cluster (its group was stopped, or a newer "
                               "group took its place) — `%gpugeek jobs` lists what the cluster keeps")
        return self._ended(group, sent, drained) if drained.get("outcome") is not None else \
            m.CellNews(number=sent.number, news=drained)

    def _rank0(self, group: WorkerGroup) -> rank0.Rank0:
        """How this keeper reaches the group's rank 0: its lead line, opened once."""
        reached = self.rank0s.get(group.group_id)
        if reached is None or reached.group is not group:
            reached = self.rank0s[group.group_id] = rank0.Rank0(group)
        return reached

    @staticmethod
    def _ended(group: WorkerGroup, sent: Sent, drained: dict) -> m.CellNews:
        """The cell's last news; a group a rank died or stuck in can run nothing more: its workers
        are freed now, whether or not a kernel is there to hear it."""
        ended = drained["outcome"]
        if ended["stuck"] or ended["dead"] is not None:
            group.broken = True
            group.stop()
        return m.CellNews(number=sent.number, news=drained, broken=group.broken)

    def _journal(self, group_id: str, number: int, cursor: int, wait_s: float) -> dict | None:
        """A cell this keeper did not send (it started again since): rank 0's journal alone."""
        try:
            return self.driver.journal(group_id, number, cursor, wait_s)
        except Exception:  # noqa: BLE001 - rank 0 gone: nothing keeps the cell
            return None

    def interrupt(self, request: m.Interrupt, caller) -> m.Stopped:
        """Every rank of the cell stopped; broken when one was stuck and the group had to go."""
        sent = self.cells.get(request.uid)
        if sent is None:            # not here yet: it will not run when it comes
            self.interrupted.add(request.uid)
            return m.Stopped(broken=False)
        group = self.group(sent.group_id)
        if sent.ref is None:
            self.driver.interrupt_job(group.group_id, sent.number)
        elif not isinstance(sent.ref, Future):
            group.cancel(Led.following(sent.ref))
        else:                  # as ``WorkerGroup.cancel``: every rank, then a stuck one stops the group
            for worker in group.workers:
                worker.interrupt.remote(sent.number)
            ended = rank0.ended(sent.ref, within=CANCEL_WAIT_S)
            if ended is None or ended["stuck"] or ended["dead"] is not None:
                group.broken = True
                group.stop()
        return m.Stopped(broken=group.broken)

    # -- the cluster's groups, jobs and nodes, as a local kernel asks Ray ---------------------------

    def list_groups(self, request, caller) -> m.Groups:
        return m.Groups(groups=self.driver.groups())

    def lead_state(self, request: m.LeadState, caller) -> m.GroupState:
        return m.GroupState(state=self.driver.lead_state(request.group_id))

    def remove_group(self, request: m.RemoveGroup, caller) -> m.Done:
        self.groups.pop(request.group_id, None)
        self.driver.remove_group(request.group_id)
        return m.Done()

    def kept_jobs(self, request, caller) -> m.Jobs:
        return m.Jobs(kept=list(self.driver.kept_jobs()))

    def read_journal(self, request: m.ReadJournal, caller) -> m.Journal:
        return m.Journal(news=self.driver.journal(request.group_id, request.number, request.cursor, request.wait_s))

    def interrupt_job(self, request: m.InterruptJob, caller) -> m.Done:
        self.driver.interrupt_job(request.group_id, request.number)
        return m.Done()

    def node_answers(self, request: m.NodeAnswers, caller) -> m.Answer:
        return m.Answer(yes=self.driver.node_answers(request.node_id))

    def wait_gone(self, request: m.WaitGone, caller) -> m.Done:
        self.driver.wait_gone(request.node_ids, request.until)
        return m.Done()

    def room(self, request: m.Room, caller) -> m.RoomFor:
        return m.RoomFor(workers=self.driver.room(request.kind, request.each))

    def never_fits(self, request: m.NeverFits, caller) -> m.Done:
        self.driver.never_fits(request.workers, request.gpus_per_worker, request.grows)
        return m.Done()

    def examine(self, request: m.Examine, caller) -> m.Examined:
        return m.Examined(**examine(request.packages, request.labels, self.gcs, request.gcs_port,
                                    self.shipped.group_env(self.index_url)))

