"""The cluster's real watchdog, with one fault that switches on when a file appears.

    python tests/faulty_watchdog.py FAULT SWITCH CLUSTER_ID

Until ``SWITCH`` exists the watchdog runs as ``up`` starts it; it touches ``SWITCH.seen`` after
each look that saw the cluster. FAULT ``any`` installs every fault, and the one named in
``SWITCH`` is on (so one watchdog can go through them all). Per FAULT:

- ``registry``: every registry read fails (``registry.get``, as SQLite says of a file it cannot open);
- ``ledger-write``: copying Ray's node table into the ledger fails (a refused write);
- ``gcs``: Ray's GCS does not answer the watchdog;
- ``reader``: the node reader raises (a bug).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.guard import watchdog
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.raynodes import ClusterUnreachable


def when_on(switch: Path, name: str, chosen: str, real, fault):
    def patched(*args, **kwargs):
        if switch.exists() and (chosen != "any" or _said(switch) == name):
            return fault()
        return real(*args, **kwargs)
    return patched


def _said(switch: Path) -> str:
    try:
        return switch.read_text().strip()
    except OSError:        # removed meanwhile: no fault
        return ""


def main(fault: str, switch: Path, cluster_id: str) -> int:
    def refuse(error):
        def raise_it():
            raise error
        return raise_it

    faults = {
        "registry": (registry, "get", refuse(sqlite3.OperationalError("unable to open database file"))),
        "ledger-write": (ledger, "sync_nodes", refuse(sqlite3.OperationalError("disk I/O error"))),
        "gcs": (watchdog, "read_nodes", refuse(ClusterUnreachable("connection refused"))),
        "reader": (watchdog, "read_nodes", refuse(RuntimeError("the node reader broke"))),
    }
    for each, (module, name, raise_it) in faults.items():
        if fault in (each, "any"):
            setattr(module, name, when_on(switch, each, fault, getattr(module, name), raise_it))
    looked = watchdog.Watch.looked

    def seen(self):
        looked(self)
        switch.with_suffix(".seen").touch()
    watchdog.Watch.looked = seen
    return watchdog.main(["watchdog", cluster_id])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3]))
