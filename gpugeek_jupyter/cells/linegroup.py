"""A warm worker group that a remote cluster's keeper holds for this kernel, seen from the notebook:
the calls of ``group.WorkerGroup`` — start, run a cell, stop — each a request over the line.

A cell goes as its source, with an id of this kernel's (``RunCell``): sent again after the line came
back, it is not run again. What it prints and reports is read from rank 0's journal of it, from a
cursor (``ReadCell``): a reply lost on the way is read again, and what the ranks printed while the
laptop was away arrives afterwards, in order, with no gap and no repeat. While the line is down the
job goes on there; the cell says so once, dials again by itself, and says so once more when it
picks up (``ride_out``). The stop button is a request too, the rest of the way the same.
"""

from __future__ import annotations

import time
import uuid

from ..cluster import registry
from ..cluster.processes import this_kernel
from ..errors import GpugeekError
from ..group import orphans
from ..group.results import Interrupted, Printer, Result, failure, show_drained
from ..kernel import connection
from ..line import messages as m
from ..line.wire import LinkDown
from ..workers import progress
from ..workers.options import RunOptions
from . import away, pushing
from .driving import LineDriver

READY_TIMEOUT_S = 300      # a group's start on the keeper (it may wait for room, as a local one does)
DRAIN_WAIT_S = 2.0         # the keeper holds a read this long for a quiet cell's news
ANSWER_S = progress.ANSWER_WITHIN_S + 10.0   # rank 0's answer, then the way back, after a read's wait
REDIAL_EVERY_S = 2.0       # while the line is down: dial again this often…
REDIAL_MAX_S = 10.0        # …backing off to this


def _say(text: str) -> None:
    print(text, end="", flush=True)


class LineGroup:
    def __init__(self, options: RunOptions, address: str, cluster_id: int, line, on_node_samples=None,
                 sample_gpus: bool = True, notices: str | None = None, grows: bool = True):
        self.options, self.address, self.cluster_id, self.line = options, address, cluster_id, line
        self.on_node_samples, self.sample_gpus, self.notices, self.grows = on_node_samples, sample_gpus, notices, grows
        self.group_id = orphans.new_group_id()
        self.info: list[dict] = []
        self.line_notes: list[str] = []
        self.cells = 0
        self.broken = False
        self.keep_s: float | None = None
        self.job: dict | None = None
        self.cursor = 0
        self.last_step: int | None = None
        self.workers: list = []       # none here: the keeper holds them
        self.client = False           # not a Ray Client: the link is the line's, ridden out here
        self.drains = 0
        self.warming = False          # its start runs on the keeper while the notebook goes on (``begin``)

    @property
    def driver(self) -> LineDriver:
        return LineDriver(self.line, self._name())

    def _name(self) -> str:
        return f"cluster {registry.get(self.cluster_id).name!r}"

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        """The group on the keeper: the groups of this machine's gone kernels removed first (only
        this machine can tell them gone), then built there — or found started (``begin``)."""
        if not self.warming:
            orphans.reclaim(self.driver, self.keep_s)
        request = self._start_request(background=False)
        try:
            started = self._ask(request, READY_TIMEOUT_S, riding=True)     # by its id: sent again, built once
        except BaseException:        # the stop button while it starts, or a refusal: nothing left half-built
            self.stop()
            raise
        self._took(started)

    def begin(self) -> None:
        """Start it on the keeper without waiting (``up --workers``): ``start`` later takes it as
        started, or waits there for the rest of its start."""
        orphans.reclaim(self.driver, self.keep_s)
        self._ask(self._start_request(background=True), ANSWER_S)
        self.warming = True

    def _start_request(self, background: bool) -> m.StartGroup:
        return m.StartGroup(group_id=self.group_id, options=self.options, owner=this_kernel(),
                            sample_gpus=self.sample_gpus, notices=self.notices, grows=self.grows,
                            keep_s=self.keep_s, background=background)

    def _took(self, started: m.GroupStarted) -> None:
        self.warming = False
        self.group_id, self.info = started.group_id, list(started.info)
        self.options = started.options
        self.line_notes = list(started.notes)

    def adopt(self, group_id: str, owner: str) -> None:
        """Take over the group of a kernel that is gone (``orphans``), its variables with it."""
        self.group_id = group_id
        self._took(self._ask(m.AdoptGroup(group_id=group_id, owner=owner), READY_TIMEOUT_S, riding=True))

    def refind(self) -> bool:
        return not self.broken      # the keeper finds its groups by name itself

    def versions(self, names: list[str]) -> list[dict]:
        return self._ask(m.Versions(group_id=self.group_id, names=list(names)), ANSWER_S).ranks

    def connected(self) -> bool:
        """Whether this kernel is still on its line (not moved to another cluster since)."""
        return connection.line() is self.line

    def stop(self) -> None:
        """Stopped on the keeper. With the line down it stays there, holding its room, until this
        kernel is gone (a later start of this machine's then finds it so, and removes it) or the
        cluster stops."""
        self.broken = True
        if not self.connected():       # this kernel let go of that cluster: its keeper keeps the group
            return
        try:
            self.line.call(m.StopGroup(group_id=self.group_id), ANSWER_S, said=_say)
        except (LinkDown, GpugeekError):
            pass

    def leave(self) -> bool:
        """Stopped unless a job still runs on it (True then)."""
        if self.broken or not self.connected():
            return False
        try:
            return self.line.call(m.LeaveGroup(group_id=self.group_id), ANSWER_S).running
        except (LinkDown, GpugeekError):
            return True         # out of reach: whatever runs there goes on

    @property
    def notes(self) -> list[str]:
        return sorted({i["note"] for i in self.info if i.get("note")} | set(self.line_notes))

    def drain_telemetry(self, every: float = 0.0) -> int:
        """The node samplers' reports into the ledger; nothing while the line is down (this runs
        between cells, which never wait for a dial)."""
        if not self.line.up or self.broken:
            return 0
        try:
            samples = self.line.call(m.DrainTelemetry(group_id=self.group_id, every=every), ANSWER_S).samples
        except (LinkDown, GpugeekError):
            return 0
        if samples and self.on_node_samples is not None:
            self.on_node_samples(samples)
        return len(samples)

    # -- a cell ---------------------------------------------------------------------------------

    def run(self, source: str, options: RunOptions, *, push: dict | None = None,
            pull: list[str] | None = None, all_ranks: bool = False, on_samples=None, job: dict | None = None,
            on_sent=None) -> Result:
        """Run one cell on every rank and follow it to its end: its output shown as it comes, its
        value and pulled variables returned, its failure raised — as ``WorkerGroup.run``."""
        self.cells += 1
        self.job, self.cursor = job, 0
        uid = uuid.uuid4().hex
        printer = Printer(all_ranks)
        start = time.perf_counter()
        request = m.RunCell(uid=uid, group_id=self.group_id, source=source, options=options, pull=list(pull or []),
                            job=dict(job or {}), push=pushing.dumps(push) if push else None, wait_s=DRAIN_WAIT_S)
        try:
            # the job's ledger row is written while the cell runs (``on_sent``: once, whichever way)
            news = self._ask(request, DRAIN_WAIT_S + ANSWER_S, riding=True, meanwhile=on_sent)
            if on_sent is not None:
                on_sent()
            while True:
                self.cursor, self.last_step = show_drained(news.news, printer, on_samples, self.on_node_samples,
                                                           self.cursor, self.last_step)
                if news.news.get("outcome") is not None:
                    break
                connection.check_stop()
                self.drains += 1
                news = self._ask(m.ReadCell(group_id=self.group_id, number=news.number, cursor=self.cursor,
                                            wait_s=DRAIN_WAIT_S), DRAIN_WAIT_S + ANSWER_S, riding=True)
        except KeyboardInterrupt:
            self._interrupt(uid)
        outcome = news.news["outcome"]
        self.broken = self.broken or news.broken
        printer.show_ranks(outcome["results"], on_samples)
        error = failure(outcome)
        if error is not None:
            raise error
        if any(r.get("interrupted") for r in outcome["results"].values()):
            raise Interrupted("interrupted")
        return Result.of(outcome["results"][0], time.perf_counter() - start)

    def _interrupt(self, uid: str) -> None:
        """The stop button: every rank, through the keeper; raises ``Interrupted`` as a local group's."""
        try:
            broken = self.line.call(m.Interrupt(group_id=self.group_id, uid=uid), progress.ANSWER_WITHIN_S + 10).broken
        except LinkDown:
            job = (self.job or {}).get("id", "JOB")
            raise Interrupted(f"interrupted here, but the cluster is out of reach: the job goes on there — "
                              f"`%gpugeek attach {job}` follows it, and its stop button stops it") from None
        self.broken = self.broken or bool(broken)
        workers = len(self.info) or self.options.workers
        raise Interrupted(f"interrupted on all {workers} workers"
                          + (" — the group is ready: run the next cell" if not broken
                             else "; a rank was stuck, so the group was stopped — its variables are gone, "
                                  "the next cell starts a new one")) from None

    # -- the line -------------------------------------------------------------------------------

    def _ask(self, request, timeout: float, riding: bool = False, meanwhile=None):
        """``request``'s reply. While the line is down (``riding``: a cell's), the job goes on
        there: said once, then the keeper dialled again until it answers (every request is safe
        to send again), and said again once it does; a line that broke between two requests and
        was dialled again at once is said too. A cluster stopped meanwhile is one line."""
        dialled = self.line.dialled
        try:
            reply = self.line.call(request, timeout, said=_say, meanwhile=meanwhile)
        except LinkDown as exc:
            if not riding:
                raise GpugeekError(f"{self._name()} does not answer from here ({exc}) — run the cell again once "
                                   f"it does") from None
            return self._ride_out(request, timeout, exc)
        if riding and 0 < dialled < self.line.dialled:     # it broke between two requests: dialled again
            print(f"\nthe line to {self._name()} dropped and was dialled again: this cell reads on from where "
                  f"it was", flush=True)
        return reply

    def _ride_out(self, request, timeout: float, first: LinkDown):
        """Dialled again at once (the tunnel reopened, the line only broke: said in one line); if
        the keeper still does not answer, the cluster is out of reach: said once, dialled again
        with a growing wait until it answers, said once more."""
        try:
            reply = self.line.call(request, timeout, said=_say)
        except LinkDown as again:
            first = again
        else:
            print(f"\nthe line to {self._name()} dropped ({first}) and was dialled again: this cell reads on "
                  f"from where it was", flush=True)
            return reply
        step = f" (step {self.last_step})" if self.last_step is not None else ""
        print(f"\nthe cluster is out of reach; the job goes on there{step} — this cell picks up when it "
              f"answers ({first})", flush=True)
        gone_at, wait = time.monotonic(), REDIAL_EVERY_S
        while True:
            record = registry.get(self.cluster_id)
            if not record.live:
                self.broken = True
                raise GpugeekError(away.lost(record, (self.job or {}).get("id", "")))
            connection.check_stop()
            time.sleep(wait)
            try:
                reply = self.line.call(request, timeout, said=_say)
            except LinkDown:
                wait = min(REDIAL_MAX_S, wait * 1.5)
                continue
            print(f"the line to {self._name()} is back after {time.monotonic() - gone_at:.0f} s: this cell "
                  f"reads on from where it was", flush=True)
            return reply
