"""Worker groups whose kernel is gone. A group belongs to the cluster (its workers are detached),
so a kernel that dies leaves it running — its cell goes on, and `%gpugeek attach` can read it.
Once that cell has ended, the group only holds GPUs: the next group started from this machine
removes it, so a restarted kernel never finds its cluster full of a dead kernel's workers."""

from __future__ import annotations

import os
import socket

NAMESPACE = "gpugeek"    # the Ray namespace of this package's named actors (``connection.connect``)
PREFIX = "gpugeek-group/"


def group_name(group_id: str, rank: int | None = None) -> str:
    """The Ray name of a group's placement group (rank None) or of one of its workers."""
    return f"{PREFIX}{group_id}" + ("" if rank is None else f"/{rank}")


def new_group_id() -> str:
    """This machine, this kernel's process, and a tag: whose group it is, by its name alone."""
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def reclaim() -> list[str]:
    """Remove the groups of kernels of this machine that are gone, whose last cell has ended;
    returns their ids. A group whose cell still runs is left to finish."""
    import psutil
    import ray
    from ray.util.placement_group import get_placement_group, remove_placement_group

    groups: dict[str, list[str]] = {}
    for named in ray.util.list_named_actors(all_namespaces=True):
        name = named["name"] if isinstance(named, dict) else named
        if (isinstance(named, dict) and named.get("namespace") != NAMESPACE) or not name.startswith(PREFIX):
            continue
        group_id = name[len(PREFIX):].rsplit("/", 1)[0]
        groups.setdefault(group_id, []).append(name)
    gone = []
    for group_id, names in groups.items():
        host, pid, _ = [*group_id.split(":"), "", "", ""][:3]
        if host != socket.gethostname() or not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        handles = []
        for name in names:
            try:
                handles.append(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:         # gone meanwhile
                continue
        lead = next((h for n, h in zip(names, handles, strict=False) if n.endswith("/0")), None)
        try:
            if lead is not None and ray.get(lead.state.remote(), timeout=10)["running"]:
                continue
        except ray.exceptions.RayError:
            pass                       # rank 0 is dead: nothing of the group can run
        for handle in handles:
            ray.kill(handle)
        try:
            remove_placement_group(get_placement_group(group_name(group_id)))
        except ValueError:             # no such placement group (already removed)
            pass
        gone.append(group_id)
    return gone
