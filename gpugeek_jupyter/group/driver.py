"""What a Ray driver of the cluster asks of it beside its own cells: the worker groups on it and
the jobs they keep, and its nodes and room. ``RayDriver`` asks Ray from this process: the kernel of
a local, sim or attached cluster, and a remote cluster's keeper on its head. (A remote cluster's
kernel asks the same questions of its keeper over the line: ``cells/driving.LineDriver``.)
"""

from __future__ import annotations

import time

from ..raynodes import DIED_BEFORE_NOTICED_S
from .orphans import NAMESPACE, PREFIX, group_name

NODE_DEATH_S = 3 * DIED_BEFORE_NOTICED_S   # how long Ray may take to find a node that died unannounced


class RayDriver:
    """This process is a Ray driver of the cluster."""

    def groups(self) -> dict[str, list[str]]:
        """Every worker group on the cluster: {group id: its workers' names, by rank}."""
        import ray

        groups: dict[str, list[str]] = {}
        for named in ray.util.list_named_actors(all_namespaces=True):
            name = named["name"] if isinstance(named, dict) else named
            if (isinstance(named, dict) and named.get("namespace") != NAMESPACE) or not name.startswith(PREFIX):
                continue
            groups.setdefault(name[len(PREFIX):].rpartition("/")[0], []).append(name)
        return {g: sorted(names, key=lambda n: int(n.rpartition("/")[2])) for g, names in groups.items()}

    def _lead(self, group_id: str):
        import ray

        return ray.get_actor(group_name(group_id, 0), namespace=NAMESPACE)

    def lead_state(self, group_id: str) -> dict | None:
        """Rank 0's word on its group (``Worker.state``); None when rank 0 is dead or gone."""
        import ray

        try:
            return ray.get(self._lead(group_id).state.remote(), timeout=10)
        except (ValueError, ray.exceptions.RayError):
            return None

    def remove_group(self, group_id: str) -> None:
        """Its workers killed and its placement group removed."""
        import ray
        from ray.util.placement_group import get_placement_group, remove_placement_group

        for name in self.groups().get(group_id, []):
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE))
            except ValueError:         # gone meanwhile
                continue
        try:
            remove_placement_group(get_placement_group(group_name(group_id)))
        except ValueError:             # no such placement group (already removed)
            pass

    def kept_jobs(self) -> list[tuple[str, dict]]:
        """Every job the cluster's worker groups keep: (its group, the job)."""
        import ray

        found = []
        for group_id, names in self.groups().items():
            if not names[0].endswith("/0"):
                continue
            try:
                kept = ray.get(self._lead(group_id).jobs.remote(), timeout=10)
            except (ValueError, ray.exceptions.RayError):
                continue               # a group going away as we ask
            found += [(group_id, job) for job in kept]
        return found

    def journal(self, group_id: str, number: int, cursor: int, wait_s: float) -> dict | None:
        """A kept cell's journal from ``cursor`` on, held up to ``wait_s`` for news; None: not kept."""
        import ray

        return ray.get(self._lead(group_id).journal.remote(number, cursor, wait_s), timeout=wait_s + 20)

    def interrupt_job(self, group_id: str, number: int) -> None:
        """The stop button for every rank of the group's cell ``number``."""
        import ray

        for name in self.groups().get(group_id, []):
            try:
                ray.get_actor(name, namespace=NAMESPACE).interrupt.remote(number)
            except ValueError:          # gone meanwhile
                continue

    def node_answers(self, node_id: str) -> bool:
        """Whether the node still runs work: a worker can die alone (killed, out of memory) on a
        node that lives on. A task pinned there answers, or Ray finds the node dead."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def here() -> bool:
            return True

        pinned = NodeAffinitySchedulingStrategy(node_id, soft=False)
        probe = ray.remote(here).options(num_cpus=0, max_retries=0, scheduling_strategy=pinned).remote()
        deadline = time.monotonic() + NODE_DEATH_S
        while time.monotonic() < deadline:
            if node_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}:
                return False
            done, _ = ray.wait([probe], timeout=0.5)
            if done:
                try:
                    return ray.get(done[0])
                except Exception:  # noqa: BLE001 - the task could not run there: the node is going
                    return False
        return False

    def wait_gone(self, node_ids: list[str], until: float) -> None:
        """Until Ray no longer lists any of these nodes alive, or ``until`` (Unix time)."""
        import ray

        while time.time() < until:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            if node_ids and not alive & set(node_ids):
                return
            time.sleep(0.5)

    def room(self, kind: str, each: float) -> int:
        """How many workers of ``each`` GPU (or CPU) the cluster's resources hold now."""
        import ray

        return int(ray.cluster_resources().get(kind, 0) // each)

    def never_fits(self, workers: int, gpus_per_worker: float, grows: bool) -> None:
        from .placement import never_fits

        never_fits(workers, gpus_per_worker, grows)
