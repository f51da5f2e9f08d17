"""``up --backend onprem`` on the lab's three hosts: Ray's own cluster launcher (``ray up``, its
on-premise node provider, its autoscaler on the head) starts the cluster, with nothing of ours in
between but the YAML.

In order, on one cluster: ``ray up`` logs in to the head and runs the setup command (the runtime)
and the head's start command; the head's autoscaler logs in to the two other hosts and does the
same there; the cluster's marker, token and watchdog are on the hosts as on an ``ssh`` cluster;
a 3-host DDP cell; the laptop cut off with a budget cap ahead, and the head's watchdog stops
every host at the cap (its autoscaler does not start them again); ``down``, and nothing left on
any host, counted by namespace. (``up --backend ssh`` against ``onprem`` on these hosts, side by
side, is ``benchmarks/bench_up_hosts.py --against onprem``.)
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time

import pytest
from cluster_processes import of_cluster, settings, still_running, wait_until
from laptop_gone import head_ledger, spend
from models import DDP_ACROSS_HOSTS
from netlab import described, left_on_hosts

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends import launcher
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.remote import headguard

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("rsync") is None, reason="Ray's launcher copies files with rsync "
                                 "(`make sshd` installs it)")]

RATE = 360.0          # $/h per host: 3 hosts burn 30 cents a second
INTERVAL_S = 1.0      # the watchdogs' metering interval
AHEAD_S = 20.0        # the cap is set this far ahead of the spend when the laptop goes
STOP_SLACK_S = 12.0   # a stop under a loaded machine's scheduling may end this much past the cap
# Ray's own knobs, in the hosts' environment (their ~/.bashrc, which Ray's command runner sources): the
# head's autoscaler looks every second (Ray's default: 5 s) and retries a node's SSH every second
AUTOSCALER_ENV = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "AUTOSCALER_NODE_SSH_INTERVAL_S": "1"}
STAYS_DOWN_S = 6.0    # the hosts stay empty this long after the stop: past five of the autoscaler's rounds


def _up(lab, name: str, backend: str) -> float:
    hosts = ",".join(f"root@{h.address}" for h in lab.hosts)
    began = time.monotonic()
    gg.up(name, backend=backend, hosts=hosts, ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=RATE)
    return time.monotonic() - began


@pytest.fixture
def quick_autoscaler(lab):
    """``AUTOSCALER_ENV`` exported in every host's ``~/.bashrc`` for the test; each one's file as it was after."""
    kept = {}
    for host in lab.hosts:
        path = host.file("/root/.bashrc")
        kept[path] = path.read_text() if path.exists() else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((kept[path] or "") + "".join(f"export {k}={v}\n" for k, v in AUTOSCALER_ENV.items()))
    yield
    for path, text in kept.items():
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


@pytest.mark.timeout(1200)
def test_ray_up_with_the_on_premise_provider_starts_guards_and_stops_the_hosts(lab, gpugeek_home, monkeypatch,
                                                                              quick_autoscaler):
    settings(gpugeek_home, meter_interval_s=INTERVAL_S)
    with (gpugeek_home / "config.toml").open("a") as f:
        f.write(f'\n[hosts]\npip_index_url = "{lab.index_url}"\n')
    writes, write = [], registry.update

    def observed(cluster_id, **fields):
        write(cluster_id, **fields)
        if "spec" in fields or fields.get("remote"):
            writes.append(json.dumps(registry.get(cluster_id).spec, sort_keys=True))

    monkeypatch.setattr(registry, "update", observed)
    try:
        onprem_s = _up(lab, "rayup", "onprem")
        monkeypatch.setattr(registry, "update", write)
        # what a stop needs (the hosts' folders, with the launcher's config), then the started cluster
        assert len(writes) == 2 and writes[0] != writes[1], f"the spec was written {len(writes)} times in `up`"
        record = registry.live("rayup")
        spec = ClusterSpec.from_json(record.spec)
        config = launcher.validate(launcher.cluster_config("rayup", spec, record.marker))
        assert config["provider"] == {"type": "local", "head_ip": lab.hosts[0].address,
                                      "worker_ips": [h.address for h in lab.hosts[1:]]}

        # Ray's launcher did it: `ray up` ran the setup and head start commands on the head over
        # SSH, and the head's autoscaler started the other hosts (Ray's own logs say so)
        said = (gpugeek_home / "launch" / "rayup-onprem.log").read_text()
        assert "runtime.py install" in said and "onhost.py start" in said, said[-2000:]
        head = lab.hosts[0]
        logs = head.file("/tmp").glob("gg-*/session_*/logs/monitor.log")
        monitor = "".join(path.read_text(errors="replace") for path in logs)
        updated = set(re.findall(r"updater thread for node ([\d.]+)\.", monitor))
        assert updated == {h.address for h in lab.hosts[1:]}, f"the autoscaler set up {updated}: {monitor[-2000:]}"
        on_hosts = {h.name: h.pids_with(onhost.MARKER, record.marker) for h in lab.hosts}
        assert all(on_hosts.values()), f"Ray is not running, marked, on every host: {on_hosts}"
        assert head.pids_with("AUTOSCALER_UPDATE_INTERVAL_S", "1"), "the head's Ray runs without the test's knobs"
        for host in lab.hosts:
            mode = lab.ssh(host, f"stat -c %a {launcher.node_dir('rayup')}/auth_token").stdout.strip()
            assert mode == "600", f"the token on {host.name} is readable by others ({mode})"
        wait_until(lambda: headguard.beating(registry.get(record.id)), 30, "the head watchdog's heartbeat")

        result = gg.run(DDP_ACROSS_HOSTS, workers=3)
        equal, ips = result.shown()
        assert equal, "gradients differ between ranks"
        assert ips == sorted(h.address for h in lab.hosts), f"ranks ran on {ips}"

        # the laptop goes with a cap ahead: its watchdog and tunnel killed, its link cut
        budget = gg.cost("rayup").total_usd + 3 * RATE * AHEAD_S / 3600
        gg.limits("rayup", budget=budget)
        wait_until(lambda: (headguard.heartbeat(record) or {}).get("budget") == pytest.approx(budget), 15,
                   "the head taking the new cap")
        ours = of_cluster(registry.get(record.id))
        for proc in ours:
            proc.send_signal(signal.SIGKILL)
        lab.cut_laptop()
        gone = time.monotonic()
        try:
            assert still_running(ours, wait=5) == [], "this machine's watchdog or tunnel survived SIGKILL"
            wait_until(lambda: not any(h.strays(ssh_sessions=False) for h in lab.hosts), AHEAD_S + 120,
                       "every host free of the cluster's processes (by namespace)")
            stopped_after = time.monotonic() - gone
            time.sleep(STAYS_DOWN_S)      # an autoscaler left running would start the workers again
            back = {h.name: described(h.strays(ssh_sessions=False)) for h in lab.hosts}
            assert not any(back.values()), f"processes came back on the hosts after the stop: {back}"
            cluster, nodes, _ = head_ledger(head, spec, "rayup")
            assert cluster["stop_reason"] == "budget cap reached", cluster
            head_usd, burn = spend(nodes, time.time()), sum(n["usd_per_hour"] for n in nodes)
            interval_usd = burn * INTERVAL_S / 3600
            assert len(nodes) == 3 and all(n["ended"] for n in nodes), nodes
            assert abs(head_usd - budget) <= interval_usd + burn * STOP_SLACK_S / 3600, \
                f"the head's ${head_usd:.3f} is not within one interval of the ${budget:.3f} cap"
        finally:
            lab.reconnect_laptop()
        gg.down("rayup")
        assert registry.get(record.id).stopped
        # the laptop's connections that the cut killed end on the hosts at TCP's next retry (a minute
        # or two): reset now, their sshd ends, and what is left on a host is the cluster's
        lab.reset_cut_connections()
        assert not (left := left_on_hosts(lab)), f"processes left: {described(left)}"
        assert not processes.alive(record.session_id), "the tunnel outlived down"
        assert not launcher.node_files("rayup").exists(), "the token's local copy outlived down"

        print(f"\nup on the lab's 3 hosts with --backend onprem (Ray's `ray up`, its autoscaler starting the "
              f"workers): {onprem_s:.1f} s")
        print(f"the laptop cut off: every host stopped {stopped_after:.1f} s later, the head's ledger "
              f"${head_usd:.3f} against the ${budget:.3f} cap ({(head_usd - budget) / interval_usd:+.2f} intervals)")
    finally:
        lab.reconnect_laptop()
        if registry.live("rayup") is not None:
            gg.down("rayup")
    assert not (left := left_on_hosts(lab)), f"processes left on the hosts: {described(left)}"


def test_onprem_refuses_in_one_line_what_rays_provider_cannot_do(gpugeek_home):
    hosts = "root@10.213.1.11,ubuntu@10.213.1.12"
    with pytest.raises(GpugeekError, match="one user on port 22"):
        gg.up("x", backend="onprem", hosts=hosts, ssh_key="/k", usd_per_hour=0)
    with pytest.raises(GpugeekError, match="give --ssh-key"):
        gg.up("x", backend="onprem", hosts="root@10.213.1.11,root@10.213.1.12", usd_per_hour=0)
    with pytest.raises(GpugeekError, match="at least two --hosts"):
        gg.up("x", backend="onprem", hosts="root@10.213.1.11", ssh_key="/k", usd_per_hour=0)
    assert registry.live("x") is None
