"""Machines that are gone: the hosts of a live ``ssh`` cluster deleted under it, as a user who
ends rented boxes in the provider's console ends them (their processes killed, their links and
namespaces deleted). The record says since when it was last heard from, then "unreachable since",
with dollars that stop growing at its last word; the failed stop offers ``down --forget``, which
closes it; and nothing of ours dials the deleted addresses afterwards (checked from outside: the
sockets ``ss`` lists, and the frames meant for those addresses that a port left listening on the
lab's bridge receives)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import netlab
import pytest
from cluster_processes import of_cluster, settings, still_running, wait_until
from laptop_gone import row, terminal

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import costs

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("GPUGEEK_HOSTS_GONE"), reason="a lab of its own whose hosts are deleted under a live "
    "cluster, then waited on till unreachable: `make hosts-gone` runs it (and .ci/run runs make hosts-gone)")]

RATE = 36.0                # $/h per host: a cent a second
UNREACHABLE_AFTER_S = 40   # the setting (minutes in config.toml), short for the test; the $ is held from 30 s
QUIET_S = 11.0             # how long nothing may be sent to the deleted addresses: past two rounds of
                           # a head's catch-up here (lifecycle.CATCH_UP_EVERY_S, 5 s)


@pytest.fixture(scope="module")
def doomed():
    """A lab of its own: its hosts are deleted by the test."""
    with netlab.fixture(3) as made:
        yield made


def _gpugeek(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpugeek_jupyter.cli", *args], capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL, env={**os.environ, "GPUGEEK_HOME": str(home)})


def _datagram(address: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.sendto(b"?", (address, 9))


def test_hosts_deleted_under_a_live_cluster_then_forgotten(doomed, gpugeek_home):
    settings(gpugeek_home, meter_interval_s=1.0, unreachable_after_min=UNREACHABLE_AFTER_S / 60)
    names = ",".join(f"root@{h.address}" for h in doomed.hosts)
    started = subprocess.run(
        [sys.executable, "-c", f"import gpugeek_jupyter as gg; gg.up('acc', backend='ssh', hosts={names!r}, "
                               f"ssh_key={str(doomed.key)!r}, cpus_per_host=1, usd_per_hour={RATE}, "
                               f"pip_index_url={doomed.index_url!r})"],
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)}, capture_output=True, text=True, timeout=240)
    assert started.returncode == 0, started.stderr[-2000:]
    record = registry.live("acc")
    ours = of_cluster(record)          # this machine's watchdog and tunnel, by session
    subnet = doomed.subnet
    try:
        # three metered nodes, and the head's watchdog heard: the record names it once the hosts are gone
        wait_until(lambda: (seen := row(terminal(gpugeek_home, "clusters"), "acc"))["nodes"] == 3
                   and (seen.get("guard") or {}).get("by") == "head", 30, "three metered nodes and the head's watchdog")

        # the provider's console: every host ended, its address gone; a listening port stays on the
        # bridge, and sees every frame sent towards their addresses (an ARP request, first of all)
        doomed.add_witness()
        for host in doomed.hosts:
            doomed.delete_host(host)
        deleted = time.time()

        first = row(terminal(gpugeek_home, "clusters"), "acc")
        wait_until(lambda: "last heard from the cluster at" in row(terminal(gpugeek_home, "clusters"), "acc")["status"],
                   60, "the record to say when the cluster was last heard from")
        said = wait_until(lambda: "unreachable since" in (seen := row(terminal(gpugeek_home, "clusters"), "acc"))[
            "status"] and seen["status"], UNREACHABLE_AFTER_S + 60, "the record to say the cluster is unreachable")
        print(f"\n{time.time() - deleted:.0f} s after the hosts went: {said}")
        held = row(terminal(gpugeek_home, "clusters"), "acc")
        assert held["state"] == "running" and "an estimate" in held["status"], held
        assert "if its head still runs, its own watchdog" in said, said
        assert held["spent_usd"] <= first["spent_usd"] + 3 * RATE * 35 / 3600, "counted well past the last word"
        # this machine's watchdog went quiet at its next look (one that tried the head over SSH), its
        # tunnel with it: nothing of the cluster runs here
        assert still_running(ours, wait=30) == [], "this machine's watchdog or tunnel still dials the hosts"
        time.sleep(5)      # the $ must stay put over this span: there is nothing to poll for
        assert row(terminal(gpugeek_home, "clusters"), "acc")["spent_usd"] == held["spent_usd"], "the $ grew"

        # the failed stop offers --forget; --forget closes the record at the last word
        failed = _gpugeek(gpugeek_home, "down", "acc", "--yes")
        print(failed.stderr.strip())
        assert failed.returncode != 0 and "--forget" in failed.stderr, failed.stdout + failed.stderr
        assert registry.live("acc") is not None, "a failed stop closed the record"
        forgot = _gpugeek(gpugeek_home, "down", "acc", "--forget")
        print(forgot.stdout.strip())
        assert forgot.returncode == 0, forgot.stderr
        final = registry.get(record.id)
        assert final.stopped is not None and "forgotten" in final.stop_reason, final
        nodes = costs.nodes_frame(record.id)
        assert len(nodes) == 3 and (nodes["ended"] == final.stopped).all(), nodes
        assert final.stopped <= deleted + 2, "the nodes were counted past the moment the hosts went"
        expected = sum((r.ended - r.started) * r.usd_per_hour / 3600 for r in nodes.itertuples())
        closed = row(terminal(gpugeek_home, "clusters"), "acc")
        assert closed["state"] == "stopped" and closed["spent_usd"] == pytest.approx(expected, rel=1e-9)

        # from outside: no socket to the deleted addresses, and no frame sent towards them
        sockets = netlab.sockets_to(subnet)
        assert not sockets, f"sockets to the deleted hosts: {sockets}"
        gone = {h.address for h in doomed.hosts}
        sent = doomed.frames_to(gone, QUIET_S)      # a span with no reader asking: anything dialing shows
        print(f"frames towards the deleted hosts in the {QUIET_S:.0f} s after --forget: {len(sent)} {sent}")
        assert not sent, f"something here still dials the deleted hosts: {sent}"
        # the observer sees what it should: one datagram towards a deleted address is caught
        probe = threading.Timer(1.0, _datagram, (doomed.hosts[0].address,))
        probe.start()
        caught = doomed.frames_to(gone, 5.0, first=True)
        probe.join()
        assert caught, "the witness did not see a datagram sent to a deleted host"
        assert still_running(of_cluster(record)) == []
    finally:
        if registry.live("acc") is not None:
            _gpugeek(gpugeek_home, "down", "acc", "--forget")


def test_a_host_deleted_while_a_client_here_closes_leaves_no_socket_to_it():
    """The lab's own deletion, checked: a client here that closes a moment after the host's sshd
    dies (as ssh does, writing its goodbye first) finishes its close before the cable is cut, so
    the socket check above sees only what something of ours still holds."""
    with netlab.fixture(1) as lab:
        host = lab.hosts[0]
        client = socket.create_connection((host.address, 22), timeout=10)
        client.recv(64)                                   # sshd's banner: the connection is up

        def close_late():
            client.recv(64)                               # EOF: the host's sshd is gone
            time.sleep(0.3)                               # a client slow to close, on purpose
            client.sendall(b"bye\n")
            client.close()

        closer = threading.Thread(target=close_late)
        closer.start()
        lab.delete_host(host)
        closer.join(timeout=10)
        assert not netlab.sockets_to(lab.subnet), "a close under way when the host went still sends"
