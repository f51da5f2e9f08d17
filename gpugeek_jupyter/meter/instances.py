"""A rented cluster's bill from its provider's own record: each instance from its launch to the end
of its billing.

A cloud bills a machine from the moment it launched it, through its boot and set-up, until it
begins shutting down: minutes that Ray's node table never sees (a node is in it once its raylet
runs). So a cloud cluster's node rows are its instances (``Cloud.instances``), one row each under
the instance's id, started at the provider's launch time and ended where the provider says billing
ended (at least its billing minimum after the launch: EC2's first minute is billed whole). An
instance the provider lists as ended without saying when ends at the look that saw it go: one
metering interval late at most. Prices are the node types', fixed when the row is written, as in
``ledger.sync_nodes``. An instance the provider took back (a spot interruption, by its own word
for why it ended) ends as ``preempted``, with an event, as a rehearsed preemption does: not a failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .. import store
from ..clouds.base import Instance
from ..vocab import UNPRICED, NodePrice
from .ledger import event

PREEMPTED = "preempted"


def sync_instances(cluster_id: int, instances: Iterable[Instance], prices: Mapping[str, NodePrice],
                   gpus: Mapping[str, float], seen_at: float, minimum_s: float = 0.0,
                   reason: str | None = None, recorded_end_wins: bool = False) -> int:
    """Record instances seen for the first time and close those the provider no longer bills
    (``reason``: why, when we ended them; else the provider's word for their state). ``prices``
    and ``gpus`` map a launcher node type (``head`` too) to its price and GPUs. With
    ``recorded_end_wins``, a row already closed (by the stop that ended it, a moment before the
    machines were gone) takes the end the record gives (a scheduler's: the job's end). Returns
    how many rows changed. Safe to call from several processes at once."""
    changed = 0
    with store.transaction() as db:
        for instance in instances:
            price = prices.get(instance.node_type) or UNPRICED
            cur = db.execute(
                "INSERT OR IGNORE INTO nodes (cluster_id, node_id, node_type, offer_id, pricing,"
                " usd_per_hour, on_demand_usd_per_hour, gpus, started) VALUES (?,?,?,?,?,?,?,?,?)",
                (cluster_id, instance.id, instance.node_type or "unknown", price.offer_id, price.pricing,
                 price.usd_per_hour, price.on_demand_usd_per_hour, gpus.get(instance.node_type, 0.0),
                 instance.launched),
            )
            changed += cur.rowcount
            if instance.gone:
                ended = max(instance.ended if instance.ended is not None else seen_at, instance.launched + minimum_s)
                why = PREEMPTED if instance.preempted else reason or instance.state
                cur = db.execute(
                    "UPDATE nodes SET ended=?, end_reason=? WHERE cluster_id=? AND node_id=? AND ended IS NULL",
                    (ended, why, cluster_id, instance.id),
                )
                changed += cur.rowcount
                if not cur.rowcount and recorded_end_wins and instance.ended is not None:
                    changed += db.execute("UPDATE nodes SET ended=? WHERE cluster_id=? AND node_id=? AND ended != ?",
                                          (ended, cluster_id, instance.id, ended)).rowcount
                if cur.rowcount and instance.preempted:
                    event(cluster_id, PREEMPTED, f"instance {instance.id} ({instance.node_type}) was taken back "
                                                 f"by its provider (a spot interruption)", at=ended, db=db)
    return changed


def all_ended(cluster_id: int) -> bool:
    """Whether the cluster had machines and every one of them has ended."""
    had, open_ = store.query("SELECT COUNT(*), COUNT(*) - COUNT(ended) FROM nodes WHERE cluster_id=?",
                             (cluster_id,))[0]
    return had > 0 and open_ == 0
