"""``--address``: a Ray cluster someone else runs; we join it and never stop it."""

from __future__ import annotations

from types import MappingProxyType

from ..raynodes import read_nodes
from .base import CLIENT_SCHEME, READY_TIMEOUT_S, REHEARSAL_ONLY, Backend, Feature, LaunchConfig, Started


class AttachBackend(Backend):
    name = "attach"
    launches = watched = False  # someone else's cluster: theirs to size and stop
    grows = True                # … and it may have an autoscaler
    confirm = runs_here = tunnelled = simulated = from_offers = your_hosts = local_price = False
    kernel_joins = "driver"     # or a Ray Client at a ray:// address
    notices = provider = scheduler = None
    cannot = MappingProxyType({
        Feature.LIMITS: "they stop a cluster, and an attached cluster is not ours to stop — start one with "
                        "--backend local/sim/aws/… instead",
        Feature.DASHBOARD: "an attached cluster's dashboard is whatever its owner started — ask its owner where it is",
        Feature.SCALE: "an attached cluster is its owner's to size — ask its owner, or `up` a cluster of your own",
        Feature.PREEMPT: REHEARSAL_ONLY,
    })

    def show(self, name, spec):
        return LaunchConfig(self.name, "attach only: nothing is started", None, "", {})

    def start(self, record, spec):
        return Started(address=record.address)

    def preflight(self, spec):
        return

    def wait_ready(self, record, spec, timeout=READY_TIMEOUT_S):
        if not record.address.startswith(CLIENT_SCHEME):   # a Ray Client address is proven by connecting
            read_nodes(record.address)     # raises one clear line if nothing answers

    def stop(self, record, grace=3.0):
        return  # not ours
