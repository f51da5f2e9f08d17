"""What a cloud head's autoscaler could not launch — a worker the cloud refused — said where the
notebook looks; and with ``--spot-fallback``, on-demand workers launched in the place of spot
ones the cloud has none of.

Ray's autoscaler logs each refusal in the cloud's own code and words (``launcher.worker_refusals``)
and asks for the same machine again every few seconds, for ever: a spot type the cloud has none of
(its ``no_capacity`` codes), or whose price is above what the launch pays, never comes, and the
cell waiting for it waits in silence. The head's watchdog reads the autoscaler's log at each look,
records each refusal (once per type and code every ``SAY_AGAIN_S``) and, on a cluster made with
``--spot-fallback``, moves the workers' minimum from the spot type to its on-demand stand-in in the
autoscaler's own config (which the autoscaler reads again at every update): the spot workers that
do run stay, the rest come on demand, once, and it says so. The notebook's machine hears both from
the head's heartbeat (``NEWS``) and prints them after the next cell.

Runs on: a cloud head, in its watchdog.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ..clouds.base import Cloud, Instance
from ..cluster.spec import ClusterSpec
from ..meter import ledger

REFUSED = "launch-refused"
FELL_BACK = "spot-fallback"
WALLTIME = "walltime"              # a Slurm job's walltime near: its nodes told (guard/jobend.py)
PREEMPTED = "slurm-preempted"      # the scheduler preempted a Slurm job: its nodes told (guard/jobend.py)
REQUEUED = "requeued"              # ``up --requeue``: the Slurm job requeued before its end (guard/jobend.py)
# the head's events a notebook's machine copies from its heartbeat
NEWS = (REFUSED, FELL_BACK, WALLTIME, PREEMPTED, REQUEUED)
SAY_AGAIN_S = 600.0                # a refusal that goes on is said again this often
SPOT_PRICE = ("SpotMaxPriceTooLow",)   # spot that will not come at the price the launch pays


class Launches:
    """The autoscaler's log on this head, read from where the last look stopped."""

    def __init__(self, log: Path, config: Path):
        self.log, self.config = log, config
        self.offset = 0
        self.said: dict[tuple[str, str], float] = {}     # (node type, code) → when last said
        self.fell_back = False

    def look(self, cluster_id: int, spec: ClusterSpec, cloud: Cloud, instances: Callable[[], list[Instance]]) -> None:
        """Record what was refused since the last look, and fall back once where it is asked
        (``instances``: the cluster's, as the cloud lists them, asked only then)."""
        from ..backends.launcher import worker_refusals  # a cloud head's: every other head imports this module

        for node_type, code, words in worker_refusals(self._new_text()):
            now = time.time()
            if now - self.said.get((node_type, code), 0.0) >= SAY_AGAIN_S:
                self.said[(node_type, code)] = now
                what = cloud.refusals.get(code, "the autoscaler tries again; its log on the head says more")
                ledger.event(cluster_id, REFUSED, f"{cloud.name} refused the head's autoscaler a {node_type} "
                                                  f"worker: {code} ({words}) — {what}",
                             options={"node_type": node_type, "code": code})
            if spec.spot_fallback and not self.fell_back and code in (*cloud.no_capacity, *SPOT_PRICE):
                self._fall_back(cluster_id, spec, cloud, node_type, code, instances)

    def _new_text(self) -> str:
        try:
            size = self.log.stat().st_size
            if size < self.offset:         # rotated: from its start
                self.offset = 0
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except OSError:                    # not written yet
            return ""
        end = data.rfind(b"\n") + 1        # whole lines only: the rest next time
        self.offset += end
        return data[:end].decode(errors="replace")

    def _fall_back(self, cluster_id: int, spec: ClusterSpec, cloud: Cloud, node_type: str, code: str,
                   instances: Callable[[], list[Instance]]) -> None:
        spot = next((t for t in spec.node_types if t.name == node_type and t.pricing == "spot"), None)
        stand_in = next((t for t in spec.node_types if spot and t.replaces_preempted == spot.name), None)
        if spot is None or stand_in is None:
            return
        config = yaml.safe_load(self.config.read_text())
        types = config["available_node_types"]
        running = sum(1 for i in instances() if i.node_type == spot.name and not i.gone)
        wanted = types[spot.name].get("min_workers", 0)
        types[spot.name]["min_workers"] = types[spot.name]["max_workers"] = min(running, wanted)
        types[stand_in.name]["min_workers"] = max(0, wanted - running)
        written = self.config.with_name(f".{self.config.name}.new")
        written.write_text(yaml.safe_dump(config, sort_keys=False))
        os.replace(written, self.config)        # the autoscaler reads it whole or not at all
        self.fell_back = True
        launched = wanted - running
        ledger.event(cluster_id, FELL_BACK,
                     f"{cloud.name} has no spot {spot.instance_type} for the workers ({code}): {launched} on-demand "
                     f"worker{'s' if launched != 1 else ''} ({stand_in.name}, ${stand_in.usd_per_hour:g}/h each) "
                     f"launch in their place{f', beside the {running} spot ones that run' if running else ''}; "
                     f"spot is not tried again for this cluster",
                     options={"spot": spot.name, "on_demand": stand_in.name, "launched": launched, "code": code})


def news(cluster_id: int, last: int = 5) -> list[dict]:
    """The head's latest ``NEWS`` events, for its heartbeat."""
    found = sorted((e for kind in NEWS for e in ledger.events(cluster_id, kind)), key=lambda e: e["at"])
    return [{"kind": e["kind"], "message": e["message"], "at": e["at"],
             "options": json.loads(e["options"]) if e.get("options") else None} for e in found[-last:]]


def copy_news(cluster_id: int, told: list[dict]) -> int:
    """The head's news (from its heartbeat) into this machine's ledger, each once, with its options
    (a preempted job's grace time's end, say). Returns how many were new."""
    if not told:
        return 0
    have = {(e["kind"], round(e["at"], 3)) for kind in NEWS for e in ledger.events(cluster_id, kind)}
    fresh = [e for e in told if e.get("kind") in NEWS and (e["kind"], round(e["at"], 3)) not in have]
    for e in fresh:
        ledger.event(cluster_id, e["kind"], e["message"], at=e["at"], options=e.get("options"))
    return len(fresh)
