"""What the ledger's rows cost, as tables: by node, node type, pricing or job, and over time.

Jobs share a cluster's burn while they run (``split_among_jobs``), so the jobs never add up to more
than the cluster. The sums themselves are ``ledger``'s SQL; this module only lays them out, and
loads pandas when a table is asked for: the watchdogs and the server's metrics need none.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from itertools import pairwise
from typing import TYPE_CHECKING

from .. import store
from ..vocab import CostGrouping
from .ledger import node_hours, node_usd

if TYPE_CHECKING:
    import pandas as pd


def split_among_jobs(spans: list[tuple[float, float]], nodes: Iterable[tuple[float, float, float]]) -> list[float]:
    """Each job's $: jobs share the cluster's burn while they run — at each instant the $/h of the
    nodes alive is split evenly among the jobs running, so the jobs never add up to more than the
    cluster cost. ``spans``: (start, end) per job; ``nodes``: (start, end, $/h) per node."""
    nodes = list(nodes)
    cuts = sorted({t for span in spans for t in span} | {n[0] for n in nodes} | {n[1] for n in nodes})
    usd = [0.0] * len(spans)
    for a, b in pairwise(cuts):
        mid = (a + b) / 2
        running = [i for i, (j0, j1) in enumerate(spans) if j0 <= mid < j1]
        if not running:
            continue
        burn = sum(rate for n0, n1, rate in nodes if n0 <= mid < n1)
        for i in running:
            usd[i] += burn * (b - a) / 3600.0 / len(running)
    return usd


def running_jobs_spend(cluster_ids: list[int], now: float) -> list[dict]:
    """Every running job of these clusters with its $ so far (``split_among_jobs``), in SQL and
    plain Python: the metrics endpoint asks at every scrape."""
    out = []
    for cluster_id in cluster_ids:
        running = [dict(r) for r in store.query(
            "SELECT * FROM jobs WHERE cluster_id=? AND ended IS NULL", (cluster_id,))]
        if not running:
            continue
        first = min(j["started"] for j in running)
        overlapping = running + [dict(r) for r in store.query(
            "SELECT * FROM jobs WHERE cluster_id=? AND ended IS NOT NULL AND ended>?", (cluster_id, first))]
        nodes = [(r[0], r[1] if r[1] is not None else now, r[2]) for r in store.query(
            "SELECT started, ended, usd_per_hour FROM nodes WHERE cluster_id=?", (cluster_id,))]
        usd = split_among_jobs([(j["started"], j["ended"] or now) for j in overlapping], nodes)
        out += [{**job, "usd": u} for job, u in zip(running, usd, strict=False)]   # running come first
    return out


def nodes_frame(cluster_id: int, now: float | None = None) -> pd.DataFrame:
    """One row per node: lifetime (open nodes run to ``now``), hours, $ and what spot saved."""
    import pandas as pd

    now = time.time() if now is None else now
    rows = [dict(r) for r in store.query(
        f"SELECT *, {node_hours()} AS hours, {node_usd()} AS usd FROM nodes WHERE cluster_id=?"
        " ORDER BY started, node_id", (now, now, cluster_id))]
    frame = pd.DataFrame(rows, columns=[
        "cluster_id", "node_id", "node_type", "offer_id", "pricing", "usd_per_hour",
        "on_demand_usd_per_hour", "gpus", "started", "ended", "end_reason", "hours", "usd"])
    frame["alive"] = frame["ended"].isna()
    frame["hours"] = frame["hours"].astype(float)
    frame["usd"] = frame["usd"].astype(float)
    on_demand = frame["on_demand_usd_per_hour"].astype(float).fillna(frame["usd_per_hour"].astype(float))
    frame["on_demand_usd"] = frame["hours"] * on_demand
    frame["spot_saved_usd"] = (frame["on_demand_usd"] - frame["usd"]).where(frame["pricing"] == "spot", 0.0)
    return frame


_CURVE = f"""
SELECT g.value AS time, n.node_type, n.pricing,
       SUM({node_usd(":now", "n.", "g.value")}) AS usd,
       SUM({node_usd(":now", "n.", "g.value", "COALESCE(n.on_demand_usd_per_hour, n.usd_per_hour)")}) AS on_demand_usd
FROM json_each(:times) AS g JOIN nodes AS n ON n.cluster_id = :cluster
GROUP BY n.node_type, n.pricing, g.key ORDER BY n.node_type, n.pricing, g.key"""


def spend_by(cluster_id: int, times: Iterable[float], now: float) -> list:
    """Rows (time, node_type, pricing, usd, on_demand_usd): the dollars spent by each of ``times``,
    by node type and pricing — ``ledger.spend``'s formula at earlier moments; at ``now`` they add up to it."""
    return store.query(_CURVE, {"now": now, "cluster": cluster_id, "times": json.dumps([float(t) for t in times])})


def spend_curve(nodes: pd.DataFrame, now: float, points: int = 200) -> pd.DataFrame:
    """Dollars spent by each moment of a time grid (``points`` from the first node's start to
    ``now``, plus every start and end), by node type and pricing: ``ledger.spend``'s own SQL at
    earlier moments, and what the same hours cost at on-demand prices (the gap is the spot
    saving). Its last point is ``ledger.spend``. ``nodes``: the cluster's ``nodes_frame``.

    Columns: time, node_type, pricing, label, usd, on_demand_usd.
    """
    import numpy as np
    import pandas as pd

    columns = ["time", "node_type", "pricing", "label", "usd", "on_demand_usd"]
    if nodes.empty:
        return pd.DataFrame(columns=columns)
    start = nodes["started"].astype(float).to_numpy()
    end = nodes["ended"].fillna(now).astype(float).to_numpy()
    grid = np.unique(np.concatenate([np.linspace(start.min(), max(end.max(), start.min() + 1), points), start, end]))
    curve = pd.DataFrame([dict(r) for r in spend_by(int(nodes["cluster_id"].iloc[0]), grid.tolist(), now)])
    return curve.assign(time=pd.to_datetime(curve["time"], unit="s"),
                        label=curve["node_type"] + " · " + curve["pricing"])[columns]


def cost_table(cluster_id: int, by: str = "node", now: float | None = None) -> pd.DataFrame:
    """Dollars grouped ``by`` node, node_type, pricing or job."""
    import pandas as pd

    by = CostGrouping.parse(by, "--by")
    nodes = nodes_frame(cluster_id, now)
    if by == "node":
        return nodes[["node_id", "node_type", "offer_id", "pricing", "usd_per_hour", "started",
                      "ended", "hours", "usd", "spot_saved_usd", "end_reason"]].assign(
            started=lambda f: pd.to_datetime(f["started"], unit="s"),
            ended=lambda f: pd.to_datetime(f["ended"], unit="s"),
        ).reset_index(drop=True)
    if by in ("pricing", "node_type"):
        grouped = nodes.groupby(by, as_index=False).agg(
            nodes=("node_id", "count"), hours=("hours", "sum"), usd=("usd", "sum"),
            on_demand_usd=("on_demand_usd", "sum"), spot_saved_usd=("spot_saved_usd", "sum"))
        return grouped.sort_values("usd", ascending=False).reset_index(drop=True)
    return _by_job(cluster_id, nodes, now)


def _by_job(cluster_id: int, nodes: pd.DataFrame, now: float | None) -> pd.DataFrame:
    import pandas as pd

    now = time.time() if now is None else now
    jobs = [dict(r) for r in store.query(
        "SELECT * FROM jobs WHERE cluster_id=? ORDER BY started", (cluster_id,))]
    spans = [(j["started"], j["ended"] or now) for j in jobs]
    usd = split_among_jobs(spans, zip(nodes["started"].astype(float), nodes["ended"].fillna(now).astype(float),
                                      nodes["usd_per_hour"].astype(float), strict=True))
    out = [{"job_id": j["job_id"], "name": j["name"], "status": j["status"], "workers": j.get("workers"),
            "nodes": j.get("nodes"), "hours": (j1 - j0) / 3600.0, "usd": u}
           for j, (j0, j1), u in zip(jobs, spans, usd, strict=True)]
    return pd.DataFrame(out, columns=["job_id", "name", "status", "workers", "nodes", "hours", "usd"])
