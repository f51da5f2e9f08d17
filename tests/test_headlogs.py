"""A head whose watchdog cannot start: the kernel says what failed there, in one line, from the
head's own log — not a guess at the token. The head is this machine, started as a remote head is
(the host script's ``guard`` with the package sent as an archive, run by the head's Python), SSH
runs the command here, and the tunnel is a listener that accepts and closes at once, as SSH does
when nothing listens behind it on the head."""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import tarfile
import time

import heads
import psutil
import pytest
from cluster_processes import wait_until

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.remote import Guarded, Remote, learn
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.kernel import headlogs
from gpugeek_jupyter.provision import up
from gpugeek_jupyter.remote import headguard, ssh, tunnel

# what a Python older than the code imports fails with (datetime.UTC is 3.11's)
BROKEN = "from datetime import UTC_OF_A_LATER_PYTHON\n"


def _broken_archive() -> str:
    """The head's package, its watchdog failing as it imports, as base64 (``guard``'s ``PACKAGE``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for file in headguard.head_files():
            data = (headguard.PACKAGE / file).read_bytes()
            if file.as_posix() == "guard/headwatch.py":
                data = data.replace(b"from __future__ import annotations\n",
                                    b"from __future__ import annotations\n" + BROKEN.encode(), 1)
            info = tarfile.TarInfo(f"{headguard.PACKAGE.name}/{file.as_posix()}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
def no_keeper_behind():
    """The tunnel's end here: it accepts, and closes at once (nothing listens on the head)."""
    from test_wire import _closing_listener

    listener = _closing_listener(read=0)
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_head_whose_watchdog_cannot_import_is_said_in_one_line_and_the_cluster_stopped(
        tmp_path, monkeypatch, no_keeper_behind):
    monkeypatch.setattr(ssh, "argv", lambda target, key, *remote, known_hosts=None: ["bash", "-c", *remote])
    monkeypatch.setattr(tunnel, "ensure", lambda record: record)
    folder = str(tmp_path / "head-side")
    record = registry.create("thin", "ssh", ClusterSpec("ssh").to_json(), simulated=False, budget_usd=None,
                             idle_minutes=None)
    spec = ClusterSpec("ssh", remote=Remote(
        hosts=("root@127.0.0.1",), head_ip="127.0.0.1", ips=("127.0.0.1",), gcs_port=1, keeper_port=2,
        line_address=no_keeper_behind, token_path=f"{folder}/auth_token", temp_dirs=(str(tmp_path / "gg-ray"),),
        pythons=(sys.executable,), gpus_per_host=0))
    registry.update(record.id, spec=spec.to_json(), address="127.0.0.1:1", ready=time.time())
    record = registry.get(record.id)
    told = headguard.order(record, spec, 1.0, ip="127.0.0.1", gcs_port=1,
                           temp_dirs={"127.0.0.1": spec.remote.temp_dirs[0]}, token_path=spec.remote.token_path)
    began = time.monotonic()
    guard = heads.onhost("guard", json.dumps(told), package=_broken_archive())
    try:
        if guard.get("ok"):     # it died after guard's first second (importing Ray first): as on a slow head
            learn(spec, Guarded(guard_home=told["home"], guard_pid=guard["pid"]), record_id=record.id)
        with pytest.raises(GpugeekError) as failed:
            up._connected("thin")
        said = str(failed.value)
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        assert said.startswith(f"cluster 'thin': the head's watchdog could not start on Python {python}: ImportError: "
                               f"cannot import name 'UTC_OF_A_LATER_PYTHON' from 'datetime'"), said
        assert f"its log: root@127.0.0.1:{folder}/head/watchdog.log" in said, said
        assert "what had started was stopped" in said and "token" not in said and "\n" not in said, said
        assert time.monotonic() - began < headlogs.LOOK_FIRST_S + 30, "the kernel waited out the keeper"
        assert registry.get(record.id).stopped is not None, "the cluster was left running"
    finally:
        if guard.get("pid"):
            wait_until(lambda: not psutil.pid_exists(guard["pid"]) or
                       psutil.Process(guard["pid"]).status() == psutil.STATUS_ZOMBIE, 30, "the watchdog ended")
    assert os.path.exists(f"{folder}/head/watchdog.log")


TRACEBACK = ["Traceback (most recent call last):", '  File "<string>", line 3, in <module>',
             '  File "/usr/lib/python3.10/runpy.py", line 224, in run_module',
             '  File "/home/u/.gpugeek/clusters/ab12/package/gpugeek_jupyter/{module}.py", line 30, in {where}',
             "{error}"]


def _record(**remote) -> registry.ClusterRecord:
    spec = ClusterSpec("slurm" if remote.get("job_id") else "ssh", remote=Remote(
        hosts=("me@login",), token_path="~/.gpugeek/clusters/ab12/auth_token",
        guard_home="~/.gpugeek/clusters/ab12/head", **remote))
    return registry.create("lab", spec.backend, spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)


def _traceback(module: str, where: str, error: str) -> list[str]:
    return [line.format(module=module, where=where, error=error) for line in TRACEBACK]


def test_a_slurm_heads_watchdog_is_read_from_the_shared_home_on_the_login_node():
    """The login node sees none of the head node's processes: the guard's answer in guard.log says
    its watchdog ended."""
    record = _record(job_id="42")
    logs = {"watchdog.log": _traceback("guard/headwatch", "<module>", "ModuleNotFoundError: No module named 'x'"),
            "guard.log": ['{"ok": false}'], "keeper.log": None}
    said = headlogs.said(record, {"logs": logs, "running": {"watchdog": False, "keeper": False}}, final=False)
    assert said == ("the head's watchdog could not start on Python 3.10: ModuleNotFoundError: No module named 'x' — "
                    "its log: me@login:~/.gpugeek/clusters/ab12/head/watchdog.log")
    logs["guard.log"] = ["starting"]        # still running, as far as the login node can tell
    assert headlogs.said(record, {"logs": logs, "running": {"watchdog": False, "keeper": False}}, final=False) is None


def test_a_keeper_that_fails_as_it_imports_is_said_at_once_and_one_that_ended_only_at_the_end():
    record = _record()
    running = {"watchdog": True, "keeper": False}
    imports = {"keeper.log": _traceback("keeper/serve", "<module>", "ImportError: cannot import name 'y'")}
    said = headlogs.said(record, {"logs": imports, "running": running}, final=False)
    assert said.startswith("the head's keeper could not start on Python 3.10: ImportError: cannot import name 'y'")
    assert said.endswith("its log: me@login:~/.gpugeek/clusters/ab12/head/keeper.log")
    ended = {"keeper.log": _traceback("keeper/serve", "main", "ConnectionError: the GCS did not answer")}
    assert headlogs.said(record, {"logs": ended, "running": running}, final=False) is None, "the watchdog restarts it"
    assert headlogs.said(record, {"logs": ended, "running": running}, final=True).startswith(
        "the head's keeper ended on Python 3.10: ConnectionError: the GCS did not answer")
    assert headlogs.said(record, {"logs": {}, "running": running}, final=True) is None
