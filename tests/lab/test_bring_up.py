"""``up --backend ssh`` on hosts that share nothing with the laptop: each host made ready by itself —
its runtime made from the wheel index the laptop serves on the lab's bridge, or found made — and
each way that cannot happen said in one line, with nothing listed and nothing running afterwards.

It runs first in the lab: the modules after it find the hosts' runtimes made. h1 and h2 have the
machine image (a Python with torch, no Ray); h3 is bare (Debian's python3 only).
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import threading
import time
from importlib import metadata

import pytest
from cluster_processes import wait_until
from models import logged_steps
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.remote import Remote
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.config import home
from gpugeek_jupyter.remote import runtime

pytestmark = pytest.mark.slow

RAY = metadata.version("ray")


def _names(hosts) -> str:
    return ",".join(f"root@{h.address}" for h in hosts)


def _refused(lab, name: str, hosts, **flags) -> str:
    """``up``'s one line, after which nothing of ``name`` is listed and nothing runs on the hosts."""
    with pytest.raises(gg.GpugeekError) as failed:
        gg.up(name, backend="ssh", hosts=_names(hosts), ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=1.0,
              **{"pip_index_url": lab.index_url, **flags})
    said = str(failed.value)
    print(f"\n{name}: {said}")
    assert "\n" not in said and "Traceback" not in said, said
    assert registry.latest(name) is None, f"a failed up left {name!r} listed"
    assert not (left := left_on_hosts(lab)), f"processes left on the hosts: {described(left)}"
    return said


def test_a_bare_host_with_no_install_is_one_line(lab, gpugeek_home):
    bare = lab.host("h3")
    said = _refused(lab, "noinstall", [bare], install=False)
    assert said.startswith(f"root@{bare.address}: no Ray {RAY} runtime here, and --no-install says "
                           f"not to install it"), said
    assert "--python PATH" in said


def test_an_index_that_cannot_be_reached_is_one_line(lab, gpugeek_home):
    bare = lab.host("h3")
    closed = f"http://{lab.gateway}:9/simple"       # the laptop's bridge address; nothing listens on 9
    said = _refused(lab, "noindex", [bare], pip_index_url=closed)
    assert said.startswith(f"root@{bare.address}: installing torch==2.13.* from {closed} failed: "), said
    assert said.endswith("— check --pip-index-url"), said
    assert not bare.file(f"/root/.gpugeek/runtime/ray-{RAY}/runtime.json").exists()


def test_up_from_nothing_makes_each_hosts_runtime_then_finds_it_made(lab, gpugeek_home, capsys, monkeypatch):
    """Install time per host, first and repeat; a cell on the three hosts; and, with no
    ``--storage``, a checkpoint's default place (each host's own disk) refused before any step.
    The cluster's record is written by ``up``'s own thread alone, once per change of state (the
    tunnel and the head's watchdog start in threads of their own)."""
    writes, write = [], registry.update

    def observed(cluster_id, **fields):
        write(cluster_id, **fields)
        if "spec" in fields or fields.get("remote"):
            writes.append((threading.get_ident(), json.dumps(registry.get(cluster_id).spec, sort_keys=True)))

    monkeypatch.setattr(registry, "update", observed)
    began = time.monotonic()
    gg.up("fresh", backend="ssh", hosts=_names(lab.hosts), ssh_key=str(lab.key), cpus_per_host=1,
          usd_per_hour=1.0, pip_index_url=lab.index_url)
    took = time.monotonic() - began
    said = capsys.readouterr().out
    assert {thread for thread, _ in writes} == {threading.get_ident()}, "another thread wrote the spec"
    assert all(a != b for (_, a), (_, b) in itertools.pairwise(writes)), "the spec was written with nothing changed"
    assert len(writes) == 2, f"the spec was written {len(writes)} times: once before Ray starts, once started"
    try:
        made = {h.name: float(re.search(rf"root@{re.escape(h.address)}: ready in ([0-9.]+) s", said)[1])
                for h in lab.hosts}
        assert "with uv" in said, said
        assert gg.run("rank", workers=3).shown() == 0
        # no --storage: a checkpoint's default place is each host's own disk, which no resume on the
        # others could read — one line before the first step
        with pytest.raises(gg.GpugeekError) as failed:
            gg.run(logged_steps(3, 0.0) + "\nfinal_step", workers=3, push={"log": "/tmp/steps.log"},
                   checkpoint_every=1, monitor=False)
        unshared = str(failed.value)
        assert "\n" not in unshared and unshared.startswith(f"checkpoint dir {home()}/checkpoints/cell-"), \
            unshared
        assert re.search(r"is not shared by the hosts \((h\d), (h\d) cannot see it\)", unshared), unshared
        spec = ClusterSpec.from_json(registry.live("fresh").spec)
    finally:
        gg.down("fresh")
    # a second `up` of the same hosts checks them only (timed alone: no cluster running)
    checked = time.monotonic()
    pythons = [answer["python"] for answer in runtime.ready(spec)]
    repeat = time.monotonic() - checked
    assert "ready in" not in capsys.readouterr().out, "a ready host was made again"
    assert pythons == [f"/root/.gpugeek/runtime/ray-{RAY}/bin/python"] * 3
    with capsys.disabled():
        print(f"\nup from nothing on 3 hosts: {took:.1f} s in all; runtimes made in "
              f"{', '.join(f'{n} {s:.1f} s' for n, s in made.items())} (h3 bare: torch too); "
              f"a repeat's checks: {repeat:.2f} s\n{unshared}")
    # h1 and h2 hold torch already (Ray and numpy only); h3, bare, installs torch too, beside them:
    # 7-15 s and 11-16 s on a quiet machine. A host with torch that takes longer than the bare one
    # waited on something (the index's dropped connections read h1 32 s), however slow the machine.
    assert made["h1"] <= max(20, made["h3"]) and made["h2"] <= max(20, made["h3"]), made
    assert made["h3"] <= 60, made
    # 0.36 s on a quiet machine (benchmarks/bench_up_hosts.py); the suites beside this one slow it
    assert repeat <= 1.5, f"the checks on ready hosts took {repeat:.2f} s"


def test_a_changed_host_key_is_one_line_that_says_how_to_forget_it(lab, gpugeek_home):
    host = lab.host("h2")
    assert lab.ssh(host, "true").returncode == 0
    # the checks `up` makes first, over our SSH: the host's key goes into our known_hosts
    runtime.ready(ClusterSpec(backend="ssh", remote=Remote(hosts=(f"root@{host.address}",), ssh_key=str(lab.key),
                                                           pip_index_url=lab.index_url)))
    registry_before = {r.name for r in registry.all_records()}
    lab.new_host_key(host)
    lab.restart_host(host)
    wait_until(lambda: lab.ssh(host, "true").returncode == 0, 30, f"{host.name}'s sshd answering with its new key")
    said = _refused(lab, "rekeyed", [host])
    known = home() / "known_hosts"
    assert said.startswith(f"root@{host.address}: SSH failed — the host's key is not the one {known} holds "
                           f"for {host.address}"), said
    command = re.search(r"`(ssh-keygen -R [^`]+)`", said)[1]
    assert command == f"ssh-keygen -R {host.address} -f {shlex.quote(str(known))}", command
    assert {r.name for r in registry.all_records()} == registry_before
    subprocess.run(shlex.split(command), check=True, capture_output=True)
    gg.up("rekeyed", backend="ssh", hosts=_names([host]), ssh_key=str(lab.key), cpus_per_host=1,
          usd_per_hour=1.0, pip_index_url=lab.index_url)
    gg.down("rekeyed")


def test_without_uv_venv_and_pip_make_the_runtime(lab, gpugeek_home, monkeypatch, capsys):
    """A host of another kind than the laptop gets no uv from it: the runtime is made with the
    host's ``venv`` and pip (here in a folder of its own, beside the one uv made)."""
    host = lab.host("h1")
    kernel = runtime.order_for
    monkeypatch.setattr(runtime, "order_for", lambda remote: {**kernel(remote), "root": "~/.gpugeek/runtime-pip"})
    monkeypatch.setattr(runtime, "_local_uv", lambda: None)
    lab.ssh(host, "rm -f ~/.gpugeek/bin/uv")       # the uv an earlier up sent
    spec = ClusterSpec(backend="ssh", remote=Remote(hosts=(f"root@{host.address}",), ssh_key=str(lab.key),
                                                    pip_index_url=lab.index_url))
    began = time.monotonic()
    [answer] = runtime.ready(spec)
    python = answer["python"]
    took = time.monotonic() - began
    said = capsys.readouterr().out
    assert "with venv and pip (torch: the host's own 2.13.0+cpu)" in said, said
    assert python == f"/root/.gpugeek/runtime-pip/ray-{RAY}/bin/python"
    answer = lab.ssh(host, f"{python} -c 'import ray, torch; print(ray.__version__, torch.__version__)'")
    assert answer.stdout.split() == [RAY, "2.13.0+cpu"], answer.stderr[-500:]
    with capsys.disabled():
        print(f"\na runtime made with venv and pip on {host.name} (torch the image's): {took:.1f} s")
