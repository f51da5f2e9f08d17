"""Worker groups whose kernel is gone. A group belongs to the cluster (its workers are detached),
so a kernel that dies leaves it running — its cell goes on, and `%gpugeek attach` can read it.
Once that cell has ended, the group only holds GPUs: a new kernel takes it over with
`%gpugeek attach JOB --adopt` (its variables with it), or else the next group started from this
machine removes it, so a restarted kernel never finds its cluster full of a dead kernel's workers.

A group's owner is the kernel that started it (in its name: host, pid) until another adopts it
(rank 0 then keeps the new owner, ``Worker.adopted``)."""

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


def named_groups() -> dict[str, list[str]]:
    """Every worker group on the cluster this process drives: {group id: its workers' names, by rank}."""
    import ray

    groups: dict[str, list[str]] = {}
    for named in ray.util.list_named_actors(all_namespaces=True):
        name = named["name"] if isinstance(named, dict) else named
        if (isinstance(named, dict) and named.get("namespace") != NAMESPACE) or not name.startswith(PREFIX):
            continue
        groups.setdefault(name[len(PREFIX):].rpartition("/")[0], []).append(name)
    return {g: sorted(names, key=lambda n: int(n.rpartition("/")[2])) for g, names in groups.items()}


def owner_gone(owner: str) -> bool | None:
    """Whether kernel ``owner`` (host:pid) is gone: None when it is another machine's, which this
    one cannot see."""
    import psutil

    host, _, pid = owner.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return not psutil.pid_exists(int(pid))


def reclaim() -> list[str]:
    """Remove the groups of kernels of this machine that are gone, whose last cell has ended;
    returns their ids. A group whose cell still runs is left to finish, and one that a live
    kernel adopted is that kernel's."""
    import ray
    from ray.util.placement_group import get_placement_group, remove_placement_group

    gone = []
    for group_id, names in named_groups().items():
        if not owner_gone(group_id.rsplit(":", 1)[0]):
            continue
        handles = []
        for name in names:
            try:
                handles.append(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:         # gone meanwhile
                continue
        lead = next((h for n, h in zip(names, handles, strict=False) if n.endswith("/0")), None)
        try:
            state = ray.get(lead.state.remote(), timeout=10) if lead is not None else {}
            if state.get("running") or not owner_gone(state.get("owner") or group_id.rsplit(":", 1)[0]):
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
