"""The head's watchdog on a cloud's instance: what it does beyond an ssh or Slurm head's.

Its workers are instances, so a stop ends them through the provider's API and the head then ends
itself; Ray's autoscaler runs here, and what it could not launch (a quota, no capacity) is read
from its log and told to the notebook's machine with the heartbeat. Only a head whose order names
a provider imports this module (``headwatch.HeadWatch``): the clouds' code never loads on another head,
whose Python may lack what it needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..backends.launcher import BOOTSTRAP
from ..backends.rented import instances_of
from ..clouds import CLOUDS
from ..cluster.spec import ClusterSpec
from ..meter import ledger
from .launches import Launches

AUTOSCALER_LOG = "session_latest/logs/monitor.log"   # under the head's Ray temp dir


class CloudHead:
    """What the head's watchdog (``headwatch.HeadWatch``) does on a cloud's instance: see the
    module's docstring."""

    def __init__(self, cluster_id: int, order: dict, temp_dir: str):
        self.cluster_id = cluster_id
        self.order = order
        # the autoscaler: what it could not launch, read from its log (and the spot fallback)
        self.launches = Launches(Path(temp_dir) / AUTOSCALER_LOG, Path(os.path.expanduser(BOOTSTRAP)))

    def look_at_launches(self, record) -> None:
        spec = ClusterSpec.from_json(record.spec)
        self.launches.look(self.cluster_id, spec, CLOUDS[spec.backend], lambda: instances_of(record))

    def stop_workers(self, record, end_autoscaler: Callable[[], object]) -> None:
        """A cloud's workers are instances: Ray's autoscaler here is ended first (it would launch
        them again to its minimum: seen), then every instance of the cluster but this head is
        terminated through the provider's API, with the head's own role; a provider whose API is
        not spoken here, through Ray's launcher (``ray down --workers-only``). The head ends itself
        after (``end_head``)."""
        spec = ClusterSpec.from_json(record.spec)
        cloud = CLOUDS[spec.backend]
        if not cloud.lists_instances:     # its API not spoken here: Ray's launcher, with the head's role
            done = subprocess.run([sys.executable, "-c", "from ray.scripts.scripts import main; main()", "down",
                                   "--workers-only", "-y", os.path.expanduser(BOOTSTRAP)],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"ray down --workers-only failed: {done.stderr.strip()[-300:]}")
            return
        end_autoscaler()
        workers = [i.id for i in instances_of(record) if not i.gone and not i.head]
        if workers:
            cloud.terminate(workers, spec.node_types[0].region)

    def end_head(self) -> None:
        """Terminate this head the documented way, with the role Ray's launcher gave it; a failure
        is in the ledger (the notebook's machine copies it), for the instance may still be billing."""
        command = CLOUDS[self.order["cloud"]].self_stop       # as each cloud documents it (``clouds/``)
        ledger.event(self.cluster_id, "head-stop", f"ending the head instance: {command}")
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            ledger.event(self.cluster_id, "stop-failed",
                         f"the head instance did not end itself ({done.stderr.strip()[-300:]})"
                         f" — it may still be running and billing; end it in the console")
