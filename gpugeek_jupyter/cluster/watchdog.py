"""The cluster's watchdog: meters it, and stops it at the budget cap or after the idle timeout.

``python -m gpugeek_jupyter.cluster.watchdog CLUSTER_ID`` runs in a session of its own, started by
``up``; it does not depend on the kernel, so a killed or closed notebook cannot leave a cluster
billing past its budget. Every interval it copies Ray's node table into the ledger, prices it,
and acts:

- spend ≥ 80 % of the budget → a warning event (shown by the next ``%gpugeek`` call and status);
- spend would pass the budget before the next check → stop jobs, shut the cluster down;
- no job and every node idle (Ray's own idle clock) for ``idle`` minutes → shut it down;
- the head no longer answers → close the ledger (the nodes are gone) and stop what is left.
"""

from __future__ import annotations

import sys
import time

from ..config import settings
from ..meter import ledger
from ..meter.raynodes import ClusterUnreachable, read_nodes
from . import processes, registry
from .manage import BUDGET_WARN_AT, shutdown
from .spec import ClusterSpec

UNREACHABLE_LIMIT = 3   # consecutive failed reads before a head counts as gone


def run(cluster_id: int, interval: float | None = None) -> str:
    """Watch until the cluster stops; returns why it stopped."""
    interval = interval or settings().meter_interval_s
    record = registry.get(cluster_id)
    prices = ClusterSpec.from_json(record.spec).prices()
    warned = bool(ledger.events(cluster_id, "budget-warning"))
    misses = 0
    while True:
        record = registry.get(cluster_id)
        if record.stopped or record.stopping:
            return record.stop_reason or "stopping"
        prices = ClusterSpec.from_json(record.spec).prices()  # scale/preempt may change node types
        try:
            nodes = read_nodes(record.address, timeout=max(1.0, interval))
            misses = 0
        except ClusterUnreachable:
            misses += 1
            nodes = None
            head_gone = record.session_id and not processes.session_processes(record.session_id, record.created)
            if misses >= UNREACHABLE_LIMIT or head_gone:
                shutdown(record, "lost: the head stopped answering", from_watchdog=True)
                return "lost"
        if nodes is not None:
            ledger.sync_nodes(cluster_id, nodes, prices)
        now = time.time()
        if record.budget_usd:
            spent = ledger.spend(cluster_id, now)
            burn = ledger.burn_rate(cluster_id)
            if not warned and spent >= BUDGET_WARN_AT * record.budget_usd:
                ledger.event(cluster_id, "budget-warning",
                             f"{spent / record.budget_usd:.0%} of the ${record.budget_usd:,.2f} budget spent "
                             f"(${spent:,.2f}; burning ${burn:,.2f}/h)")
                warned = True
            if spent + burn * interval / 3600.0 >= record.budget_usd:
                ledger.event(cluster_id, "budget-stop",
                             f"budget ${record.budget_usd:,.2f} reached (${spent:,.2f} spent) — stopping jobs "
                             f"and shutting the cluster down")
                shutdown(record, "budget cap reached", from_watchdog=True)
                return "budget"
        if nodes is not None:
            since = ledger.idle_since(cluster_id, nodes, record.idle_since, now)
            if since != record.idle_since:
                registry.update(cluster_id, idle_since=since)
        if record.idle_minutes and nodes is not None:
            if since is not None and now - since >= record.idle_minutes * 60:
                ledger.event(cluster_id, "idle-stop",
                             f"idle for {record.idle_minutes:g} min with no job — shutting the cluster down")
                shutdown(record, f"idle {record.idle_minutes:g} min", from_watchdog=True)
                return "idle"
        time.sleep(interval)


def main(argv: list[str]) -> int:
    reason = run(int(argv[1]))
    print(f"watchdog: cluster {argv[1]} stopped ({reason})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
