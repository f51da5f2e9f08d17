"""Ray's own lines kept out of cells. A kernel that is a Ray driver (of a local, sim or attached
cluster) has Ray print, from threads of its own and into whatever cell runs: its raylet's "A worker
died or was killed while executing a task…", its GCS's "Failed to remove 1 bundle(s) for placement
group…". A cell says a worker's death once, in our words ("worker 2 died …"); Ray's lines go to
``~/.gpugeek/logs/ray.log`` (and stay in Ray's own session logs). A worker's own output — its
prints outside a cell, a library's C++ warnings — still reaches the cell, as Ray prefixes it.

Both kinds go through Ray's private ``ray._private.worker.print_to_stdstream``, wrapped from
``raynodes.py`` (Ray's insides' one door; ``tests/test_ray_contract.py`` names it).
"""

from __future__ import annotations

import threading
import time

from .. import raynodes
from ..config import home

_lock = threading.Lock()


def keep_out() -> None:
    """Wrap Ray's printer before ``ray.init`` (which hands it to its log thread then): lines of
    Ray's processes — named, not numbered, in the record — go to our log instead of the cell."""
    def wrap(real):
        def print_to_stdstream(data, ignore_prefix: bool):
            if _rays_own(data):
                _log(data)
            else:
                real(data, ignore_prefix)
        return print_to_stdstream

    raynodes.wrap_driver_printer(wrap)


def log_path():
    return home() / "logs" / "ray.log"


def _rays_own(data: dict) -> bool:
    """A record from Ray itself: its ``pid`` names a process ("raylet", "gcs_server",
    "autoscaler"), where a worker's is a number."""
    return not str(data.get("pid", "")).isdigit()


def _log(data: dict) -> None:
    path = log_path()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with _lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.writelines(f"{stamp} ({data.get('pid')}) {line}\n" for line in data.get("lines", []))
