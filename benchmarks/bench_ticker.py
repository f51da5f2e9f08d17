"""What JupyterLab's status bar costs the Jupyter server: ``GET /gpugeek/clusters`` per request;
and what a Prometheus scrape costs it: ``GET /gpugeek/metrics``.

    .venv/bin/python benchmarks/bench_ticker.py [--requests 500] [--clusters 10]

A registry of ``--clusters`` live clusters (each with a head and two GPU nodes, one preempted,
events and a minute of telemetry) plus 20 stopped ones is written to a fresh ``$GPUGEEK_HOME``; a
real ``jupyter server`` with the extension enabled is started on it, and one keep-alive HTTP client
asks the way the status bar does (token header, JSON back). Reported: the round trip per request
(median, p95) and, side by side in the same run, the handler's own work (``overview()``) in this
process; the same for the metrics, alternated with them. Goals: < 5 ms per request, and per
scrape, with 10 clusters.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpugeek_jupyter.ports import free_port


def populate(clusters: int, stopped: int) -> None:
    from gpugeek_jupyter.cluster import registry
    from gpugeek_jupyter.meter import ledger, telemetry
    from gpugeek_jupyter.raynodes import RayNode
    from gpugeek_jupyter.vocab import NodePrice

    now = time.time()
    prices = {"head": NodePrice(None, "on-demand", 0.5), "gpu": NodePrice("o1", "spot", 12.0, 30.0)}
    for i in range(clusters + stopped):
        record = registry.create(f"c{i}", "sim", {}, simulated=True, budget_usd=100.0, idle_minutes=30)
        start = now - 3600
        registry.update(record.id, ready=start)
        nodes = [RayNode(f"c{i}-head", "", True, True, start, None, None, ""),
                 RayNode(f"c{i}-w1", "gpu", True, False, start, None, None, "", {"GPU": 8}),
                 RayNode(f"c{i}-w0", "gpu", False, False, start, now - 1800, None, "", {"GPU": 8})]
        ledger.sync_nodes(record.id, nodes, prices)
        for k in range(5):
            ledger.event(record.id, "scale", f"event {k}")
        telemetry.record_node_samples(record.id, [
            {"t": now - 60 + s, "node_id": f"c{i}-w1", "host": {"cpu_percent": 50.0},
             "gpus": [{"gpu": g, "gpu_util": 90.0} for g in range(8)]} for s in range(60)])
        if i >= clusters:
            ledger.end_all_nodes(record.id, now, "down")
            registry.mark_stopped(record.id, "down", now)


METRICS = "/gpugeek/metrics"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clusters", type=int, default=10)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpugeek-bench-ticker-"))
    os.environ["GPUGEEK_HOME"] = str(base / "home")
    populate(args.clusters, stopped=20)

    from gpugeek_jupyter.guard import board as clusters
    from gpugeek_jupyter.server.metrics import scrape

    token, port = secrets.token_hex(16), free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(base / "config"), "JUPYTER_DATA_DIR": str(base / "data"),
           "JUPYTER_RUNTIME_DIR": str(base / "runtime")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={base}", "--allow-root",
         "--ServerApp.jpserver_extensions={'gpugeek_jupyter': True}", "--log-level=WARN"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        conn = _connect(port)
        headers = {"Authorization": f"token {token}"}

        def request(path: str = "/gpugeek/clusters") -> bytes:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            assert response.status == 200, (response.status, body[:200])
            return body

        data = json.loads(request())
        assert data["live"] == args.clusters and len(data["clusters"]) == args.clusters + clusters.STOPPED_SHOWN
        assert f'cluster="c{args.clusters - 1}"' in request(METRICS).decode()
        for _ in range(50):  # warm up both sides
            request(), clusters.overview(), request(METRICS), scrape()
        http_ms, direct_ms, scrape_ms, collect_ms = [], [], [], []
        for _ in range(args.requests):  # alternated, so all see the same machine load
            for out, call in ((http_ms, request), (direct_ms, clusters.overview),
                              (scrape_ms, lambda: request(METRICS)), (collect_ms, scrape)):
                t = time.perf_counter()
                call()
                out.append((time.perf_counter() - t) * 1e3)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    p95 = lambda xs: sorted(xs)[int(0.95 * len(xs)) - 1]  # noqa: E731
    print(f"GET /gpugeek/clusters, {args.clusters} live + {clusters.STOPPED_SHOWN} stopped listed "
          f"(of {args.clusters + 20} in the registry), {args.requests} requests:")
    print(f"  round trip   median {statistics.median(http_ms):.2f} ms   p95 {p95(http_ms):.2f} ms")
    print(f"  overview()   median {statistics.median(direct_ms):.2f} ms   p95 {p95(direct_ms):.2f} ms")
    print(f"  goal < 5 ms per request: {'met' if statistics.median(http_ms) < 5 else 'NOT met'}")
    print(f"GET {METRICS} (a Prometheus scrape), the same registry:")
    print(f"  round trip   median {statistics.median(scrape_ms):.2f} ms   p95 {p95(scrape_ms):.2f} ms")
    print(f"  scrape()     median {statistics.median(collect_ms):.2f} ms   p95 {p95(collect_ms):.2f} ms")
    print(f"  goal < 5 ms per scrape: {'met' if statistics.median(scrape_ms) < 5 else 'NOT met'}")


def _connect(port: int, timeout: float = 60) -> http.client.HTTPConnection:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/api/status")
            conn.getresponse().read()
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    main()
