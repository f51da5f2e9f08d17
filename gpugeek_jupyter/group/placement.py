"""A worker group's placement group that would not go: it still reserves its bundles (GPUs, or
CPUs) on the cluster. Removal is tried a few times; what is left is kept here, tried again before
the next group is placed, and named when that group does not fit — never "scale the cluster",
which would have the user pay for nodes to work around it. Such a group goes at the latest with
the job that owns it: this process's connection (a kernel's ``jobs.reset`` makes it anew)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import GpugeekError
from ..launch import torchrun

PG_REMOVE_TRIES = 3


@dataclass
class Held:
    """A placement group of an old worker group that would not go: it still reserves its
    bundles on the cluster until a removal works or this process's connection ends."""

    pg: object
    address: str | None
    gpus: float
    cpus: float
    why: str


_held: list[Held] = []


def remove(pg) -> str | None:
    """Remove a placement group, tried ``PG_REMOVE_TRIES`` times; why it would not go, or None."""
    from ray.util.placement_group import remove_placement_group

    why = None
    for attempt in range(PG_REMOVE_TRIES):
        try:
            remove_placement_group(pg)
            return None
        except Exception as exc:  # noqa: BLE001 - retried; what is left is kept in `_held` and said
            why = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5 * (attempt + 1))
    return why


def release_held(here: str | None) -> list[Held]:
    """Try again to remove the placement groups that would not go on the cluster this process is
    connected to now (``here``, as ``Link.connected_address`` says: the others went with the job
    that owned them); those still held."""
    _held[:] = [h for h in _held if h.address == here and here is not None]
    for kept in list(_held):
        if _gone(kept.pg) or remove(kept.pg) is None:
            _held.remove(kept)
    return list(_held)


def keep(pg, address: str | None, why: str) -> None:
    """A placement group that would not go (``remove`` said why), kept to be tried again."""
    bundles = pg.bundle_specs
    _held.append(Held(pg, address, sum(b.get("GPU", 0) for b in bundles), sum(b.get("CPU", 0) for b in bundles), why))


def held() -> list[Held]:
    """The old groups' placement groups that would not go, as last tried."""
    return list(_held)


def forget_held() -> None:
    """The connection was made anew: the old job's placement groups went with it."""
    _held.clear()


def _gone(pg) -> bool:
    from ray.util import placement_group_table

    try:
        return placement_group_table(pg).get("state") == "REMOVED"
    except Exception:  # noqa: BLE001 - Ray cannot say: it is tried again as held
        return False


def rank_places(pg, n: int) -> list:
    """Where each rank goes: its bundle of ``pg``, so that the ranks on one node are consecutive
    (``torchrun.rank_order``), from where Ray placed the bundles; in order when Ray does not say."""
    from ray.util import placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        placed = placement_group_table(pg).get("bundles_to_node_id") or {}
    except Exception:  # noqa: BLE001 - Ray's table is an aid here: bundles in order still work
        placed = {}
    order = torchrun.rank_order([str(placed[i]) for i in range(n)]) if len(placed) == n else list(range(n))
    return [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b) for b in order]


def bundle(gpus_per_worker: float) -> dict:
    """What one worker reserves: its GPUs, or a CPU."""
    return {"GPU": gpus_per_worker} if gpus_per_worker else {"CPU": 1}


def never_fits(n: int, gpus_per_worker: float, grows: bool) -> None:
    """On a cluster that does not grow (local, ssh): refuse at once, in the line a long wait would
    have ended in, a group of ``n`` workers the cluster's nodes could never hold, busy or not —
    each worker's bundle on one node, so a node holds as many as its own CPUs (or GPUs) allow."""
    import ray

    if grows:
        return
    resource, need = next(iter(bundle(gpus_per_worker).items()))
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    room = sum(int(resources.get(resource, 0) // need + 1e-9) for resources in nodes)
    if room < n:
        total = sum(resources.get(resource, 0) for resources in nodes)
        what = f"{need:g} GPU" if resource == "GPU" else f"{need:g} CPU"
        raise GpugeekError(f"{n} workers × {what} do not fit the cluster (it has {total:g} {resource}s on "
                           f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}, and does not grow by itself) — "
                           f"use fewer --workers, or `%gpugeek scale` the cluster{_on_cpus(gpus_per_worker)}")


def growing(n: int, gpus_per_worker: float) -> str:
    """What a group waits for on a cluster that grows, in words: the room it needs against the
    room free now (the autoscaler adds nodes for the difference, or a busy group ends)."""
    import ray

    resource, need = next(iter(bundle(gpus_per_worker).items()))
    free = ray.available_resources().get(resource, 0)
    what = f"{need:g} GPU" if resource == "GPU" else f"{need:g} CPU"
    return (f"the cluster to make room for {n} workers × {what} ({free:g} {resource}s free now): it starts "
            f"nodes for them by itself, or a group that holds them ends")


def no_room(n: int, gpus_per_worker: float, have: dict, held: list[Held], holders: list[str]) -> GpugeekError:
    """Why a new group of ``n`` workers found no room in its wait: an old group's placement group
    that would not go (``held``: `reset` tries again, and the cluster need not grow), else the
    cluster's size (``have``: Ray's resources) and the jobs that hold it (``orphans.holders``)."""
    what = f"{gpus_per_worker:g} GPU" if gpus_per_worker else "1 CPU"
    if held:
        return GpugeekError(
            f"{n} workers × {what} do not fit while an old worker group's placement group still holds "
            f"{sum(h.gpus for h in held):g} GPUs and {sum(h.cpus for h in held):g} CPUs (its removal "
            f"failed: {held[-1].why}) — `%gpugeek reset` tries again; the cluster need not grow")
    return GpugeekError(
        f"{n} workers × {what} do not fit the cluster (it has {have.get('GPU', 0):g} GPUs, "
        f"{have.get('CPU', 0):g} CPUs" + "".join(f"; {h}" for h in holders) + ") — "
        f"use fewer --workers, or `%gpugeek scale` the cluster{_on_cpus(gpus_per_worker)}")


def _on_cpus(gpus_per_worker: float) -> str:
    """The way out a GPU group has besides: its workers on CPUs (a GPU each is the default)."""
    return ", or `--gpus-per-worker 0` to run them on CPUs" if gpus_per_worker else ""
