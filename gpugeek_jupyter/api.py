"""The Python API. The ``%gpugeek`` magics and the widgets call exactly these functions."""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from . import display
from .backends import readiness
from .backends.interface import BACKENDS, Feature, LaunchConfig
from .backends.interface import REHEARSE as REHEARSE  # the picker's: an offer rehearsed here
from .backends.readiness import Check
from .catalog import fresh
from .catalog.fresh import UpdateResult
from .catalog.offers import find_offers
from .cells.watch import JobWatch
from .cluster import registry
from .guard.lifecycle import catch_up, counted_until, sync_ledger
from .health.checkup import doctor
from .health.findings import DoctorReport
from .kernel.session import READINGS, any_cluster, current, fine, trouble, troubles_to_say
from .meter import costs, ledger
from .meter.telemetry import node_samples_frame
from .provision.actions import Cluster, down, limits, preempt, scale
from .provision.renting import RENT_THERE as RENT_THERE  # the picker's: an offer up cannot rent
from .provision.renting import YOUR_IMAGE as YOUR_IMAGE  # … and one it can where you name a machine image
from .provision.renting import mark
from .provision.renting import way_in as way_in
from .provision.status import ClusterStatus, clusters, status
from .provision.up import up as _provision
from .sizing import planner
from .sizing.advise import Advice, advise_job
from .sizing.planner import Plan
from .views.cost import budget_figure, cost_figure
from .views.pricing import price_performance
from .views.utilisation import idle_dollars, utilisation_heatmap
from .vocab import CostGrouping

__all__ = [
    "Advice", "Check", "Cluster", "ClusterStatus", "CostReport", "DoctorReport", "LaunchConfig", "Plan", "advise",
    "attach", "backend_features", "check", "clusters", "cost", "doctor", "down", "jobs", "limits", "log", "offers",
    "plan", "preempt",
    "price_performance",
    "reset", "run", "scale", "status", "up", "update_catalog",
]


@functools.wraps(find_offers)
def offers(*args, **kwargs) -> pd.DataFrame:
    return mark(find_offers(*args, **kwargs))


def backend_features() -> pd.DataFrame:
    """What each backend (``up --backend``) can do: for each feature not every one has, "yes", or
    why not and what to do instead (what ``up`` and the other commands answer when asked)."""
    return pd.DataFrame.from_dict(
        {name: {feature.value: impl.cannot.get(feature, "yes") for feature in Feature}
         for name, impl in BACKENDS.items()}, orient="index").rename_axis("backend")


def check(ways: str | list[str] | None = None, *, region: str | None = None, login: str | None = None,
          ssh_key: str | None = None, hosts: str | None = None) -> Check:
    """Whether each way to get machines is ready (``Check``: a line each, ``.ready``), found without
    launching anything: ``ways`` the backends to look at (default: each with something to look at);
    ``region`` a cloud's, ``login`` a Slurm login node, ``hosts`` your machines, ``ssh_key`` their key."""
    return readiness.check(BACKENDS, ways, region=region, login=login, ssh_key=ssh_key, hosts=hosts)


@functools.wraps(_provision)
def up(name: str | None = None, **flags):
    cluster = _provision(name, **flags)
    if flags.get("workers") and isinstance(cluster, Cluster):    # a warm group, started while `up` returns
        from .cells import jobs

        jobs.warm_start(cluster.record, flags["workers"])
    return cluster


def plan(*args, **kwargs) -> Plan:
    """Size a training run and pick the cheapest offer that fits (see ``sizing.planner.plan``)."""
    made = planner.plan(*args, **kwargs)
    current().last_plan = made
    return made


plan.__doc__, plan.__signature__ = planner.plan.__doc__, planner.plan.__signature__


def run(source: str, *, workers: int = 2, gpus_per_worker: float | None = None, amp: str = "off",
        grad_ckpt: str | bool = False, accumulate: int = 1, clip: float | None = None,
        strategy: str = "ddp", checkpoint_every: int | None = None, checkpoint_dir: str | None = None,
        max_failures: int = 0, push: dict | None = None, pull: list[str] | None = None,
        all_ranks: bool = False, name: str | None = None, monitor: bool = True,
        collective_timeout: float | None = None):
    """Run ``source`` on every worker of the warm group of the active cluster.

    Returns a ``Result``: ``.value`` (rank 0's last expression), ``.pulled`` (``pull`` names
    from rank 0), ``.seconds``. The group persists between calls with the same options.
    In a notebook a live job monitor shows progress, loss, throughput and $ (``monitor=False``
    hides it) and leaves a static figure of the job when it ends.
    """
    from .cells import jobs  # torch and Ray load with the first job

    return jobs.run(source, workers=workers, gpus_per_worker=gpus_per_worker, amp=amp,
                    grad_ckpt=grad_ckpt, accumulate=accumulate, clip=clip, strategy=strategy,
                    checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir,
                    collective_timeout=collective_timeout, max_failures=max_failures, push=push, pull=pull,
                    all_ranks=all_ranks, name=name,
                    plan=current().last_plan,
                    watch=display.view_maker(JobWatch) if monitor else None)


def torchrun(script: str, *args: str, name: str | None = None, monitor: bool = True, **flags):
    """Run an existing ``torchrun``-style script (``train.py``) on the warm group as one job: every
    worker runs it as a rank, with ``sys.argv = [script, *args]`` and the variables ``torchrun``
    sets, as ``torchrun --nproc-per-node … train.py ARGS`` would. ``flags`` are ``run``'s. As under
    torchrun, the script's folder is first on ``sys.path`` (on a remote cluster the modules beside
    it that it imports go with it) and it runs in the caller's folder: on a cluster on this
    machine, the notebook's; elsewhere the job's own on the nodes, where the files it opens must
    be (``up --working-dir``) and from which ``fetch`` brings back what it wrote."""
    from pathlib import Path

    from .cells import jobs
    from .errors import GpugeekError

    path = Path(script).expanduser()
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not text"
        raise GpugeekError(f"torchrun {script}: cannot read it ({why}) — give the path of a Python script") from None
    return jobs.run(source, argv=(script, *args), script_dir=str(path.resolve().parent), name=name or path.name,
                    plan=current().last_plan,
                    watch=display.view_maker(JobWatch) if monitor else None, **flags)


def fetch(path: str, *, rank: int | None = None, all_ranks: bool = False, to: str | None = None,
          overwrite: bool = False):
    """Bring a file or folder a job wrote on the cluster's nodes (``path``: relative to the job's
    folder there, or absolute) back beside the notebook: from rank 0's node, rank ``rank``'s, or
    every rank's into ``rank-N/`` folders. Says its size and progress; returns where it landed.
    Nothing is written under its name until the whole of it came."""
    from .cells import fetching

    return fetching.fetch(path, rank=rank, all_ranks=all_ranks, to=to, overwrite=overwrite)


def jobs(name: str | None = None):
    """The cluster's jobs, from the cluster itself (each worker group keeps its last cells):
    running or ended, their step, $ (this machine's ledger, where it ran them) and whose kernel
    started each — a kernel that died included."""
    import pandas as pd

    from .cells import attach

    rows = attach.jobs(name)
    columns = ["name", "id", "state", "step", "usd", "kernel", "began", "ended"]
    frame = pd.DataFrame(rows, columns=columns).rename(columns={"id": "job"})
    for column in ("began", "ended"):
        frame[column] = pd.to_datetime(frame[column], unit="s")
    return frame


def attach(job: str, name: str | None = None, *, adopt: bool = False, monitor: bool = True):
    """Follow job ``job`` (a name or an id from ``jobs``: a name several jobs had means the newest,
    and says so) from this kernel: its output from the start, live
    while it runs; returns its ``Result`` (value, pulled variables) once it ends. ``adopt``: then
    this kernel's cells run on the job's warm worker group, its variables with it (the kernel that
    started it must be gone). In a notebook the job monitor shows it as ``run`` does, its whole
    curve from the start (``monitor=False`` hides it)."""
    from .cells import attach as attaching

    return attaching.attach(job, name, adopt=adopt, watch=display.view_maker(JobWatch) if monitor else None)


def reset() -> bool:
    """Stop the worker group; the next ``run`` builds a fresh one."""
    if current().group is None and "gpugeek_jupyter.group.placement" not in sys.modules:
        return False     # no group was ever built here (and none of its placement groups is held)
    from .cells import jobs

    return jobs.reset()


def drain_telemetry() -> int:
    """The node samplers' latest reports into the ledger (after every cell: never an error in
    it — a failure is counted, and said at the next command). Only a kernel that has run a job
    has samplers, so the others never load torch for this."""
    if current().group is None:
        return 0
    from .cells import jobs

    try:
        drained = jobs.drain_telemetry()
    except Exception as exc:  # noqa: BLE001 - counted and said (`troubles_to_say`), never the cell's error
        trouble(READINGS, exc)
        return 0
    fine(READINGS)
    return drained


@dataclass
class CostReport:
    """What a cluster has cost, from the ledger: a table ``by`` node/job/pricing, cumulative $,
    spend projected against the budget, and GPU utilisation with the idle $."""

    name: str
    by: str
    table: pd.DataFrame
    figure: go.Figure
    total_usd: float
    spot_saved_usd: float
    simulated: bool
    budget_usd: float | None = None
    budget_figure: go.Figure | None = None
    utilisation_figure: go.Figure | None = None
    idle: pd.DataFrame | None = None
    live: bool = False

    @property
    def idle_usd(self) -> float | None:
        """$ paid for GPUs below 30 % utilisation (None: no GPU telemetry to say)."""
        return float(self.idle["idle_usd"].sum()) if self.idle is not None and len(self.idle) else None

    def summary(self) -> str:
        what = "simulated — what these offers would have cost" if self.simulated else "from the ledger"
        saved = f"; spot saved ${self.spot_saved_usd:,.2f} against on-demand" if self.spot_saved_usd > 0 else ""
        budget = (f"; budget ${self.budget_usd:,.2f} ({self.total_usd / self.budget_usd:.0%} used)"
                  if self.budget_usd else "")
        idle = f"; idle GPUs cost ${self.idle_usd:,.2f}" if self.idle_usd is not None else ""
        return f"{self.name}: ${self.total_usd:,.2f} ({what}){saved}{budget}{idle}"

    def __repr__(self) -> str:
        return f"{self.summary()}\n{display.in_words(self.table).to_string(index=False)}"

    def _repr_html_(self) -> str:
        import html

        shown = [f for f in (self.figure, self.budget_figure, self.utilisation_figure) if f is not None]
        figures = "".join(f.to_html(full_html=False, include_plotlyjs="cdn" if i == 0 else False)
                          for i, f in enumerate(shown))     # plotly.js loaded once
        return (f"<div><b>{html.escape(self.summary())}</b></div>"
                f"{display.in_words(self.table).to_html(index=False)}{figures}")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """The live dashboard in a notebook; HTML and text wherever widgets cannot show."""
        return display.bundle(self, repr(self), self._repr_html_())


def advise(job: str | None = None, cluster: str | None = None, *, gpu: str | None = None,
           usd_per_gpu_hour: float | None = None, pricing: str | None = None, catalog: str | None = None,
           residency: str | None = None) -> Advice:
    """Right-size a job from its telemetry: the cheaper offers that hold its measured memory and
    keep up with its measured GPU work (``job``: name or id, default the cluster's last).
    Estimates; with no GPU telemetry it says so and advises nothing."""
    record = any_cluster(cluster)
    return advise_job(record.id, job, gpu=gpu, usd_per_gpu_hour=usd_per_gpu_hour, pricing=pricing,
                      catalog=catalog, residency=residency)


def update_catalog(source: str | None = None, providers: str | list[str] | None = None) -> UpdateResult:
    """Fetch SkyPilot's hosted v7 catalogs (or ``source``: a base URL or a folder), convert them as
    the bundled catalog was made and keep them in ``$GPUGEEK_HOME``; a failure keeps the last good
    catalog and says so in one line."""
    return fresh.update(source, providers)


def news() -> list[str]:
    """Watchdog events on the active cluster no notebook has shown yet, as lines to print."""
    said = troubles_to_say()      # this kernel's own background reads and writes that keep failing
    name = current().active
    record = (registry.live(name) or registry.latest(name)) if name else None
    if record is None:
        return said
    return said + [f"gpugeek: {record.name}: {e['message']}" for e in ledger.take_unshown_events(record.id)]


def log(name: str | None = None, since: str | float | None = None) -> pd.DataFrame:
    """The audit log, oldest first: every action on every cluster (or on clusters named ``name``)
    — who (OS user and process), from where (host), what (its exact options) and the cluster's $
    at that moment. ``since``: seconds, or a span like ``"2h"``."""
    from .guard import board
    from .units import parse_duration

    if since is not None:
        since = time.time() - (parse_duration(since, "--since") if isinstance(since, str) else float(since))
    if name is not None:
        board.every_run(name)          # says so if there is no such cluster
    rows = board.events(name, since)
    frame = pd.DataFrame(rows, columns=["at", "cluster", "cluster_id", "kind", "message", "user", "client", "host",
                                        "options", "usd"])
    frame["at"] = pd.to_datetime(frame["at"], unit="s", utc=True).dt.tz_convert(None)
    frame["options"] = [json.loads(o) if isinstance(o, str) else {} for o in frame["options"]]
    return frame


def cost(name: str | None = None, by: str = "node", *, sync: bool = True) -> CostReport:
    """Dollars a cluster has cost so far (live or stopped), grouped ``by`` node, node_type,
    pricing or job. ``sync=False`` reads the ledger only (no call into Ray: the dashboards'
    background refresh)."""
    by = CostGrouping.parse(by, "--by").value
    record = any_cluster(name)
    if sync:
        record = catch_up(record)       # a remote head whose watchdog here is gone: its word first
        sync_ledger(record)
        if record.live:
            drain_telemetry()
        record = registry.get(record.id)      # as the sync left it (the head's word, a stop it made)
    now = counted_until(record, time.time())
    table = costs.cost_table(record.id, by, now)
    nodes = costs.nodes_frame(record.id, now)
    samples = node_samples_frame(record.id, metrics=("gpu_util", "cpu_percent"))
    idle = idle_dollars(samples, nodes, now=now)
    curve = costs.spend_curve(nodes, now)
    return CostReport(
        name=record.name, by=by, table=table,
        figure=cost_figure(nodes, curve, title=f"{record.name}: cumulative cost by node type and pricing",
                           simulated=record.simulated),
        total_usd=float(nodes["usd"].sum()), spot_saved_usd=float(nodes["spot_saved_usd"].sum()),
        simulated=record.simulated, budget_usd=record.budget_usd,
        budget_figure=budget_figure(nodes, curve, now, record.budget_usd, title=f"{record.name}: spend and budget",
                                    simulated=record.simulated),
        utilisation_figure=utilisation_heatmap(samples, nodes, now=now, simulated=record.simulated, idle=idle),
        idle=idle, live=record.live,
    )
