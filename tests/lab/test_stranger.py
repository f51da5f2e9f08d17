"""A 2-host ``ssh`` cluster (h1 the head, h2 a worker) and h3, a machine on the same bridge that is
not in the cluster — as a neighbour on a provider's network would be.

The stranger lists every port each host listens on (from the host's network namespace, not from
any list of ours), then tries each: a TCP connect and an HTTP GET, and on each that may speak
gRPC (not HTTP/1, not SSH) a Ray driver join and a Ray Client connect, without the token.
Nothing may answer, and no code of its may run. A driver's join holding the token does work (the
observer can see an open door), and so does an HTTP server the test opens on the head. (No Ray
Client server runs on the head, and the keeper listens on its loopback alone.)

The cluster's 1 CPU per host also shows a group that can never fit it refused at once."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_STRANGER_EVERY_HOST"), reason="a stranger trying every port of a 2-host "
    "cluster takes minutes: `make stranger` runs it (and .ci/run runs make stranger)")]

PROBE = Path(__file__).resolve().parent.parent / "stranger.py"
RATE = 3.6
PROBE_TIMEOUT_S = 600         # every port's tries, a few at a time, each bounded (tests/stranger.py)
CONTROL_PORT = 18080          # a plain HTTP server the test opens on the head: the stranger must see it


@pytest.fixture(scope="module")
def paired(lab, tmp_path_factory):
    home = tmp_path_factory.mktemp("pair-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUGEEK_HOME", str(home))
        try:
            gg.up("pair", backend="ssh", hosts=",".join(f"root@{h.address}" for h in lab.hosts[:2]),
                  ssh_key=str(lab.key), cpus_per_host=1, usd_per_hour=RATE, pip_index_url=lab.index_url)
            yield home
        finally:
            if registry.live("pair") is not None:
                gg.down("pair")


@pytest.fixture
def pair(paired, monkeypatch):
    """The module's cluster, as each test's own home would hide it."""
    monkeypatch.setenv("GPUGEEK_HOME", str(paired))
    return registry.live("pair")


def listening(host) -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP socket listening in ``host``'s network namespace."""
    out = host.ns("ss", "-ltnpH").stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        process = re.search(r'\(\("([^"]+)"', line)
        found.append((address.strip("[]").removeprefix("::ffff:"), int(port), process.group(1) if process else "?"))
    return sorted(set(found), key=lambda f: f[1])


def answered(result: dict) -> list[str]:
    """What of one port's tries answered without the token, in words."""
    said = [f"HTTP {path} {code}" for path, code in result["http"].items() if isinstance(code, int) and code < 400]
    said += [f"{how} {result[how]}" for how in ("driver", "client") if result[how].startswith(("ran on", "answered"))]
    return said


def stranger(lab, address: str, ports: list[int], touch: str, token: str | None = None) -> dict[int, dict]:
    """The probe, run in h3's network namespace (h3 is in no cluster) with this machine's Ray. The
    control, holding the token, makes the driver's try only (what it must show: the GCS answers a
    driver holding the token), and is given longer: a slow yes must not read as a no."""
    args = [str(p) for p in ports] + ["--touch", touch] + (
        ["--token", token, "--patience", "180", "--only", "driver"] if token else [])
    done = subprocess.run(["ip", "netns", "exec", lab.hosts[2].netns, sys.executable, str(PROBE), address, *args],
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True)
    return {int(port): result for port, result in json.loads(done.stdout.splitlines()[-1]).items()}


def test_a_group_that_can_never_fit_two_hosts_is_refused_at_once(pair):
    gg.run("pass", workers=2, monitor=False)
    began = time.monotonic()
    with pytest.raises(gg.GpugeekError, match=r"3 workers × 1 CPU do not fit the cluster \(it has 2 CPUs on 2 "
                                              r"nodes, and does not grow by itself\)"):
        gg.run("pass", workers=3, monitor=False)
    took = time.monotonic() - began
    print(f"\n--workers 3 on 2 hosts of 1 CPU: refused in {took:.2f} s")
    assert took <= 2.0, f"refused after {took:.1f} s"


@pytest.mark.timeout(900)     # two hosts' ports, three Ray tries at a time, each bounded (tests/stranger.py)
def test_a_stranger_on_the_hosts_network_gets_no_answer_without_the_token(lab, pair):
    """The head's every port (a worker's too with GPUGEEK_STRANGER_EVERY_HOST=1, `make stranger`:
    its raylet's ports are the head's kinds again, three more minutes beside make test's timed tests)."""
    spec = ClusterSpec.from_json(pair.spec)
    head, worker = lab.hosts[0], lab.hosts[1]
    probed = (head, worker) if os.environ.get("GPUGEEK_STRANGER_EVERY_HOST") else (head,)

    # the state on the hosts is the host user's alone
    for host in (head, worker):
        for folder in ("/root/.gpugeek", "/root/.gpugeek/clusters"):
            mode = stat.S_IMODE(host.file(folder).stat().st_mode)
            assert mode == 0o700, f"{host.name}:{folder} is {oct(mode)}"
        token = host.file(spec.remote.token_path.replace("~", "/root"))
        assert stat.S_IMODE(token.stat().st_mode) == 0o600, f"{host.name}: the token is {oct(token.stat().st_mode)}"

    # the observer can see an open door: holding the token, the GCS answers a driver (which, off
    # the cluster's nodes, goes no further)
    gcs = spec.remote.gcs_port
    token = str(head.file(spec.remote.token_path.replace("~", "/root")))
    control_touch = f"/tmp/stranger-control-{uuid.uuid4().hex[:8]}"
    with_token = stranger(lab, head.address, [gcs], control_touch, token=token)
    print(f"\nholding the token: a driver at {gcs}: {with_token[gcs]['driver']}")
    assert with_token[gcs]["driver"].startswith("answered"), with_token

    gg.run("pass", workers=2, monitor=False)      # a warm group: its ranks' ports are open too
    server = subprocess.Popen(["ip", "netns", "exec", head.netns, sys.executable, "-m", "http.server",
                                str(CONTROL_PORT), "--bind", head.address], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    touch = f"/tmp/stranger-{uuid.uuid4().hex[:8]}"
    try:
        deadline = time.monotonic() + 10
        while CONTROL_PORT not in {p for _, p, _ in listening(head)} and time.monotonic() < deadline:
            time.sleep(0.2)
        rows, open_doors = [], []
        for host in probed:
            ports = listening(host)
            reachable = [(a, p, what) for a, p, what in ports if not a.startswith("127.") and a != "::1"]
            began = time.monotonic()
            results = stranger(lab, host.address, sorted({p for _, p, _ in reachable}), touch)
            took = time.monotonic() - began
            for address, port, what in ports:
                if (address, port, what) not in reachable:
                    rows.append(f"{host.name} {address}:{port} {what}: loopback only, not tried")
                    continue
                result = results[port]
                said = answered(result)
                if said and port != CONTROL_PORT:
                    open_doors.append(f"{host.name}:{port} ({what}): {', '.join(said)}")
                rows.append(f"{host.name} {address}:{port} {what}: tcp {'open' if result['tcp'] else 'closed'}; "
                            f"http {result['http']}; driver {result['driver']}; client {result['client']}")
            rows.append(f"{host.name}: {len(reachable)} reachable port(s) tried in {took:.0f} s")
        print("\nwhat a stranger on the bridge got:\n  " + "\n  ".join(rows))

        assert any(r.startswith(f"{head.name} {head.address}:{CONTROL_PORT}") and "200" in r for r in rows), rows
        assert open_doors == [], open_doors
        for host in (head, worker):
            assert not host.file(touch).exists(), f"the stranger's code ran on {host.name}"
    finally:
        server.kill()
        server.wait()
        for host in (head, worker):
            for path in (touch, control_touch):
                host.file(path).unlink(missing_ok=True)
