"""The warm worker group, seen from the notebook: build it once, send it cells, stream back.

N ``Worker`` actors are placed with a Ray placement group (one bundle per worker: its GPUs, or a
CPU), rank 0 hosts the ``torch.distributed`` rendezvous, and the group stays up between cells
until its size changes, a rank fails in a way that leaves it unusable, or
``reset()``. Running a cell is one actor call per worker plus a drain of rank 0's output every
so often while it runs; errors, interrupts and dead workers are handled here.

A short cell costs one wait for every result together (on a Ray Client: one round trip once
the calls are scheduled): each call carries one bytes argument (Ray serialises every argument
on its own, and a few small ones cost more than an empty cell) and the node samplers' reports
ride along, at most once a second.
"""

from __future__ import annotations

import pickle
import sys
import time
from dataclasses import dataclass, field

from ..cluster import connection
from ..errors import GpugeekError
from ..meter import telemetry
from .options import RunOptions
from .worker import Worker

READY_TIMEOUT_S = 120
CANCEL_WAIT_S = 2.0
DRAIN_EVERY_S = (0.05, 0.5)      # first drain soon, then back off
SAMPLE_EVERY_S = telemetry.MIN_INTERVAL_S   # the samplers have nothing newer more often


class RemoteError(GpugeekError):
    """An exception in the user's cell on a worker: its traceback, labelled with the rank."""

    def __init__(self, rank: int, traceback_text: str, extra: str = ""):
        super().__init__(f"rank {rank}: {traceback_text.strip().splitlines()[-1]}")
        self.rank, self.traceback_text, self.extra = rank, traceback_text, extra

    def _render_traceback_(self) -> list[str]:
        lines = [f"\x1b[0;31mgpugeek: the cell failed on rank {self.rank}\x1b[0m",
                 *self.traceback_text.rstrip().splitlines()]
        return lines + (self.extra.splitlines() if self.extra else [])


class Interrupted(GpugeekError):
    """The stop button: every worker was interrupted."""


class WorkerDied(Exception):
    def __init__(self, rank: int, why: str):
        super().__init__(f"worker {rank} died ({why})")
        self.rank = rank


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


class WorkerGroup:
    def __init__(self, options: RunOptions, address: str, on_node_samples=None, sample_gpus: bool = True):
        self.options, self.address = options, address
        self.sample_gpus = sample_gpus              # False on simulated nodes (declared GPUs)
        self.on_node_samples = on_node_samples      # where the node samplers' reports go
        self.samplers: list = []
        self.sampled_at = 0.0
        self.workers: list = []
        self.pg = None
        self.info: list[dict] = []
        self.cells = 0
        self.broken = False

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group

        n, gpus = self.options.workers, self.options.gpus_per_worker
        bundle = {"GPU": gpus} if gpus else {"CPU": 1}
        self.pg = placement_group([dict(bundle) for _ in range(n)], strategy="PACK")
        ready = self.pg.ready()
        done, _ = ray.wait([ready], timeout=READY_TIMEOUT_S)
        if not done:
            have = ray.cluster_resources()
            self.stop()
            what = f"{gpus:g} GPU" if gpus else "1 CPU"
            raise GpugeekError(
                f"{n} workers × {what} do not fit the cluster (it has {have.get('GPU', 0):g} GPUs, "
                f"{have.get('CPU', 0):g} CPUs) — use fewer --workers, or `%gpugeek scale` the cluster")
        try:
            self._start_actors(n, gpus)
        except BaseException as exc:  # a setup timeout, a port taken meanwhile, Ctrl-C: free it all
            self.stop()
            if isinstance(exc, GpugeekError) or not isinstance(exc, Exception):
                raise
            cause = getattr(exc, "cause", None) or exc     # a worker's own error, not Ray's wrapping
            raise GpugeekError(f"the worker group did not start ({type(cause).__name__}: {cause})") from None

    def _start_actors(self, n: int, gpus: float) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = ray.remote(Worker)
        self.workers = [
            actor.options(max_concurrency=2, num_cpus=0 if gpus else 1, num_gpus=gpus or 0,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                              self.pg, placement_group_bundle_index=i)).remote()
            for i in range(n)]
        master, port = ray.get(self.workers[0].node_address.remote())
        self.info = ray.get([w.setup.remote(i, n, master, port, self.options)
                             for i, w in enumerate(self.workers)], timeout=READY_TIMEOUT_S)
        if self.on_node_samples is not None:       # one sampler per node the group runs on
            self.samplers = telemetry.start_samplers(sorted({i["node_id"] for i in self.info}),
                                                     gpus=self.sample_gpus)

    def connected(self) -> bool:
        """Whether this process is still a driver of the group's cluster. Once it is not (the
        cluster was stopped, here or elsewhere), no call may go to Ray: an actor call without a
        connection would quietly start a new local Ray instance."""
        import ray

        # the address we connected with: Ray's own view of it differs (127.0.0.1 becomes this
        # host's IP), so it cannot be compared
        return ray.is_initialized() and connection.connected_address() == self.address

    def stop(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

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
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001
                pass
            self.pg = None

    @property
    def notes(self) -> list[str]:
        return sorted({i["note"] for i in self.info if i.get("note")})

    # -- a cell ---------------------------------------------------------------------------------

    def run(self, source: str, options: RunOptions, *, push: dict | None = None,
            pull: list[str] | None = None, all_ranks: bool = False, on_samples=None) -> Result:
        import ray
        from ray import cloudpickle

        self.cells += 1
        cell_id = self.cells
        filename = f"<cell {cell_id}>"
        pushed = (ray.put(cloudpickle.dumps(push)),) if push else ()
        start = time.perf_counter()
        refs = {w.execute.remote(pickle.dumps((source, filename, pull or [], rank == 0, options, cell_id)),
                                 *pushed): rank
                for rank, w in enumerate(self.workers)}
        asked = self._ask_samplers(SAMPLE_EVERY_S)
        sampled = bool(asked)
        printer = _Printer(all_ranks)
        results: dict[int, dict] = {}
        pending = dict(refs)
        drain_at, drain_gap = start + DRAIN_EVERY_S[0], DRAIN_EVERY_S[0]
        try:
            gathered = self._gather(pending, asked, max(0.0, drain_at - time.perf_counter()))
            if gathered is not None:           # every rank done at once: no loop, no drains
                got, samples = gathered
                asked = {}
                self._record_node_samples(samples)
                pending.clear()
                for rank in sorted(got):
                    self._settle(rank, got[rank], results, printer, pending, on_samples)
            while pending:
                done, _ = ray.wait(list(pending), num_returns=len(pending),
                                   timeout=max(0.0, drain_at - time.perf_counter()))
                for ref in done:
                    rank = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayActorError as exc:
                        self.broken = True
                        raise WorkerDied(rank, type(exc).__name__) from None
                    self._settle(rank, result, results, printer, pending, on_samples)
                if pending and time.perf_counter() >= drain_at:
                    self._drain(printer, all_ranks, pending.values(), on_samples)
                    drain_gap = min(drain_gap * 2, DRAIN_EVERY_S[1])
                    drain_at = time.perf_counter() + drain_gap
        except KeyboardInterrupt:
            self._cancel(pending)
            raise Interrupted(f"interrupted on all {len(self.workers)} workers"
                              + ("; the group is ready for the next cell" if not self.broken
                                 else "; a rank was stuck, so the group was stopped — its variables are gone, "
                                      "the next cell starts a new one")) from None
        finally:
            if pending and not self.broken:   # left the loop another way: nothing may keep running
                self._cancel(pending)
            if asked and self.connected():    # asked with the cell: their reports are not lost
                self._record_node_samples(self._samples_from(asked))
        if not sampled:            # what was sampled since the last drain, if a second ago
            self.drain_telemetry(every=SAMPLE_EVERY_S)
        if any(r.get("interrupted") for r in results.values()):
            raise Interrupted("interrupted")
        first = results[0]
        return Result(value=first.get("value"),
                      pulled=cloudpickle.loads(first["pulled"]) if first.get("pulled") else {},
                      seconds=time.perf_counter() - start)

    def _gather(self, pending: dict, asked: dict, timeout: float):
        """Every rank's result and the samplers' reports in one ``ray.get``, if all are there
        within ``timeout``: ({rank: result}, node samples). None otherwise, or if any call
        failed (a dead actor): the loop then takes them one by one and says which."""
        import ray

        refs = list(pending)
        try:
            values = ray.get(refs + list(asked), timeout=timeout)
        except Exception:  # noqa: BLE001 - a timeout, or an error the loop reports precisely
            return None
        samples = [s for part in values[len(refs):] for s in part]
        return {pending[ref]: value for ref, value in zip(refs, values, strict=False)}, samples

    def _settle(self, rank: int, result: dict, results: dict, printer, pending: dict, on_samples) -> None:
        """One rank's result: its output and reports shown, its error raised (the others stopped)."""
        results[rank] = result
        printer.show(rank, result["output"])
        if on_samples and result["samples"]:
            on_samples(result["samples"])
        if not result["ok"] and not result.get("interrupted"):
            dead = self._cancel(pending)
            if dead is not None:        # the error was a peer dying under this rank
                raise WorkerDied(dead, "its process ended")
            raise RemoteError(rank, result["error"])

    def drain_telemetry(self, every: float = 0.0) -> int:
        """Move the node samplers' reports into the ledger (at most every ``every`` seconds)."""
        asked = self._ask_samplers(every)
        return self._record_node_samples(self._samples_from(asked)) if asked else 0

    def _ask_samplers(self, every: float) -> dict:
        """Ask every sampler for its reports, if the last ask is ``every`` seconds old: {ref: sampler}."""
        now = time.monotonic()
        if not self.samplers or now - self.sampled_at < every or not self.connected():
            return {}
        self.sampled_at = now
        return {s.drain.remote(): s for s in self.samplers}

    def _samples_from(self, asked: dict, timeout: float = 0.5) -> list[dict]:
        """The asked samplers' reports: all in one ``ray.get``, else those that answered within
        ``timeout`` (never stall the run); a sampler whose node is gone is asked no more."""
        import ray

        refs = list(asked)
        try:
            return [s for part in ray.get(refs, timeout=timeout) for s in part]
        except Exception:  # noqa: BLE001 - sorted out one by one below
            pass
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        samples = []
        for ref in ready:
            try:
                samples.extend(ray.get(ref))
            except ray.exceptions.RayActorError:   # its node is gone: stop asking it
                if asked[ref] in self.samplers:
                    self.samplers.remove(asked[ref])
            except Exception:  # noqa: BLE001 - one bad answer costs that sampler's batch only
                pass
        return samples

    def _record_node_samples(self, samples: list[dict]) -> int:
        if samples:
            self.on_node_samples(samples)
        return len(samples)

    def _drain(self, printer, all_ranks: bool, running, on_samples) -> None:
        import ray

        self.drain_telemetry(every=SAMPLE_EVERY_S)

        ranks = sorted(running)     # every rank's reports; output only as the printer shows it
        if not ranks:
            return
        try:
            drained = ray.get([self.workers[r].drain.remote() for r in ranks], timeout=5)
        except Exception:  # noqa: BLE001 - a dying worker shows up through its execute ref
            return
        for rank, part in zip(ranks, drained, strict=True):
            printer.show(rank, part["output"])
            if on_samples and part["samples"]:
                on_samples(part["samples"])

    def _cancel(self, pending: dict, everyone: bool = False) -> int | None:
        """Interrupt the ranks still running; a rank stuck in a collective breaks the group.
        Returns the rank of a worker found dead, if any."""
        import ray

        if not pending:
            return None
        cell_id = self.cells
        for rank in pending.values():
            self.workers[rank].interrupt.remote(cell_id)
        done, stuck = ray.wait(list(pending), num_returns=len(pending), timeout=CANCEL_WAIT_S)
        if stuck:   # blocked in a collective: only stopping the workers frees them (and their GPUs)
            self.broken = True
            self.stop()
            pending.clear()
            return None
        dead = None
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                self.broken = True
                dead = pending[ref]
            except Exception:  # noqa: BLE001
                self.broken = True
        return dead


class _Printer:
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
