"""A cell whose cluster went out of reach: the job goes on there, and the cell picks up when the
cluster answers again (the workers are detached, and rank 0 keeps the cell's journal). A cell
that lost its cluster for good says so in one line (``lost``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..backends.interface import capable
from ..cluster import registry
from ..cluster.registry import ClusterRecord
from ..config import settings
from ..errors import GpugeekError
from ..group.link import StoppedElsewhere
from ..group.results import Interrupted, RemoteError, WorkerDied
from ..kernel import connection
from ..meter import ledger
from ..remote.headguard import guarded
from ..workers import progress

REJOIN_EVERY_S = 5.0     # a cell whose cluster is out of reach asks it again this often
DRAIN_WAIT_S = 2.0       # how long rank 0 holds a read of the journal for news


def link_errors() -> tuple:
    """What a Ray Client raises once its link to the cluster is gone."""
    import grpc

    return ConnectionError, grpc.RpcError


class KernelLink:
    """This kernel's connection, as its local worker group asks it (``group/link.Link``): a stop
    begun elsewhere (the watcher's), and a Ray Client's link that went down under a cell, ridden
    out here. ``rejoin`` connects this kernel again (``connection.rejoin``)."""

    def __init__(self, rejoin: Callable[[], None] | None = None):
        self.rejoin = rejoin

    def connected_address(self) -> str | None:
        return connection.connected_address()

    def check_stop(self) -> None:
        connection.check_stop()

    def lost(self, group, exc: BaseException) -> bool:
        return self.rejoin is not None and link_lost(group, exc)

    def ride_out(self, group, cell_id: int, printer, on_samples) -> dict:
        return ride_out(group, cell_id, printer, on_samples, self.rejoin)


def link_lost(group, exc: BaseException) -> bool:
    """Whether ``exc``, raised under a running cell, is the link to a remote cluster going down
    (rather than the cell's, ours, or a stop): the group's kernel is a Ray Client, and the error
    is a link's, or the client is no longer steady."""
    if not group.client or isinstance(exc, (GpugeekError, RemoteError, WorkerDied)):
        return False
    return isinstance(exc, link_errors()) or not connection.steady()


def ride_out(group, cell_id: int, printer, on_samples, rejoin: Callable[[], None]) -> dict:
    """The link to the cluster went down under a running cell: the job goes on there (its
    workers are detached, rank 0 keeps its journal). Said once; then this kernel connects
    again every ``REJOIN_EVERY_S``, finds its workers by name, reads the journal from where
    it was, and returns the cell's outcome once it ended. The stop button still stops it."""
    import ray

    step = group.last_step
    print(f"\nthe cluster is out of reach; the job goes on there{f' (step {step})' if step is not None else ''}"
          " — this cell picks up when it answers", flush=True)
    gone_at = time.monotonic()
    give_up = settings().unreachable_after_s
    while True:
        if time.monotonic() - gone_at > give_up:
            job = group.job or {}
            raise GpugeekError(f"the cluster has not answered for {give_up / 60:.0f} min "
                               f"({getattr(group, 'last_trouble', 'no answer')}) — the job may go on there: "
                               f"`%gpugeek attach {job.get('id', 'JOB')}` follows it once the cluster answers")
        try:
            connection.check_stop()
            rejoin()
            if not group.refind():
                raise WorkerDied(0, "its workers were gone when the cluster answered again")
            drained = ray.get(group.workers[0].journal.remote(cell_id, group.cursor, DRAIN_WAIT_S),
                              timeout=DRAIN_WAIT_S + progress.ANSWER_WITHIN_S)
            gone_at = time.monotonic()
            if drained is None:
                raise WorkerDied(0, "rank 0 no longer keeps this cell's journal")
            group.show(drained, printer, on_samples)
            if drained["outcome"] is not None:
                return drained["outcome"]
            continue
        except KeyboardInterrupt:
            if group.connected() and group.workers:
                for worker in group.workers:
                    worker.interrupt.remote(cell_id)
            raise Interrupted(f"interrupted on all {len(group.workers)} workers — run the next cell") from None
        except (WorkerDied, StoppedElsewhere):
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - out of reach: the tunnel, the client, the head
            group.last_trouble = f"{type(exc).__name__}: {exc}"    # asked again; named if it never answers
        time.sleep(REJOIN_EVERY_S)     # the link is down: nothing to poll but the link itself


def lost(record: ClusterRecord, job_id: str) -> str:
    """One line for a cell that lost its cluster: stopped (and why), or out of reach from here —
    a remote head whose link went down (a Ray Client gives up after 30 s), which this machine
    cannot tell from a stopped one, and which may still bill."""
    now = registry.get(record.id)
    if now.stopped or now.stopping or not capable(now).tunnelled:
        return _stopped_under(now, job_id)
    guards = ("its budget cap and idle stop run on its head" if guarded(now)
              else "it may still be running and billing")
    return (f"cluster {record.name!r} does not answer from here (the link to its head is down) — its job may go on "
            f"there (`%gpugeek jobs {record.name}` once the network is back); {guards}")


def _stopped_under(record: ClusterRecord, job_id: str) -> str:
    """One line for a cell whose cluster was stopped while it ran, saying why."""
    said = [e["message"].split(" — ")[0] for e in ledger.events(record.id) if e["kind"] in ("idle-stop", "budget-stop")]
    status = ledger.job_status(record.id, job_id) or ""
    why = said[-1] if said else status.removeprefix("stopped: ") if status.startswith("stopped: ") else "elsewhere"
    return f"cluster {record.name!r} was stopped while the cell ran ({why}) — its workers and their variables are gone"
