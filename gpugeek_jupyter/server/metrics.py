"""``GET /gpugeek/metrics``: the ledger in Prometheus' text format, for the monitoring a team has.

Ray exports a cluster's own metrics but knows no dollars; these are the dollars, the jobs and the
nodes' telemetry, read from the same registry and ledger as the sidebar at each scrape (one
collector, written by ``prometheus_client``, never by hand). Labels are bounded: cluster, backend,
state, node type, pricing, job, and for telemetry a live node (its last 6 hex digits) and device —
only live clusters, running jobs and nodes sampled in the last minute appear.
"""

from __future__ import annotations

import json
import socket
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .. import store
from ..guard import board
from ..meter import costs
from ..vocab import ClusterPhase

RECENT_S = 60.0       # telemetry older than this is not a node's current reading
LATEST_S = 3.0        # a drain's readings of all nodes lie within this of its newest


class LedgerCollector:
    """One scrape: every live cluster, its running jobs and its nodes' latest readings."""

    def collect(self):
        now = time.time()
        board.catch_up(wait=False)
        live = [c for c in board.overview(now)["clusters"] if c["live"]]
        yield from _clusters(live, now)
        ids = {c["id"]: c for c in live}
        yield from _jobs(ids, now)
        yield from _nodes(ids, now)


def _gauges(prefix: str, labels: list[str], described) -> list[GaugeMetricFamily]:
    """A gauge family for each (name, help) of ``described``."""
    return [GaugeMetricFamily(f"{prefix}_{name}", said, labels=labels) for name, said in described]


def _clusters(live: list[dict], now: float):
    labels = ["cluster", "backend"]
    spent = CounterMetricFamily("gpugeek_cluster_spent_usd", "Dollars the cluster has cost so far (the ledger's; "
                                "simulated clusters' dollars are simulated)", labels=labels)
    rate, budget, used, nodes, gpus, simulated = _gauges("gpugeek_cluster", labels, (
        ("usd_per_hour", "What the cluster's live nodes cost per hour"),
        ("budget_usd", "The cluster's budget cap (absent: none)"),
        ("budget_used_ratio", "Dollars spent over the budget cap"),
        ("nodes", "Live nodes"),
        ("gpus", "GPUs of the live nodes (declared, on simulated clusters)"),
        ("simulated", "1 when the cluster and its dollars are simulated")))
    state = GaugeMetricFamily("gpugeek_cluster_state", "1 for the cluster's state", labels=[*labels, "state"])
    failing = GaugeMetricFamily("gpugeek_guard_failing", "Looks in a row the cluster's watchdog has failed, once "
                                "there are 3 or more (0: it sees the cluster)", labels=labels)
    guard = GaugeMetricFamily("gpugeek_guard_heard_age_seconds", "Who enforces the cluster's budget and idle stop "
                              "(by: head, here or none; its pid and host), and how long ago it was last heard from",
                              labels=[*labels, "by", "pid", "host"])
    for c in live:
        key = [c["name"], c["backend"]]
        spent.add_metric(key, c["spent_usd"])
        rate.add_metric(key, c["usd_per_hour"])
        if c["budget_usd"]:
            budget.add_metric(key, c["budget_usd"])
            used.add_metric(key, c["budget_used"])
        nodes.add_metric(key, c["nodes"])
        gpus.add_metric(key, c["gpus"])
        simulated.add_metric(key, 1.0 if c["simulated"] else 0.0)
        for phase in ClusterPhase:
            state.add_metric([*key, phase.value], 1.0 if phase.value == c["state"] else 0.0)
        failing.add_metric(key, float(c["guard_failing"]["looks"]) if c["guard_failing"] else 0.0)
        heard = c["guard"].get("beat") if c["guard_by"] == "head" else c["heard"]
        guard.add_metric([*key, *_guard(c)], max(0.0, now - heard) if heard else float("nan"))
    yield from (spent, rate, budget, used, nodes, gpus, simulated, state, failing, guard)


def _guard(cluster: dict) -> tuple[str, str, str]:
    """The guard's labels: by (head, here, none), its pid and host."""
    if cluster["guard_by"] == "head":
        return "head", str(cluster["guard"].get("pid")), str(cluster["guard"].get("host"))
    if cluster["guard_by"] == "here":
        return "here", str(cluster["watchdog_pid"]), socket.gethostname()
    return "none", "", ""


def _jobs(live: dict[int, dict], now: float):
    labels = ["cluster", "job"]
    usd = CounterMetricFamily("gpugeek_job_spent_usd", "A running job's share of its cluster's dollars",
                              labels=labels)
    steps = GaugeMetricFamily("gpugeek_job_step", "The job's latest step", labels=labels)
    speed = GaugeMetricFamily("gpugeek_job_samples_per_second", "The job's latest throughput", labels=labels)
    loss = GaugeMetricFamily("gpugeek_job_loss", "The job's latest logged loss", labels=labels)
    for job in costs.running_jobs_spend(list(live), now):
        key = [live[job["cluster_id"]]["name"], job["name"]]
        usd.add_metric(key, job["usd"])
        latest = store.query("SELECT step, metrics FROM samples WHERE cluster_id=? AND job_id=? AND rank=0"
                             " ORDER BY at DESC LIMIT 1", (job["cluster_id"], job["job_id"]))
        if latest:
            if latest[0]["step"] is not None:
                steps.add_metric(key, latest[0]["step"])
            metrics = json.loads(latest[0]["metrics"])
            for family, name in ((speed, "samples_per_s"), (loss, "loss")):
                if isinstance(metrics.get(name), (int, float)):
                    family.add_metric(key, metrics[name])
    yield from (usd, steps, speed, loss)


def _nodes(live: dict[int, dict], now: float):
    labels = ["cluster", "node_type", "pricing", "node", "device"]
    busy, memory, total = _gauges("gpugeek_node", labels, (
        ("utilisation_percent", "GPU utilisation (a GPU device) or host CPU (device=host), latest reading"),
        ("memory_used_bytes", "GPU memory (a GPU) or host memory used"),
        ("memory_total_bytes", "GPU memory (a GPU) or host memory")))
    for cluster_id in live:
        # the newest drain's readings: from a few seconds before the cluster's newest sample on
        # (samplers read every node at most once a second; a node silent longer is not current)
        newest = store.query("SELECT MAX(at) FROM node_samples WHERE cluster_id=?", (cluster_id,))[0][0]
        if newest is None or newest < now - RECENT_S:
            continue
        rows = store.query(
            "SELECT s.node_id, s.device, MAX(s.at) AS at, s.metrics, n.node_type, n.pricing"
            " FROM node_samples s JOIN nodes n ON n.cluster_id = s.cluster_id AND n.node_id = s.node_id"
            " WHERE s.cluster_id=? AND s.at>=? AND n.ended IS NULL GROUP BY s.node_id, s.device",
            (cluster_id, newest - LATEST_S))
        for r in rows:
            key = [live[cluster_id]["name"], r["node_type"] or "head", r["pricing"] or "", r["node_id"][-6:],
                   r["device"]]
            m = json.loads(r["metrics"])
            gpu = r["device"] != "host"
            for family, name in ((busy, "gpu_util" if gpu else "cpu_percent"),
                                 (memory, "gpu_mem_used" if gpu else "mem_used"),
                                 (total, "gpu_mem_total" if gpu else "mem_total")):
                if isinstance(m.get(name), (int, float)):
                    family.add_metric(key, m[name])
    yield from (busy, memory, total)


_registry = CollectorRegistry(auto_describe=False)
_registry.register(LedgerCollector())


def scrape() -> bytes:
    """The text a scraper gets."""
    return generate_latest(_registry)
