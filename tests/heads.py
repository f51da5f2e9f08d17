"""A cluster's head on this machine, started as a remote head is: the host script's ``start`` (Ray,
without a Ray Client server) and ``guard`` (the head's watchdog, which starts the keeper), both
fed their script on stdin as SSH feeds it, the package sent along as an archive and run from
there. For the line's tests that need no lab: the kernel (the test's process) dials the keeper on
the loopback directly — a remote head's keeper is dialled through the cluster's SSH tunnel, which
``tunnel.ensure`` opens; here it returns the record as it is.

What a head left behind is counted by the process sessions its start and guard reported, and the
keeper's own (its pid from its welcome), never by the cluster's marker.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.remote import Guarded, Remote, learn
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.raynodes import HEAD_ENV, token_text
from gpugeek_jupyter.remote import headguard, ssh


def onhost(command: str, *args: str, token: str | None = None, package: str | None = None,
           timeout: float = 200) -> dict:
    """``onhost.py COMMAND ARGS`` as SSH runs it on a host: the script on stdin (``python -``)."""
    script = ssh.host_script()
    if token is not None:
        script = f"TOKEN = {token!r}\n{script}"
    if package is not None:
        script = f"PACKAGE = {package!r}\n{script}"
    done = subprocess.run([sys.executable, "-", command, *args], input=script, capture_output=True, text=True,
                          timeout=timeout)
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class Head:
    record: registry.ClusterRecord
    folder: str               # the head's folder (token, logs, the watchdog's and keeper's homes)
    pids: list[int]           # what `start` and `guard` reported
    sessions: set[int] = field(default_factory=set)

    @property
    def keeper_log(self) -> str:
        path = os.path.join(self.folder, "head", "keeper.log")
        return open(path).read() if os.path.exists(path) else ""

    def keeper_pid(self) -> int | None:
        """The keeper's pid, read from the process table: the one child of the watchdog that runs it."""
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                if "gpugeek_jupyter.keeper.serve" in " ".join(proc.info["cmdline"] or []) and \
                        os.path.join(self.folder, "head", "keeper.json") in (proc.info["cmdline"] or []):
                    return proc.info["pid"]
            except psutil.Error:
                continue
        return None

    def processes(self) -> list[psutil.Process]:
        """Every process in the sessions the head's start reported, and the keeper's."""
        sessions = set(self.sessions)
        keeper = self.keeper_pid()
        if keeper is not None:
            sessions.add(os.getsid(keeper))
            self.sessions.add(os.getsid(keeper))
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (OSError, psutil.Error):
                continue
        return found


@contextmanager
def head(name: str, home, cpus: int = 2, budget: float | None = None, idle: float | None = None):
    """A head named ``name`` under ``home`` (a registry record of an ``ssh`` cluster on one host,
    this machine); stopped at the end, and nothing of it left running (asserted)."""
    token = token_text()
    record = registry.create(name, "ssh", ClusterSpec("ssh").to_json(), simulated=False, budget_usd=budget,
                             idle_minutes=idle)
    folder = str(home / "head-side" / name)
    order = {"role": "head", "marker": record.marker, "temp_dir": f"/tmp/gg-test-{os.getpid()}-{record.id}",
             "ip": "127.0.0.1", "gpus": 0, "cpus": cpus, "token_path": f"{folder}/auth_token", "node_type": "host",
             "port": 6379, "keeper_port": 10002, "free_ports": True, "timeout": 120, "env": HEAD_ENV}
    started = onhost("start", json.dumps(order), token=token)
    assert started.get("ok"), started
    spec = ClusterSpec("ssh", remote=Remote(
        hosts=("root@127.0.0.1",), head_ip="127.0.0.1", ips=("127.0.0.1",), gcs_port=started["port"],
        keeper_port=started["keeper_port"], line_address=f"127.0.0.1:{started['keeper_port']}",
        token_path=order["token_path"], temp_dirs=(order["temp_dir"],), pythons=(sys.executable,), gpus_per_host=0))
    registry.update(record.id, spec=spec.to_json(), address=f"127.0.0.1:{started['port']}")
    record = registry.get(record.id)
    told = headguard.order(record, spec, 1.0, ip="127.0.0.1", gcs_port=started["port"],
                           temp_dirs={"127.0.0.1": order["temp_dir"]}, token_path=order["token_path"])
    guard = onhost("guard", json.dumps(told), package=base64.b64encode(headguard.package_archive()).decode())
    learn(spec, Guarded(guard_home=told["home"], guard_pid=guard.get("pid")), record_id=record.id, ready=time.time())
    made = Head(registry.get(record.id), folder, [*started["pids"], guard.get("pid", 0)])
    made.sessions = {os.getsid(pid) for pid in made.pids if psutil.pid_exists(pid)}
    try:
        assert guard.get("ok"), guard
        yield made
    finally:
        made.processes()          # the keeper's session, while it still runs
        onhost("stop", record.marker, "2", order["temp_dir"])
        deadline = time.monotonic() + 20
        while (left := made.processes()) and time.monotonic() < deadline:
            time.sleep(0.3)
        for proc in left:
            proc.kill()
        registry.mark_stopped(record.id, "the test ended")
        assert not left, f"the head left {[(p.pid, p.name()) for p in left]}"
