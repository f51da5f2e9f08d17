"""Whether a cluster's watchdog can see what it guards: its failed looks counted, said, and written
where every reader finds them even when the registry or the ledger is what fails.

A look that raises (the registry unreadable, a ledger write refused, a bug in a reader) or that
cannot reach the cluster's GCS is a failed look. After ``FAILING_AFTER`` in a row the watchdog
says so once (an event, when the ledger takes it) and keeps a small file beside the database,
``guards/<cluster id>.json``, that status, the sidebar, the terminal and the metrics read. The
file goes when a look succeeds again.

While it cannot read the spend, a watchdog with a budget assumes the last $/h it knew
(``Known``) and stops the cluster when that burn would reach the cap (``watchdog``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import home
from ..units import clock

FAILING_AFTER = 3


@dataclass
class Known:
    """What the last look that read the spend saw: the record (to stop it without the registry),
    the dollars, the burn and when."""

    record: object
    spent: float
    burn: float
    at: float

    def projected(self, now: float) -> float:
        """The spend now, had the burn stayed as last seen."""
        return self.spent + self.burn * max(0.0, now - self.at) / 3600.0


def _path(cluster_id: int) -> Path:
    return home() / "guards" / f"{cluster_id}.json"


def write(cluster_id: int, state: dict) -> None:
    """The failing state, replaced whole (a reader never sees half a file)."""
    path = _path(cluster_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(state))
    partial.replace(path)


def clear(cluster_id: int) -> None:
    _path(cluster_id).unlink(missing_ok=True)


def failing(cluster_id: int) -> dict | None:
    """The watchdog's failing state (``since``, ``looks``, ``error``, ``by``, ``at``), or None
    while its looks succeed."""
    try:
        return json.loads(_path(cluster_id).read_text())
    except (OSError, ValueError):
        return None


def describe(state: dict) -> str:
    """`` — its watchdog is failing: 5 looks in a row since 14:02 (…)`` for a status line."""
    since = clock(state["since"])
    held = (f"; the ${state['budget']:,.2f} budget is held on the last known ${state['burn']:,.2f}/h"
            if state.get("budget") and state.get("burn") is not None else "")
    return (f" — its {state.get('by', 'watchdog')} is failing: {state['looks']} looks in a row since {since} "
            f"({state['error']}){held}")
