"""What a cluster looks like from the ledger: ``status`` (one cluster) and ``clusters`` (all).

``ClusterStatus`` shows itself as text and HTML; in a notebook the notebook layer adds its live
panel through ``display`` — this module never imports a widget.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field, fields

import pandas as pd

from .. import display
from ..cluster import registry
from ..cluster.spec import ClusterSpec
from ..guard import board
from ..guard.lifecycle import catch_up, counted_until, sync_ledger
from ..kernel.session import any_cluster
from ..meter import costs, ledger
from ..units import duration
from ..vocab import ClusterPhase


@dataclass
class ClusterStatus:
    """A cluster's state from the ledger: ``guard/board.py``'s ``ClusterModel`` under the same
    names (its ``state`` as a ``ClusterPhase``, its ``nodes`` the table of them where the model
    counts them), with its events and notes."""

    name: str
    backend: str
    state: ClusterPhase
    status: str                       # the state said for people (orphan, not watched, …)
    address: str | None
    simulated: bool
    nodes: pd.DataFrame
    spent_usd: float
    usd_per_hour: float
    budget_usd: float | None
    idle_minutes: float | None
    idle_since: float | None          # the watchdog's idle clock (None: busy)
    at: float                         # when this was read
    idle_why: str | None = None       # what the watchdog's idle clock rests on (meter/activity.py)
    guarded_by: str | None = None     # who enforces the budget and idle stop now (None: nothing does)
    events: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def idle_for_s(self) -> float | None:
        return self.at - self.idle_since if self.idle_since else None

    @property
    def gpus(self) -> float:
        return float(self.nodes["gpus"].sum()) if not self.nodes.empty else 0.0

    @property
    def budget_left_hours(self) -> float | None:
        if not self.budget_usd or self.usd_per_hour <= 0:
            return None
        return max(0.0, self.budget_usd - self.spent_usd) / self.usd_per_hour

    def lines(self) -> list[str]:
        tag = " (simulated $)" if self.simulated else ""
        out = [f"{self.name}: {self.backend} cluster, {self.status}" + (f" at {self.address}" if self.address else ""),
               f"nodes: {len(self.nodes)} alive, {self.gpus:g} GPUs"
               + (" declared" if self.simulated else "")]
        money = f"spent ${self.spent_usd:,.2f}{tag}; burning ${self.usd_per_hour:,.2f}/h"
        if self.budget_usd:
            money += f"; budget ${self.budget_usd:,.2f} ({self.spent_usd / self.budget_usd:.0%} used)"
            left = self.budget_left_hours
            if left is not None and self.state is ClusterPhase.RUNNING:
                money += f", reached in {duration(left * 3600)} at this rate"
        elif self.usd_per_hour > 0:
            money += f" → ${self.usd_per_hour * 24:,.2f} per day at this rate"
        out.append(money)
        if self.state.live:
            out.append(f"guarded by {self.guarded_by}" if self.guarded_by
                       else "guarded by nothing: budget and idle stop are not enforced")
        if self.idle_minutes:
            idle = f"idle for {duration(self.idle_for_s)}" if self.idle_for_s is not None else "busy"
            out.append(f"autostop after {self.idle_minutes:g} min idle ({idle}"
                       + (f": {self.idle_why})" if self.idle_why else ")"))
        out += [f"{pd.Timestamp(e['at'], unit='s'):%H:%M:%S} {e['kind']}: {e['message']}" for e in self.events[-5:]]
        out += self.notes
        return out

    def __repr__(self) -> str:
        table = display.in_words(self.nodes).to_string(index=False) if not self.nodes.empty else ""
        return "\n".join(self.lines()) + ("\n" + table if table else "")

    def _repr_html_(self) -> str:
        body = "<br>".join(html.escape(line) for line in self.lines())
        table = display.in_words(self.nodes).to_html(index=False) if not self.nodes.empty else ""
        return f"<div>{body}</div>{table}"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        """The live panel in a notebook; HTML and text wherever widgets cannot show."""
        return display.bundle(self, repr(self), self._repr_html_())


def status(name: str | None = None, *, sync: bool = True) -> ClusterStatus:
    """A cluster's state from the ledger. ``sync`` first copies Ray's node table in; without it
    (the panels' background refresh) nothing talks to Ray — the watchdog keeps the ledger's
    nodes current every few seconds and open nodes accrue up to now either way."""
    record = any_cluster(name)
    if sync:
        record = catch_up(record)       # a remote head whose watchdog here is gone: its word first
        sync_ledger(record)
        record = registry.get(record.id)      # as the sync left it (the head's word, a stop it made)
    now = time.time()
    seen = board.model(record, now)
    frame = costs.nodes_frame(record.id, counted_until(record, now))
    alive = frame[frame["alive"]]
    nodes = pd.DataFrame({
        "node": alive["node_id"].str[-6:], "type": alive["node_type"], "gpus": alive["gpus"],
        "pricing": alive["pricing"], "usd_per_hour": alive["usd_per_hour"],
        "up_for": [duration(now - s) for s in alive["started"]],
    })
    return ClusterStatus(
        **{f.name: seen[f.name] for f in fields(ClusterStatus) if f.name in seen and f.name not in ("state", "nodes")},
        state=ClusterPhase(seen["state"]), nodes=nodes.reset_index(drop=True), at=now,
        events=ledger.events(record.id), notes=list(ClusterSpec.from_json(record.spec).notes),
    )


def clusters() -> pd.DataFrame:
    """Every cluster this machine has run, newest last; live ones say if they are orphans (the
    columns are ``ClusterModel``'s, by its names)."""
    columns = ["name", "backend", "state", "status", "nodes", "gpus", "spent_usd", "simulated", "budget_usd",
               "created", "orphan"]
    rows = [{**{k: c[k] for k in columns}, "created": pd.Timestamp(c["created"], unit="s")}
            for c in board.every_run()]
    return pd.DataFrame(rows, columns=columns)
