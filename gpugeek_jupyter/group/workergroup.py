"""The warm worker group, seen from the process that drives it (a local kernel, or a remote
cluster's keeper on its head): build it once, send it cells, stream back.

N ``Worker`` actors are placed with a Ray placement group (one bundle per worker: its GPUs, or a
CPU), rank 0 hosts the ``torch.distributed`` rendezvous, and the group stays up between cells
until its size changes, a rank fails in a way that leaves it unusable, or
``reset()``. Running a cell is one actor call, to rank 0, which hands it to the other ranks
inside the cluster and stops them if one fails (``Worker.execute_all``); the stop button and
dead workers are handled here.

While a cell runs, one drain at a time is out to rank 0, which answers for every rank and for
the node samplers (``progress``): it comes back when rank 0's cell prints or ends, else after
``DRAIN_WAIT_S``. On a Ray Client, that drain is all the notebook waits on (rank 0 answers it
when the cell ends), so a quiet cell costs two requests every ``DRAIN_WAIT_S``.
A short cell costs one request and one wait (on a Ray Client: one round trip):
the call carries one bytes argument (Ray serialises every argument on its own, and a few small
ones cost more than an empty cell) and the node samplers' reports, asked of rank 0 at most once
a second, ride along.
"""

from __future__ import annotations

import time

from ..errors import GpugeekError
from ..launch import torchrun
from ..meter import telemetry
from ..workers import progress
from ..workers.options import CellCall, RunOptions
from ..workers.outcome import CANCEL_WAIT_S
from ..workers.worker import LEAD_THREADS, Worker
from . import orphans
from .driver import RayDriver
from .link import Link, OnCluster, StoppedElsewhere
from .orphans import NAMESPACE, group_name
from .placement import bundle, growing, keep, never_fits, no_room, rank_places, release_held, remove
from .results import Interrupted, Printer, Result, WorkerDied, failure, in_words, show_drained
from .sending import Led

READY_TIMEOUT_S = 120
FIRST_WAIT_S = 0.05      # a cell done within this needs no drain at all
DRAIN_WAIT_S = 2.0       # rank 0 holds a drain this long for a cell that prints nothing: live
                         # figures every 2 s (3-host DDP: 0.97 of plain, 0.92 at 1 s; BENCHMARKS.md)
DRAIN_GAP_S = 0.5        # a drain goes no sooner than this after the one before
HELD_WAIT_S = 10.0       # how long a new group waits for room while an old one's placement group is held
SAMPLE_EVERY_S = telemetry.MIN_INTERVAL_S   # the samplers have nothing newer more often
def _first_and_last(error: BaseException) -> str:
    """A long error (Ray's runtime environment's, with a node's traceback in it) as one line: its
    first line and the last that says what went wrong."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line for line in lines[1:] if not line.startswith(NOT_SAID)]
    return lines[0] + (f" … {said[-1]}" if said else "") if lines else ""


NOT_SAID = ("File ", "Traceback", "[", ")", "Command", "Last ", "^", "~")     # a traceback's frames, a command


class WorkerGroup:
    """The warm group, driven from this process (a local kernel, or a remote cluster's keeper):
    ``link`` is how this process reaches the cluster (``OnCluster``, the keeper's, when none is given)."""

    def __init__(self, options: RunOptions, address: str, on_node_samples=None, sample_gpus: bool = True,
                 notices: str | None = None, grows: bool = True, link: Link | None = None):
        self.options, self.address = options, address
        self.link: Link = link if link is not None else OnCluster(address)
        self.grows = grows                          # an autoscaler may add nodes: waiting can help
        self.notices = notices                      # where nodes hear of their preemption (workers/notice.py)
        self.sample_gpus = sample_gpus              # False on simulated nodes (declared GPUs)
        self.on_node_samples = on_node_samples      # where the node samplers' reports go
        self.samplers: list = []
        self.sampled_at = 0.0
        self.workers: list = []
        self.pg = None
        self.info: list[dict] = []
        self.cells = 0
        self.broken = False
        self.line_note: str | None = None
        self.drains = 0         # drains sent while cells ran (one a second or so: tests read it)
        self.client = False     # this process is a Ray Client: the link can go down under a cell (``link``)
        self.keep_s: float | None = None    # a gone kernel's ended group is kept this long (the idle window)
        # the workers belong to the cluster, not to this process's connection (detached, named): a
        # cell outlives a link that went down, and the group a Ray Client that had to reconnect
        self.group_id = orphans.new_group_id()
        self.cursor = 0         # how far the running cell's journal has been read
        self.job: dict | None = None   # the running cell's job (id, name, kernel)
        self.last_step: int | None = None   # the latest step the journal told of
        self.runtime_env: dict = {}   # what the workers get besides torchrun's variables (a keeper's: the package)
        self.warming = False    # started by its first cell, here (a keeper's group may start ahead)

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        n, gpus = self.options.workers, self.options.gpus_per_worker
        one = bundle(gpus)
        held = release_held(self.link.connected_address())
        orphans.reclaim(RayDriver(), self.keep_s)
        never_fits(n, gpus, self.grows)     # said at once where no wait can help
        self.pg = placement_group([dict(one) for _ in range(n)], strategy="PACK",
                                  name=group_name(self.group_id), lifetime="detached")
        try:
            room = orphans.wait_for_room(RayDriver(), self.pg.ready(), HELD_WAIT_S if held else READY_TIMEOUT_S,
                                         self.group_id,
                                         self.keep_s, growing=(lambda: growing(n, gpus)) if self.grows else None)
        except BaseException:    # the stop button while it waits: no placement group left pending
            self.stop()
            raise
        if not room:
            have, held = ray.cluster_resources(), release_held(self.link.connected_address())
            self.stop()
            raise no_room(n, gpus, have, held, [] if held else orphans.holders(RayDriver(), self.group_id))
        try:
            self._start_actors(n, gpus)
        except BaseException as exc:  # a setup timeout, a port taken meanwhile, Ctrl-C: free it all
            self.stop()
            if isinstance(exc, GpugeekError) or not isinstance(exc, Exception):
                raise
            cause = getattr(exc, "cause", None) or exc     # a worker's own error, not Ray's wrapping
            said = in_words(cause) if type(cause).__module__.split(".")[0] == "ray" else \
                f"{type(cause).__name__}: {_first_and_last(cause)}"
            raise GpugeekError(f"the worker group did not start ({said}) — `%gpugeek doctor` checks the nodes; run "
                               "the cell again") from None

    def _start_actors(self, n: int, gpus: float) -> None:
        import ray

        env = {**self.runtime_env, "env_vars": {**self.runtime_env.get("env_vars", {}), **torchrun.process_env()}}
        actor = ray.remote(runtime_env=env)(Worker)   # torchrun's variables: set before torch loads
        places = rank_places(self.pg, n)      # a node's ranks consecutive, as under torchrun
        self.workers = [
            actor.options(max_concurrency=LEAD_THREADS if i == 0 else 2, num_cpus=0 if gpus else 1,
                          num_gpus=gpus or 0, name=group_name(self.group_id, i), namespace=NAMESPACE,
                          lifetime="detached", scheduling_strategy=places[i]).remote()
            for i in range(n)]
        lead = self.workers[0]
        asked = [lead.node_address.remote(), lead.open_line.remote(), *(w.where.remote() for w in self.workers)]
        (master, port), cell_line, *where = ray.get(asked, timeout=READY_TIMEOUT_S)
        *self.info, no_line = ray.get([w.setup.remote(i, n, master, port, self.options, cell_line=cell_line,
                                                      notices=self.notices, env=env,   # torchrun's variables
                                                      timeout_s=self.options.collective_timeout)
                                       for i, (w, env) in enumerate(zip(self.workers, torchrun.contract(
                                           where, master, port, self.group_id), strict=True))]
                                      + [lead.meet.remote(self.workers[1:])], timeout=READY_TIMEOUT_S)
        if no_line:
            self.line_note = (f"rank {', '.join(map(str, no_line))} did not connect to rank 0's cell line "
                              "(a port between the hosts closed?): cells reach those ranks by Ray calls, "
                              "about a millisecond slower each")
        from ray.util.client import ray as client

        self.client = client.is_connected()
        if self.on_node_samples is not None:       # one sampler per node the group runs on
            self.samplers = telemetry.start_samplers(sorted({i["node_id"] for i in self.info}),
                                                     gpus=self.sample_gpus, detached=True)
            # rank 0 asks them, with the ranks' output
            ray.get(lead.keep_samplers.remote(self.samplers, SAMPLE_EVERY_S), timeout=READY_TIMEOUT_S)

    def adopt(self, group_id: str, owner: str) -> None:
        """Take over the warm group of a kernel that is gone (``orphans``): its workers, their
        variables, its node samplers; this kernel (``owner``, host:pid) is its owner from now on."""
        import ray
        from ray.util.client import ray as client
        from ray.util.placement_group import get_placement_group

        names = RayDriver().groups().get(group_id)
        if not names:
            raise GpugeekError(f"no worker group {group_id!r} on this cluster — it was removed")
        self.group_id = group_id
        self.workers = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
        told = ray.get(self.workers[0].adopted.remote(owner), timeout=READY_TIMEOUT_S)
        self.info = ray.get([w.description.remote() for w in self.workers], timeout=READY_TIMEOUT_S)
        self.options, self.samplers = told["options"], list(told["samplers"])
        self.pg = get_placement_group(group_name(group_id))
        self.client = client.is_connected()

    def refind(self) -> bool:
        """After this kernel connected again: its workers, found by name (they outlived the old
        connection). False when the cluster says they are gone (no such name, rank 0 dead) — the
        group is then broken. A link that fails again meanwhile raises: gone is not out of reach."""
        import ray

        try:
            workers = [ray.get_actor(group_name(self.group_id, i), namespace=NAMESPACE)
                       for i in range(len(self.workers) or self.options.workers)]
            ray.get(workers[0].pid.remote(), timeout=READY_TIMEOUT_S)
        except (ValueError, ray.exceptions.RayActorError):
            self.broken = True
            return False
        self.workers = workers
        return True

    def versions(self, names: list[str]) -> list[dict]:
        """Each rank's version of each module (``kernel/environment.py``), asked in parallel."""
        import ray

        return ray.get([w.versions.remote(names) for w in self.workers], timeout=READY_TIMEOUT_S)

    def connected(self) -> bool:
        """Whether this process is still a driver of the group's cluster. Once it is not (the
        cluster was stopped, here or elsewhere), no call may go to Ray: an actor call without a
        connection would quietly start a new local Ray instance."""
        import ray

        # the address we connected with: Ray's own view of it differs (127.0.0.1 becomes this
        # host's IP), so it cannot be compared
        return ray.is_initialized() and self.link.connected_address() == self.address

    def leave(self) -> bool:
        """Stopped unless a job still runs here (True then): ``orphans.leave``."""
        return orphans.leave(self)

    def stop(self) -> None:
        import ray

        if not self.connected():  # its cluster is gone, and its actors and samplers with it
            self.samplers, self.workers, self.pg = [], [], None
            return
        if self.samplers:
            samplers, self.samplers = self.samplers, []
            try:
                self.on_node_samples(telemetry.stop_samplers(samplers, timeout=2.0))
            except Exception:  # noqa: BLE001 - the cluster is gone: so are its samplers
                pass
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []
        if self.pg is not None:
            why = remove(self.pg)
            if why is not None:     # it still reserves its bundles: said when a group does not fit
                keep(self.pg, self.address, why)
            self.pg = None

    @property
    def notes(self) -> list[str]:
        return sorted({i["note"] for i in self.info if i.get("note")} | ({self.line_note} if self.line_note else set()))

    # -- a cell ---------------------------------------------------------------------------------

    def run(self, source: str, options: RunOptions, *, push: dict | None = None,
            pull: list[str] | None = None, all_ranks: bool = False, on_samples=None, job: dict | None = None,
            on_sent=None) -> Result:
        """Run one cell on every rank and wait for it, showing what it prints as it prints;
        ``on_sent()`` is called once it is on its way (``jobs`` writes a warm local cell's ledger
        row there, while the workers run it). Long because it is the hot path's one loop: the drain out,
        the cell's references and what was shown live in its locals, and each turn of the loop is
        a Ray request saved."""
        import ray
        from ray import cloudpickle

        self.cells += 1
        cell_id = self.cells
        call = CellCall.for_rank0(source, options, cell_id, pull or [], job)
        pushed = ray.put(cloudpickle.dumps(push)) if push else None
        start = time.perf_counter()
        self.job = job
        cell = Led(self.workers, call, pushed)
        asked = self._ask_nodes(SAMPLE_EVERY_S)
        sampled = asked is not None
        printer = Printer(all_ranks)
        outcome = poll = None
        stopped = cancelled = False
        self.cursor = 0
        try:
            if on_sent is not None:
                on_sent()
            gathered = self._gather(cell, asked, FIRST_WAIT_S)
            if gathered is not None:           # done at once: no loop, no drains
                outcome, samples = gathered
                asked = None
                self._record_node_samples(samples)
            poll_at = time.perf_counter()
            hold = 0.0 if all_ranks else DRAIN_WAIT_S
            while outcome is None:
                self.link.check_stop()        # stopped elsewhere: no more Ray calls from here
                now = time.perf_counter()
                if poll is None and now >= poll_at:       # one drain out at a time
                    poll = self.workers[0].drain_all.remote(hold, self.cursor, cell_id)
                    poll_at = now + DRAIN_GAP_S
                    self.drains += 1
                if poll is not None:
                    # the drain alone is waited on (on a Ray Client each request crosses the
                    # network), as rank 0 answers it when the cell ends (its lead stops the ranks
                    # if one fails) and a dead rank 0 fails it at once
                    drained, poll = self._get(poll, hold + progress.ANSWER_WITHIN_S), None
                    self.show(drained, printer, on_samples)
                    if drained is not None and drained["running"] and time.perf_counter() >= poll_at:
                        continue      # a quiet cell: the next drain, nothing else to ask
                done, _ = ray.wait(cell.pending, num_returns=1, timeout=max(0.0, poll_at - time.perf_counter()))
                if done:
                    try:
                        outcome = cell.take(done)
                    except WorkerDied:
                        self.broken = True
                        raise
        except StoppedElsewhere:
            self.broken = stopped = True
            raise
        except (Exception, SystemExit) as exc:      # Ray's client raises many kinds once its link is gone
            if not self.link.lost(self, exc):
                raise
            poll = asked = None
            outcome = self.link.ride_out(self, cell_id, printer, on_samples)
        except KeyboardInterrupt:
            self.cancel(cell)
            cancelled = True               # here: the finally must not cancel it again (nothing is pending)
            raise Interrupted(f"interrupted on all {len(self.workers)} workers"
                              + (" — the group is ready: run the next cell" if not self.broken
                                 else "; a rank was stuck, so the group was stopped — its variables are gone, "
                                      "the next cell starts a new one")) from None
        finally:
            if outcome is None and not cancelled and not self.broken and self.connected():   # left another
                self.cancel(cell)                                              # way: nothing may keep running
            if self.connected() and not stopped:
                if poll is not None and outcome is not None:   # what rank 0 took for it is shown first
                    self.show(self._get(poll, progress.ANSWER_WITHIN_S), printer, on_samples)
                if asked is not None:     # asked with the cell: their reports are not lost
                    self._record_node_samples(self._get(asked, 0.5) or [])
        self._settle(outcome, printer, on_samples)
        if not sampled:            # what was sampled since the last drain, if a second ago
            self.drain_telemetry(every=SAMPLE_EVERY_S)
        if any(r.get("interrupted") for r in outcome["results"].values()):
            raise Interrupted("interrupted")
        return Result.of(outcome["results"][0], time.perf_counter() - start)

    def _gather(self, cell, asked, timeout: float):
        """The cell's outcome and the node samplers' reports in one ``ray.get``, if all are there
        within ``timeout``: (outcome, node samples). None otherwise, or if any call failed (a
        dead actor): the loop then takes them one by one and says which."""
        import ray

        refs = list(cell.pending)
        try:
            values = ray.get(refs + ([asked] if asked is not None else []), timeout=timeout)
        except Exception:  # noqa: BLE001 - a timeout, or an error the loop reports precisely
            return None
        return cell.complete(values[:len(refs)]), (values[-1] if asked is not None else [])

    @staticmethod
    def _get(ref, timeout: float):
        """A drain's or a report's answer, None if it did not come (its rank is dying or gone)."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except Exception:  # noqa: BLE001 - a dying worker shows up through the cell's outcome
            return None

    def _settle(self, outcome: dict, printer, on_samples) -> None:
        """The ranks' results: their output and reports shown, then the cell's failure raised."""
        printer.show_ranks(outcome["results"], on_samples)
        if outcome["stuck"] or outcome["dead"] is not None:    # nothing more can run on this group
            self.broken = True
            self.stop()
        error = failure(outcome)
        if error is not None:
            raise error

    def drain_telemetry(self, every: float = 0.0) -> int:
        """Move the node samplers' reports into the ledger (at most every ``every`` seconds)."""
        asked = self._ask_nodes(every)
        return self._record_node_samples(self._get(asked, 2.0) or []) if asked is not None else 0

    def _ask_nodes(self, every: float):
        """Rank 0's ask for the node samplers' reports, once ``every`` s since the last; else None."""
        now = time.monotonic()
        if not self.samplers or not self.workers or now - self.sampled_at < every or not self.connected():
            return None
        self.sampled_at = now
        return self.workers[0].node_reports.remote()

    def _record_node_samples(self, samples: list[dict]) -> int:
        if samples:
            self.on_node_samples(samples)
        return len(samples)

    def show(self, drained: dict | None, printer, on_samples) -> None:
        """A drain's answer (``progress.gather``): the ranks' output and reports, the nodes' reports."""
        self.cursor, self.last_step = show_drained(drained, printer, on_samples, self._record_node_samples,
                                                   self.cursor, self.last_step)

    def cancel(self, cell) -> None:
        """Interrupt every rank; if the cell has not ended ``CANCEL_WAIT_S`` later (a rank stuck in
        a collective), stop the group: only that frees the workers (and their GPUs)."""
        import ray

        for worker in self.workers:
            worker.interrupt.remote(self.cells)
        pending = cell.pending
        done, stuck = ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)
        try:
            outcome = cell.take(done) if done else None
        except WorkerDied:
            outcome = None
        if stuck or outcome is None or outcome["stuck"] or outcome["dead"] is not None:
            self.broken = True
            self.stop()

