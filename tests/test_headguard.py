"""The head's watchdog, the parts that need no cluster: the package it runs, the ledger it hands
back, the limits a notebook changes, and what a cloud head is told. (It runs for real, laptop
gone, in tests/lab/test_head_guard.py.)"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tarfile
import time

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter import store
from gpugeek_jupyter.backends import launcher
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.raynodes import RayNode
from gpugeek_jupyter.remote import headguard, ssh
from gpugeek_jupyter.vocab import NodePrice


def _reached_from(*entries: str) -> set[str]:
    """Every module of ours that importing ``entries`` can load (in any function, too)."""
    from test_layers import ROOT, graph, reachable

    edges = graph()
    needed = set().union(*(reachable(f"{ROOT}.{entry}", edges) for entry in entries))
    # any import of ours runs the package's __init__ first: its module-level imports are needed too
    # (the imports in its functions load on first use, which the head never makes)
    first = ast.parse((headguard.PACKAGE / "__init__.py").read_text())
    for node in first.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            needed |= reachable(f"{ROOT}.{node.module}", edges)
    return needed


def _modules(files) -> set[str]:
    from test_layers import ROOT

    return {".".join([ROOT, *file.with_suffix("").parts]).removesuffix(".__init__") for file in files}


def test_the_heads_package_is_exactly_what_its_watchdog_imports():
    """``HEAD_PACKAGE`` names what the head needs: every module the head's watchdog reaches (in any
    function, too) is in it, and the host script it reads as text for each node's stop
    (``ssh.ONHOST``); every entry holds one of them — no stale name, nothing extra."""
    needed = _reached_from("guard.headwatch")
    read = ssh.ONHOST.relative_to(headguard.PACKAGE)
    watchdogs = headguard.head_files(headguard.HEAD_PACKAGE)
    assert read in watchdogs, f"the head's watchdog reads {read}, which HEAD_PACKAGE leaves out"
    shipped = _modules(watchdogs)      # the script is imported too (`ours`), and read
    missing = needed - shipped
    assert not missing, f"the head's watchdog imports what HEAD_PACKAGE leaves out: {sorted(missing)}"
    packages = {m for m in shipped if (headguard.PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}
    extra = shipped - needed - packages
    assert not extra, f"HEAD_PACKAGE ships what the head never imports: {sorted(extra)}"


def test_the_keepers_part_is_exactly_what_the_keeper_imports_besides():
    """``KEEPER_PACKAGE`` holds every module the keeper reaches that ``HEAD_PACKAGE`` does not, and
    nothing else: not a kernel's rooms (``cells/``, ``kernel/``), which a head never runs."""
    watchdogs = _modules(headguard.head_files(headguard.HEAD_PACKAGE))
    needed = _reached_from("keeper.serve", "keeper.desk") - watchdogs
    shipped = _modules(headguard.head_files(headguard.KEEPER_PACKAGE)) - watchdogs
    missing = needed - shipped
    assert not missing, f"the keeper imports what KEEPER_PACKAGE leaves out: {sorted(missing)}"
    packages = {m for m in shipped if (headguard.PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}
    extra = shipped - needed - packages
    assert not extra, f"KEEPER_PACKAGE ships what the keeper never imports: {sorted(extra)}"


def test_the_package_sent_to_the_head_runs_the_watchdog_and_the_keeper_from_itself(tmp_path):
    """The archive holds the watchdog's part and the keeper's (its groups, probes, the line), never
    the notebook's (widgets, magics, a kernel's cells and session, what a kernel asks for, the
    server); each runs from it alone."""
    with tarfile.open(fileobj=io.BytesIO(headguard.package_archive()), mode="r:gz") as tar:
        tar.extractall(tmp_path)
    sent = {p.relative_to(tmp_path / "gpugeek_jupyter").parts[0] for p in tmp_path.rglob("*.py")}
    never = {"widgets", "magics", "provision", "api.py", "server", "catalog", "sizing", "views", "cells", "kernel"}
    assert not sent & never, sent
    for entry, module in (("guard.headwatch", "guard.watchdog"), ("keeper.serve", "keeper.desk")):
        done = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import ray\n"
             f"import gpugeek_jupyter.{entry} as h\n"
             "print(h.__file__); print(sorted(m for m in sys.modules if m.startswith('gpugeek_jupyter.')))"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        where, loaded = done.stdout.splitlines()
        assert where.startswith(str(tmp_path)), where
        assert f"gpugeek_jupyter.{module}" in loaded and "gpugeek_jupyter.provision" not in loaded


def test_the_heads_stop_strips_the_marker_the_host_script_finds_its_processes_by():
    """Each node's stop starts without the cluster's marker (``headwatch.stop_detached``), so it is
    not among what it stops: the name the head strips (``cluster/processes.py``'s) is the one
    ``onhost.py`` marks Ray with and looks for."""
    from gpugeek_jupyter.guard import headwatch

    assert headwatch.MARKER == onhost.MARKER


def _a_cluster(name="c", budget=None) -> registry.ClusterRecord:
    record = registry.create(name, "ssh", ClusterSpec("ssh").to_json(), simulated=False, budget_usd=budget,
                             idle_minutes=None)
    registry.update(record.id, address="127.0.0.1:1")
    return registry.get(record.id)


def _nodes(now: float, ended: float | None) -> list[RayNode]:
    return [RayNode(f"{i:02d}" * 14, "host", ended is None, i == 0, now - 100 - i, ended, None, "", {"CPU": 1.0})
            for i in range(3)]


def test_the_heads_ledger_handed_back_over_ssh_becomes_the_laptops(tmp_path, monkeypatch):
    """``onhost.py ledger`` reads the head's database (standard library only); ``adopt`` makes it
    this machine's: the nodes as the head closed them, its events once."""
    now = time.time()
    price = {"host": NodePrice("", "on-demand", 36.0, 36.0)}
    head_home = tmp_path / "head"
    monkeypatch.setenv("GPUGEEK_HOME", str(head_home))
    on_head = _a_cluster("lab")
    ledger.sync_nodes(on_head.id, _nodes(now, None), price)
    ledger.event(on_head.id, "budget-stop", "budget $3.00 reached")
    ledger.end_all_nodes(on_head.id, now, "budget cap reached")
    registry.mark_stopped(on_head.id, "budget cap reached", now)
    head_spend = ledger.spend(on_head.id, now + 50)

    done = subprocess.run([sys.executable, "-", "ledger", str(head_home), "lab"], input=onhost.__loader__.get_data(
        onhost.__file__).decode(), capture_output=True, text=True, timeout=30)
    dump = json.loads(done.stdout)
    assert dump["cluster"]["stop_reason"] == "budget cap reached" and len(dump["nodes"]) == 3

    monkeypatch.setenv("GPUGEEK_HOME", str(tmp_path / "laptop"))
    mine = _a_cluster("lab")
    ledger.sync_nodes(mine.id, _nodes(now, None), price)     # what the laptop saw before it went
    assert ledger.spend(mine.id, now + 50) > head_spend, "the open nodes bill on here"
    for _ in range(2):
        ledger.adopt(mine.id, dump["nodes"], dump["events"])
    assert ledger.spend(mine.id, now + 50) == pytest.approx(head_spend, rel=1e-12)
    assert [e["kind"] for e in ledger.events(mine.id)] == ["budget-stop"], "an event was copied twice"
    assert store.query("SELECT COUNT(*) FROM events WHERE shown=0")[0][0] == 1, "the notebook has not seen it"


def test_a_row_closed_here_is_not_reopened_by_a_heads_copy_that_still_has_it_open(gpugeek_home):
    """A head ended before it could close a row (a requeued Slurm job's earlier run): this ledger
    closed it from the scheduler's record, and adopting the head's stale copy keeps that end; a
    row the head did close takes the head's end."""
    now = time.time()
    price = {"host": NodePrice("", "on-demand", 36.0, 36.0)}
    record = _a_cluster("lab")
    ledger.sync_nodes(record.id, _nodes(now, None), price)
    rows = store.query("SELECT node_id, node_type, offer_id, pricing, usd_per_hour, on_demand_usd_per_hour, gpus, "
                       "started, ended, end_reason FROM nodes WHERE cluster_id=? ORDER BY node_id", (record.id,))
    columns = ("node_id", "node_type", "offer_id", "pricing", "usd_per_hour", "on_demand_usd_per_hour", "gpus",
               "started", "ended", "end_reason")
    stale = [dict(zip(columns, row, strict=True)) for row in rows]        # the head's copy: all open
    ledger.end_all_nodes(record.id, now + 10, "requeued")                 # closed here meanwhile
    closed_by_head = dict(stale[0], ended=now + 5, end_reason="head's stop")
    ledger.adopt(record.id, [closed_by_head, *stale[1:]], [])
    ends = [tuple(r) for r in store.query("SELECT ended, end_reason FROM nodes WHERE cluster_id=? ORDER BY node_id",
                                          (record.id,))]
    assert ends[0] == (now + 5, "head's stop"), ends
    assert all(end == (now + 10, "requeued") for end in ends[1:]), ends


def test_the_heads_events_adopted_after_the_laptops_are_listed_in_the_order_they_happened(gpugeek_home):
    """The head's guard started before ``up`` returned; its event reaches the laptop's ledger
    later. ``status`` (the CLI's, the sidebar's) lists both by the moment they happened."""
    from gpugeek_jupyter.guard import board

    now = time.time()
    record = _a_cluster("lab")
    ledger.event(record.id, "up", "3 hosts", at=now - 60)
    ledger.adopt(record.id, [], [{"at": now - 67, "kind": "guard", "message": "head watchdog started"}])
    seen = board.detail("lab", now=now)["events"]
    assert [e["kind"] for e in seen] == ["up", "guard"], "newest first, by when each happened"
    assert [e["kind"] for e in ledger.events(record.id)] == ["guard", "up"]


def test_limits_change_a_live_cluster_and_bad_ones_are_one_line(ipython):
    record = _a_cluster("mine", budget=5.0)
    gg.limits("mine", idle=30)
    changed = registry.get(record.id)
    assert (changed.budget_usd, changed.idle_minutes) == (5.0, 30.0)
    ipython.run_line_magic("gpugeek", "limits --budget 12.5 mine")
    assert registry.get(record.id).budget_usd == 12.5
    assert "budget $12.50, idle stop 30 min" in ledger.events(record.id, "limits")[-1]["message"]
    with pytest.raises(gg.GpugeekError, match="give --budget USD, --idle MINUTES or both"):
        gg.limits("mine")
    with pytest.raises(gg.GpugeekError, match=r"--budget -1 must be a number > 0"):
        gg.limits("mine", budget=-1)
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--budget"):
        ipython.run_line_magic("gpugeek", "limits --budget lots mine")


def test_a_cloud_head_starts_its_watchdog_from_what_the_launcher_copies(gpugeek_home):
    spec = ClusterSpec("aws")
    record = registry.create("cloudy", "aws", spec.to_json(), simulated=False, budget_usd=40.0, idle_minutes=15.0)
    guard = launcher.guard_order(record, spec)
    folder = launcher.write_node_files("cloudy", guard)
    assert json.loads((folder / launcher.GUARD_ORDER).read_text())["budget"] == 40.0
    assert guard["gcs"] == "{head_ip}:6379" and guard["home"].startswith(launcher.node_dir("cloudy"))
    assert (folder / "package" / "gpugeek_jupyter" / "guard" / "headwatch.py").exists()
    head_start, worker_start = launcher.start_commands("cloudy", record.marker)
    assert head_start.endswith(f"onhost.py guard @{launcher.node_dir('cloudy')}/{launcher.GUARD_ORDER}")
    assert "guard" not in worker_start


def test_a_tunnel_that_forwards_to_nothing_is_told_from_one_that_reaches_a_server():
    """SSH accepts a connection at the tunnel's end and closes it at once when nothing listens at
    the head's port; Ray's own client would wait ~35 s to find that out."""
    import socket
    import threading

    from gpugeek_jupyter.remote import tunnel

    def serve(close_at_once: bool):
        server = socket.create_server(("127.0.0.1", 0))
        held = []

        def accept():
            conn, _ = server.accept()
            conn.close() if close_at_once else held.append(conn)     # a server waits for the client

        threading.Thread(target=accept, daemon=True).start()
        return server, held

    dead, _ = serve(close_at_once=True)
    alive, held = serve(close_at_once=False)
    try:
        assert not tunnel.forwards(f"127.0.0.1:{dead.getsockname()[1]}")
        assert tunnel.forwards(f"127.0.0.1:{alive.getsockname()[1]}")
        free = socket.create_server(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        assert not tunnel.forwards(f"127.0.0.1:{port}"), "nothing listens there"
    finally:
        dead.close()
        alive.close()
        for conn in held:
            conn.close()


def test_the_heads_heartbeat_follows_only_a_look_that_saw_the_cluster(gpugeek_home, monkeypatch):
    """A head watchdog that fails every look must not pass for alive (the laptop's watchdog stops
    enforcing while the heartbeat is fresh): no heartbeat after a failed look, one after a good one;
    after 3 failed looks its failing state is written for the readers."""
    from gpugeek_jupyter.guard import clusterjobs, headwatch, health
    from gpugeek_jupyter.guard.watchdog import run

    now = time.time()
    order = {"name": "hb", "backend": "ssh", "spec": ClusterSpec("ssh").to_json(), "gcs": "127.0.0.1:1",
             "created": now, "marker": "m", "temp_dirs": {}, "ip": "127.0.0.1", "interval": 0.05}
    cluster_id = headwatch.open_record(order)
    beats, failing = [], {"on": True}
    monkeypatch.setattr(headwatch, "kv_get", lambda *a, **k: None)
    monkeypatch.setattr(headwatch, "kv_put", lambda gcs, key, value, **k: beats.append(key))
    # no jobs in a KV store: nothing listens at 127.0.0.1:1, and Ray's client would wait ~40 s to say so
    monkeypatch.setattr(clusterjobs, "kv_all", lambda *args, **kwargs: {})

    def nodes(*args, **kwargs):
        if failing["on"]:
            raise RuntimeError("the node reader broke")
        return _nodes(time.time(), None)
    monkeypatch.setattr(headwatch, "read_nodes", nodes)
    watch = headwatch.HeadWatch(cluster_id, 0.05, order)
    monkeypatch.setattr(watch, "_held", lambda record: False)     # no Ray at 127.0.0.1:1 to ask
    for _ in range(3):
        with pytest.raises(RuntimeError):
            watch.look()
        watch.failed("RuntimeError: the node reader broke")
    assert beats == [], "a failed look wrote a heartbeat"
    state = health.failing(cluster_id)
    assert state["looks"] == 3 and state["by"] == "head's watchdog"
    assert "guard-failing" in [e["kind"] for e in ledger.events(cluster_id)]
    failing["on"] = False
    watch.look()
    watch.looked()
    assert beats == [headwatch.HEARTBEAT]
    assert health.failing(cluster_id) is None, "the failing state outlived a good look"
    registry.mark_stopped(cluster_id, "test over")
    assert run(cluster_id, watch=watch) == "test over"


def test_every_heads_heartbeat_carries_its_news_a_slurm_heads_walltime_too(gpugeek_home, monkeypatch):
    """The news a head's heartbeat carries to the notebook's machine (``launches.news``): a cloud
    head's launch refusals, and a Slurm head's walltime, preemption and requeue — any head's."""
    from gpugeek_jupyter.guard import headwatch, launches

    now = time.time()
    order = {"name": "wall", "backend": "slurm", "spec": ClusterSpec("slurm").to_json(), "gcs": "127.0.0.1:1",
             "created": now, "marker": "m", "temp_dirs": {}, "ip": "127.0.0.1", "interval": 0.05}
    cluster_id = headwatch.open_record(order)
    ledger.event(cluster_id, launches.WALLTIME, "Slurm job 7 reaches its walltime", options={"end": now + 60})
    beats = []
    monkeypatch.setattr(headwatch, "kv_put", lambda gcs, key, value, **k: beats.append(value))
    headwatch.HeadWatch(cluster_id, 0.05, order)._beat(registry.get(cluster_id))
    assert [n["kind"] for n in beats[0]["news"]] == [launches.WALLTIME], beats
