"""The cluster's jobs, whoever started them: ``jobs`` lists them from the cluster itself (each
worker group's rank 0 keeps its last cells' journals), and ``attach`` shows one — its output from
the start (or from the journal's bound), live while it runs — and returns its pulled variables
once it ends. A kernel that died, or another one, finds its work this way."""

from __future__ import annotations

import time

from ..cluster import registry
from ..errors import GpugeekError
from ..group.results import Interrupted, Printer, RemoteError, Result
from ..kernel import connection, session
from ..line.wire import LinkDown
from ..meter import costs, ledger
from . import away
from . import jobs as running
from .driving import driver
from .watch import Watcher

READ_WAIT_S = 2.0     # rank 0 holds a read of a running job's journal this long for news


def jobs(name: str | None = None) -> list[dict]:
    """The cluster's jobs, newest first: job id, name, state (running, finished, failed,
    interrupted), step, when it began and ended, and whose kernel started it (host:pid)."""
    record = session.live_cluster(name)
    connection.connect(record)
    rows = [{**job, "group": group_id} for group_id, job in driver().kept_jobs()]
    _settle_ledger(record.id, rows)
    usd = {row["job_id"]: row["usd"] for row in costs.cost_table(record.id, by="job").to_dict("records")}
    for row in rows:
        row["usd"] = usd.get(row.get("id"))     # None: a job this machine's ledger never saw
    return sorted(rows, key=lambda r: r.get("began") or 0, reverse=True)


def _settle_ledger(cluster_id: int, rows: list[dict]) -> None:
    """A job the ledger here still calls running (its kernel died before it could say) that the
    cluster says has ended: ended in the ledger too, at the cluster's moment — its $ and the
    idle clock then stop there."""
    for row in rows:
        if row.get("id") and row["state"] != "running" and ledger.job_status(cluster_id, row["id"]) == "running":
            ledger.job_ended(cluster_id, row["id"], row["state"], at=row.get("ended"))


def attach(job: str, name: str | None = None, *, watch=None, adopt: bool = False) -> Result:
    """Show job ``job``'s output (its id, or its name: the newest of that name) from its start
    (or from the journal's bound), follow it while it runs, and return its ``Result`` (value,
    pulled variables) once it ends. ``adopt``: this kernel then takes the job's group over
    (``jobs.adopt``), whether the job succeeded or failed. ``watch`` makes what watches it, as
    for ``run`` (the notebook's job monitor, the whole curve)."""
    record = session.live_cluster(name)
    connection.connect(record)
    cluster = driver()
    group_id, job = _find(cluster, job, record.name)
    job_id = job["id"]
    if adopt:       # refused before the output, not after, when its kernel still runs here
        running.check_adoptable(group_id, (cluster.lead_state(group_id) or {}).get("owner"))
    watcher = Watcher(watch(cluster_id=record.id, job_id=job_id, name=job.get("name") or job_id,
                            workers=len(cluster.groups().get(group_id, [])), simulated=record.simulated)
                      if watch else None)
    status = "failed"
    try:
        result = _follow(cluster, record, group_id, job, watcher.update)
        status = "finished"
    except KeyboardInterrupt:
        status = "interrupted"
        cluster.interrupt_job(group_id, job["cell"])
        raise Interrupted(f"job {job_id!r} interrupted on every worker — run a cell to go on") from None
    except RemoteError:
        if adopt:
            _adopt(group_id, job_id)
        raise
    finally:
        watcher.finish(status)
    if adopt:
        _adopt(group_id, job_id)
    return result


def _find(cluster, wanted: str, name: str) -> tuple[str, dict]:
    """The job whose id is ``wanted``, else the newest whose name is (said when there are more):
    (its group, the job as rank 0 keeps it)."""
    found = [kept for kept in cluster.kept_jobs() if wanted in (kept[1].get("id"), kept[1].get("name"))]
    by_id = [f for f in found if f[1].get("id") == wanted]
    if by_id:
        return by_id[0]
    if not found:
        raise GpugeekError(f"no job {wanted!r} on {name!r} — `%gpugeek jobs` lists the ones its worker groups "
                           f"keep (the last few cells of each), by name and id")
    found.sort(key=lambda f: f[1].get("began") or 0)
    if len(found) > 1:
        print(f"note: {len(found)} jobs are named {wanted!r}: following the newest, {found[-1][1]['id']} "
              f"(the others: {', '.join(f[1]['id'] for f in found[:-1])})", flush=True)
    return found[-1]


def _adopt(group_id: str, job_id: str) -> None:
    running.adopt(group_id)
    print(f"note: this kernel's cells now run on job {job_id!r}'s worker group, with its variables", flush=True)


def _follow(cluster, record, group_id: str, job: dict, on_samples) -> Result:
    """The job's journal read from the start, a read at a time, until its outcome; a link that
    goes down meanwhile is ridden out (the job goes on there)."""
    began = time.perf_counter()
    printer, cursor = Printer(all_ranks=False), 0
    while True:
        try:
            drained = cluster.journal(group_id, job["cell"], cursor, READ_WAIT_S)
        except (LinkDown, *away.link_errors()):
            if not registry.get(record.id).live:
                raise GpugeekError(away.lost(record, job["id"])) from None
            time.sleep(away.REJOIN_EVERY_S)
            if connection.line() is None:
                connection.rejoin(record)
                cluster = driver()
            continue
        if drained is None:
            raise GpugeekError(f"job {job['id']!r}'s output is no longer kept on the cluster — `%gpugeek fetch` gets "
                               "the files it wrote")
        if drained["dropped"]:
            print(f"[{drained['dropped']} earlier drains were dropped: the journal keeps the latest output]")
        printer.show_ranks(drained["ranks"], on_samples)
        cursor = drained["next"]
        if drained["outcome"] is not None:
            return _result(drained["outcome"], printer, on_samples, time.perf_counter() - began)


def _result(outcome: dict, printer: Printer, on_samples, seconds: float) -> Result:
    """The ended job's outcome as ``run`` gives it back (the ranks' last output and reports shown):
    its failure raised, else its value and pulls."""
    results = outcome["results"]
    printer.show_ranks(results, on_samples)
    failed = outcome.get("failed")
    if failed is not None:
        raise RemoteError(failed, results[failed]["error"], memory=results[failed].get("memory"))
    if outcome.get("dead") is not None:
        raise GpugeekError(f"the job's rank {outcome['dead']} died before it ended — `%gpugeek doctor` checks its "
                           "node; run the cell again")
    return Result.of(results.get(0, {}), seconds)
