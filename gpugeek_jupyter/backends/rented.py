"""A rented cluster's instances, by the tag Ray's launcher gives each (``ray-cluster-name``): the
provider's own record of what it bills, read by the meter (here, and by the head's watchdog), and
what a stop ends.

A stop through the provider's API terminates every instance that carries the cluster's tag and
looks again until none is listed running: an instance a crashed ``up`` left, or one the head's
autoscaler launched while the stop ran, is found the same way, and an instance without the tag
(someone else's) is never touched.
"""

from __future__ import annotations

import time

from ..clouds import CLOUDS
from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..meter import ledger

# a provider's clock against ours: an instance launched this long before `up` recorded the cluster
# is still its own (an earlier cluster of the name lived longer than that)
CLOCK_SLACK_S = 30.0
TERMINATE_WAIT_S = 90.0     # until the provider lists none of the cluster's instances running
ENDED = "instances-ended"   # the ledger's event: what a stop found and terminated


def instances_of(record: ClusterRecord) -> list:
    """A rented cluster's instances (``Cloud.instances``: by Ray's tag, launched since ``up``
    recorded it). Raises ``CloudUnanswered``."""
    spec = ClusterSpec.from_json(record.spec)
    return CLOUDS[spec.backend].instances(record.name, spec.node_types[0].region,
                                             since=record.created - CLOCK_SLACK_S)


def terminate_all(record: ClusterRecord, wait_s: float = TERMINATE_WAIT_S) -> list:
    """Every instance of the cluster (by its tag) terminated through the provider's API, looked
    for again until none is listed running (the head's autoscaler may launch one meanwhile).
    Records what was ended (``ENDED``) and returns those instances; one line if some still run."""
    spec = ClusterSpec.from_json(record.spec)
    cloud, region = CLOUDS[spec.backend], spec.node_types[0].region
    deadline = time.monotonic() + wait_s
    launched, terminated = {}, {}
    while True:
        found = instances_of(record)
        launched.update({i.id: i for i in found})
        live = [i for i in found if not i.gone]
        if not live:
            break
        if time.monotonic() > deadline:
            raise GpugeekError(f"{cloud.name} still lists {', '.join(f'{i.id} ({i.state})' for i in live)} of "
                               f"{record.name!r} after {wait_s:.0f} s of terminating — end them in its console")
        cloud.terminate([i.id for i in live], region)
        terminated.update({i.id: i for i in live})
        time.sleep(2.0)
    said = said_ended(cloud.name, list(launched.values()), list(terminated))
    ledger.event(record.id, ENDED, said, options={"launched": sorted(launched), "terminated": sorted(terminated)})
    return list(terminated.values())


def said_ended(provider: str, launched: list, terminated: list[str]) -> str:
    """What a stop did to the cluster's instances, as the provider lists them, in a line."""
    if not launched:
        return f"{provider} launched no instance for it"
    each = ", ".join(f"{i.id} ({i.node_type}, {'terminated now' if i.id in terminated else i.state})"
                     for i in sorted(launched, key=lambda i: i.launched))
    return f"{provider} lists {len(launched)} instance{'s' if len(launched) > 1 else ''} of it, none running: {each}"


def instances_ended(cluster_id: int) -> str | None:
    """What the cluster's last stop did to its instances (``terminate_all``), or None."""
    said = ledger.events(cluster_id, ENDED)
    return said[-1]["message"] if said else None
