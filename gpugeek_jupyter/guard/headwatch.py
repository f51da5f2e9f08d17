"""The watchdog on a remote cluster's head: its budget cap and idle stop hold while the laptop is
closed, asleep or cut off.

``up`` starts it on the head, right after Ray (``onhost.py guard``: the part of this package that
``remote/headguard.py`` names, unpacked beside the cluster's token and run by the head's Python,
which has Ray). It keeps a ledger of its own on the head, metered from Ray's node table there
(a cloud's: from its provider's list of instances), and runs the laptop watchdog's ``Watch`` with
three differences:

- the stop goes through Ray: a task on every other node starts the stop of our processes there
  (``onhost.py stop``, by the cluster's marker, in a session of its own so that it outlives the
  raylet it ends); once those nodes have left Ray's table the ledger is closed, and the head
  stops itself the same way. On a cloud, the autoscaler is ended and the other instances are
  terminated through the provider's API; then the head ends itself as its cloud documents;
- idleness: the laptop's watchdog writes its verdict (a notebook's cells, a job's device
  readings) into the cluster's KV store at every look; while that report is fresh it is the
  verdict here, and once it stops coming the head judges by Ray's own idle clock;
- a budget or idle limit changed on the laptop reaches it through the same KV store.

It writes a heartbeat there too (spend, the limits it enforces, a stop under way), by which the
laptop knows the cluster is guarded. The laptop's ledger copies this one whenever it reaches the
head (``headguard.pull``).

    python -m gpugeek_jupyter.guard.headwatch ORDER.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..cluster import registry
from ..cluster.processes import MARKER  # onhost.py's too; a str, as the stop's task is pickled by value
from ..meter import activity, ledger
from ..raynodes import ClusterUnreachable, kv_get, kv_put, read_nodes
from ..remote.headguard import ACTIVITY, HEARTBEAT, LIMITS, fresh
from ..remote.ssh import host_script
from . import launches
from .jobend import JobEnd
from .keeping import Keeper
from .lifecycle import LET_GO_S
from .watchdog import UNREACHABLE_LIMIT, Watch, run

HEAD_STOP_ALLOWANCE_S = 10.0   # a stop from the head (a Ray driver, a task per node, the nodes gone) not yet timed
STOP_MARGIN_S = 0.6            # a stop beyond its rehearsal: the grace before SIGKILL, the nodes leaving Ray's table
REHEARSE_NEAR_S = 60.0         # … timed again once the cap is this near at the burn: under the load of then
NODES_GONE_S = 30.0            # how long the head waits for the other nodes to leave Ray's table

# a grandchild in a session of its own: Ray ends a worker's children with it, and the stop ends
# the raylet that started the worker; the script (onhost.py) comes on stdin
_DETACHED = ("import os, sys\nif os.fork():\n    os._exit(0)\nos.setsid()\n"
             "exec(compile(sys.stdin.read(), 'onhost.py', 'exec'))")


class HeadWatch(Watch):
    """``Watch`` as it runs on the head: see the module's docstring."""

    def __init__(self, cluster_id: int, interval: float, order: dict, keeper: Keeper | None = None):
        super().__init__(cluster_id, interval)
        self.order = order
        self.keeper = keeper
        self.gcs = order["gcs"]
        self.stop_allowance = HEAD_STOP_ALLOWANCE_S
        self.stop = self._stop_other_nodes
        self.cloud = None
        if order.get("cloud"):      # a cloud's head alone imports the clouds' code (an ssh or Slurm head need not)
            from .cloudhead import CloudHead

            self.cloud = CloudHead(cluster_id, order, temp_dir_of(order["temp_dirs"], order["ip"]))
            self.stop = self._stop_cloud_workers
        self.report: dict | None = None
        self.guard_kind = "head"
        self.rehearsed: frozenset[str] = frozenset()   # the nodes a stop was last timed on
        self.near: float | None = None                 # the cap a stop was timed again near
        # a Slurm job's end near (its walltime, a preemption): the nodes told, the job requeued
        self.job_end = JobEnd(cluster_id, order["home"], self.gcs, interval) if order.get("scheduled") else None

    def look(self) -> str | None:
        """The laptop's report and limits read, the look, then the heartbeat: it follows only a
        look that saw the cluster, so a watchdog that fails every look never passes for alive."""
        record = registry.get(self.cluster_id)
        exchanging = record.live and not record.stopping
        if exchanging:
            self._exchange(record)
            said = self.keeper.tend() if self.keeper is not None else None
            if said:
                ledger.event(self.cluster_id, "keeper", said)
        reason = super().look()
        if exchanging and not reason and self.job_end is not None:
            self.job_end.look(record, self.cluster_jobs)
        if exchanging and not reason and self.cloud is not None:
            self.cloud.look_at_launches(record)     # what its autoscaler could not launch
        if exchanging and not reason and self.blind is None:
            self._beat(record)
        return reason

    def _exchange(self, record) -> None:
        """Read the laptop's report and limits (a GCS that does not answer is the node table's
        business: ``_read`` counts it)."""
        try:
            self.report = kv_get(self.gcs, ACTIVITY, timeout=self.interval)
            limits = kv_get(self.gcs, LIMITS, timeout=self.interval)
        except ClusterUnreachable:
            return
        if limits and (limits.get("budget"), limits.get("idle")) != (record.budget_usd, record.idle_minutes):
            registry.update(self.cluster_id, budget_usd=limits.get("budget"), idle_minutes=limits.get("idle"))
            ledger.event(self.cluster_id, "limits", f"limits set from the notebook: budget "
                         f"{limits.get('budget')}, idle {limits.get('idle')} min")
            self.warned = bool(ledger.events(self.cluster_id, "budget-warning"))

    def _beat(self, record) -> None:
        now = time.time()
        try:
            kv_put(self.gcs, HEARTBEAT, {"at": now, "pid": os.getpid(), "every": self.interval,
                                         "spent": ledger.spend(self.cluster_id, now),
                                         "budget": registry.get(self.cluster_id).budget_usd,
                                         "news": launches.news(self.cluster_id)})
        except ClusterUnreachable:
            pass

    def _gcs(self, record) -> str:
        return self.gcs

    def _head_guards(self, record, now: float) -> bool:
        return False                 # this is the head's watchdog: it enforces

    def _read(self, record):
        try:
            nodes = read_nodes(self.gcs, timeout=max(1.0, self.interval))
            self.misses = 0
            self._rehearse(record, nodes)
            return nodes
        except ClusterUnreachable as exc:
            self.misses += 1
            self.blind = f"the head's GCS does not answer: {exc}"
        if self.misses >= UNREACHABLE_LIMIT:       # the head's own GCS is gone: so is the cluster
            ledger.event(self.cluster_id, "lost", "the head's GCS stopped answering — stopping what is left")
            at = time.time()
            ledger.end_all_nodes(self.cluster_id, at, "lost")
            registry.mark_stopped(self.cluster_id, "lost: the head stopped answering", at)
            return "lost"
        return None

    def _idleness(self, record, nodes, now: float) -> activity.Idleness:
        if fresh(self.report, now):
            idle = activity.Idleness(self.report.get("since"), self.report.get("why") or "as the notebook sees it")
            if (idle.since, idle.why) != (record.idle_since, record.idle_why):
                registry.note_idleness(self.cluster_id, idle.since, idle.why)
            return idle
        return super()._idleness(record, nodes, now)

    def _say_stopping(self) -> None:
        """Into the heartbeat: a notebook's watchdog passes it on, and its kernels let go first."""
        try:
            kv_put(self.gcs, HEARTBEAT, {"at": time.time(), "pid": os.getpid(), "every": self.interval,
                                         "stopping": True})
        except ClusterUnreachable:
            return
        if fresh(self.report, time.time()):
            time.sleep(LET_GO_S)    # a laptop still watching hears of the stop first, as its kernels do

    def _stop_cloud_workers(self, record, grace: float) -> None:
        """A cloud's workers are instances, ended through its API (``CloudHead.stop_workers``)."""
        self._say_stopping()
        self.cloud.stop_workers(record, lambda: end_autoscaler(self.order["marker"]))

    def _rehearse(self, record, nodes) -> None:
        """Time a stop's Ray part (a driver, a task on every other node) once the nodes are there,
        so that a budget stop starts as far ahead of the cap as a stop takes here, not a guess."""
        others = [n for n in nodes if n.alive and not n.is_head]
        if self.order.get("cloud") or not record.budget_usd or not others:
            return
        burn = ledger.burn_rate(self.cluster_id)
        near = burn > 0 and self.near != record.budget_usd and \
            (record.budget_usd - ledger.spend(self.cluster_id)) / burn * 3600 <= REHEARSE_NEAR_S
        if frozenset(n.node_id for n in others) <= self.rehearsed and not near:
            return
        self.rehearsed = frozenset(n.node_id for n in others)
        if near:
            self.near = record.budget_usd
        import ray  # noqa: F401 - imported before the clock starts: a stop finds it imported
        started = time.monotonic()
        try:
            self._on_other_nodes(others, _here)
        except Exception as exc:  # noqa: BLE001 - Ray's errors are many; the untimed allowance stays
            print(f"head's watchdog: the stop's rehearsal failed ({exc}); a budget stop starts "
                  f"{self.stop_allowance:.0f} s ahead", flush=True)
            return
        took = time.monotonic() - started
        self.stop_allowance = took + STOP_MARGIN_S
        ledger.event(self.cluster_id, "guard", f"a stop from the head takes about {self.stop_allowance:.1f} s on "
                                               f"{len(others) + 1} nodes (rehearsed{' near the cap' if near else ''}: "
                                               f"{took:.1f} s to reach them); a budget stop starts that far ahead "
                                               f"of the cap")

    def _on_other_nodes(self, others, fn, *args) -> None:
        """``fn(*args)`` as a task on each of these nodes, from a Ray driver here, for up to half
        of ``NODES_GONE_S``."""
        import ray
        from ray import cloudpickle
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the nodes need not have this package
        task = ray.remote(num_cpus=0, max_retries=0)(fn)
        ray.init(address=self.gcs, logging_level="ERROR", log_to_driver=False)
        try:
            done = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
                    .remote(*args) for n in others]
            ray.wait(done, num_returns=len(done), timeout=NODES_GONE_S / 2)
        finally:
            ray.shutdown()

    def _stop_other_nodes(self, record, grace: float) -> None:
        """Every node but this one stopped through Ray; raises when some are still in Ray's table
        after ``NODES_GONE_S`` (the stop is then retried at the next look)."""
        self._say_stopping()
        end_autoscaler(self.order["marker"])
        others = [n for n in read_nodes(self.gcs) if n.alive and not n.is_head]
        if not others:
            return
        self._on_other_nodes(others, _stop_here, host_script(), self.order["marker"], grace,
                             self.order["temp_dirs"])
        deadline = time.monotonic() + NODES_GONE_S
        while time.monotonic() < deadline:
            if not any(n.alive and not n.is_head for n in read_nodes(self.gcs)):
                return
            time.sleep(0.5)
        left = [n.node_id[:8] for n in read_nodes(self.gcs) if n.alive and not n.is_head]
        raise RuntimeError(f"nodes {', '.join(left)} are still in Ray's table {NODES_GONE_S:.0f} s after their stop")


def end_autoscaler(marker: str) -> list[int]:
    """End the Ray autoscaler of ours on this head, if one runs (your own machines through Ray's
    on-premise provider): it would start the nodes' Ray again as soon as the stop ends it."""
    from ..onhost import script as onhost

    ended = []
    for pid in onhost.ours(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"autoscaler" not in f.read():
                    continue
            os.kill(pid, 15)
            ended.append(pid)
        except OSError:
            continue
    return ended


def temp_dir_of(temp_dirs: dict, ip: str) -> str:
    return (temp_dirs.get(ip) or temp_dirs.get("*", "")).replace("{ip}", ip)


def _here() -> None:
    """The rehearsal's task: reaching the node is all it times."""


def _stop_here(source: str, marker: str, grace: float, temp_dirs: dict) -> str:
    """On a node: start the stop of our processes here, detached; returns the node's address."""
    import ray

    ip = ray.util.get_node_ip_address()
    return stop_detached(source, marker, grace, temp_dir_of(temp_dirs, ip))


def stop_detached(source: str, marker: str, grace: float, temp_dir: str) -> str:
    """``onhost.py stop`` for this host's processes of the cluster, in a session of its own and
    without the marker (so it is not among what it stops)."""
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    proc = subprocess.Popen([sys.executable, "-c", _DETACHED, "stop", marker, str(grace), temp_dir],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    proc.communicate(source.encode(), timeout=30)
    return temp_dir


def open_record(order: dict) -> int:
    """The cluster's row in the head's registry: made on first start, found again on a restart
    (a requeued Slurm job's next run: its GCS elsewhere)."""
    for record in registry.all_records(include_stopped=False):
        if record.name == order["name"]:
            if record.address != order["gcs"]:
                registry.update(record.id, address=order["gcs"])
            return record.id
    record = registry.create(order["name"], order["backend"], order["spec"], simulated=False,
                             budget_usd=order.get("budget"), idle_minutes=order.get("idle"))
    registry.update(record.id, address=order["gcs"], created=order["created"], ready=time.time())
    ledger.event(record.id, "guard", f"the head's watchdog runs (pid {os.getpid()}): budget and idle stop hold "
                                     f"without the notebook's machine")
    return record.id


def main(argv: list[str]) -> int:
    ledger.acting_as("head watchdog")
    order = json.loads(Path(argv[1]).read_text())
    cluster_id = open_record(order)
    keeper = Keeper(order, Path(os.path.expanduser(order["home"])))
    if keeper.wanted:
        ledger.event(cluster_id, "keeper", f"the keeper starts (pid {keeper.start()}): kernels reach the cluster "
                                           f"through it, on the head's loopback port {keeper.order['port']}")
    watch = HeadWatch(cluster_id, order.get("interval") or 2.0, order, keeper)
    if order.get("scheduled"):
        # a Slurm allocation: its keeper ends with this process, whether the job ends it (SIGTERM) or
        # this ends first — a keeper left orphaned would leave the job's process tree and outlive it
        # (at once: an exit raised here could be taken for a failed look and the watchdog go on)
        signal.signal(signal.SIGTERM, lambda *_: (keeper.kill_now(), os._exit(0)))
    reason = run(cluster_id, watch=watch)
    if order.get("scheduled"):     # the batch step ends the job once this ends
        keeper.stop()
        print(f"head watchdog: cluster {order['name']} stopped ({reason}); the job ends", flush=True)
        return 0
    print(f"head watchdog: cluster {order['name']} stopped ({reason}); stopping this host", flush=True)
    if watch.cloud is not None:       # the head is a cloud's instance: it ends itself
        watch.cloud.end_head()
    stop_detached(host_script(), order["marker"], 2.0,
                  temp_dir_of(order["temp_dirs"], order["ip"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
