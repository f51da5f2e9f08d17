"""A real Prometheus (Debian's) scrapes ``/gpugeek/metrics`` of a real Jupyter server while a sim
cluster runs: the $ counter equals the ledger's, the declared GPUs are there, and the shipped rule
fires once the budget is 80 % spent. Both processes are started here, on free ports, and stopped
by PID."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest
from cluster_processes import settings, wait_until

import gpugeek_jupyter as gg
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.ports import free_port

PROMETHEUS = shutil.which("prometheus")
RULES = Path(gg.__file__).parent / "server" / "prometheus-rules.yml"
SCRAPE_S = 1.0

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: `make test` installs Debian's "
                                                            "as root (apt-get install prometheus)")]


TRANSIENT = (0, 502, 503, 504)     # refused, or busy: a wait asks again until its deadline


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def started(cmd: list[str], env: dict, log: Path, ready_url: str) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while get(ready_url)[0] in TRANSIENT:      # refused, or 503 while it loads: ask again
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise AssertionError(f"{cmd[0]} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.3)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query(prom: str, promql: str) -> list[dict] | None:
    """The query's result; None for a transient answer (a wait asks again). A wrong query fails."""
    status, body = get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if status in TRANSIENT:
        return None
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def test_prometheus_scrapes_the_dollars_gpus_and_fires_the_budget_alert(gpugeek_home, tmp_path):
    settings(gpugeek_home, meter_interval_s=0.5)
    token, port, prom_port = secrets.token_hex(16), free_port(), free_port()
    env = {**os.environ, "GPUGEEK_HOME": str(gpugeek_home), "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    server = started([sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
                      f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root",
                      "--ServerApp.jpserver_extensions={'gpugeek_jupyter': True}"],
                     env, tmp_path / "jupyter.log", f"http://127.0.0.1:{port}/api/status")
    prometheus = None
    try:
        gg.up("prom", backend="sim", gpu="A100", count=8, workers=1)
        record = registry.live("prom")
        metrics = f"http://127.0.0.1:{port}/gpugeek/metrics"
        assert get(metrics)[0] == 403, "the metrics answered without the server's token"
        status, text = get(metrics, {"Authorization": f"Bearer {token}"})
        assert status == 200 and 'gpugeek_cluster_spent_usd_total{backend="sim",cluster="prom"}' in text, text
        # the guard named: this machine's watchdog, by the pid the process table gives its command
        pid = re.search(r'gpugeek_guard_heard_age_seconds\{backend="sim",by="here",cluster="prom",host="[^"]+",'
                        r'pid="(\d+)"\}', text).group(1)
        assert "gpugeek_jupyter.guard.watchdog" in " ".join(psutil.Process(int(pid)).cmdline())

        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({      # JSON is YAML
            "global": {"scrape_interval": f"{SCRAPE_S:g}s", "evaluation_interval": f"{SCRAPE_S:g}s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "gpugeek", "metrics_path": "/gpugeek/metrics",
                                "authorization": {"type": "Bearer", "credentials": token},
                                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
        prom = f"http://127.0.0.1:{prom_port}"
        prometheus = started([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                              f"--web.listen-address=127.0.0.1:{prom_port}"], env, tmp_path / "prometheus.log",
                             f"{prom}/-/ready")

        # the $ counter as Prometheus stored it, scrape by scrape, against the ledger at each scrape's time
        def scraped():
            found = query(prom, 'gpugeek_cluster_spent_usd_total{cluster="prom"}[20s]')
            return found[0]["values"] if found and len(found[0]["values"]) >= 3 else None
        samples = wait_until(scraped, 60, "three scrapes")
        one_interval = ledger.burn_rate(record.id) * SCRAPE_S / 3600
        for at, value in samples:
            assert abs(float(value) - ledger.spend(record.id, float(at))) <= one_interval, (at, value)
        gpus = wait_until(lambda: query(prom, 'gpugeek_cluster_gpus{cluster="prom"}'), 20, "the GPUs")
        assert float(gpus[0]["value"][1]) == 8.0
        simulated = wait_until(lambda: query(prom, 'gpugeek_cluster_simulated{cluster="prom"}'), 20, "simulated")
        assert simulated[0]["value"][1] == "1"

        # 82 % of a budget spent: the shipped rule fires (the watchdog stops it at 100 %)
        gg.limits("prom", budget=round(ledger.spend(record.id) / 0.82, 6))

        def firing():
            status, body = get(f"{prom}/api/v1/alerts")
            if status in TRANSIENT:
                return None
            return [a for a in json.loads(body)["data"]["alerts"] if a["labels"]["alertname"] ==
                    "GpugeekBudgetAlmostSpent" and a["labels"]["cluster"] == "prom" and a["state"] == "firing"]
        alert = wait_until(firing, 20, "the budget alert to fire")[0]
        print(f"\nfiring: {alert['annotations']['summary']}; $ samples {[round(float(v), 5) for _, v in samples]}")
        assert "prom has spent" in alert["annotations"]["summary"]
    finally:
        if prometheus is not None:
            stop(prometheus)
        stop(server)
        if registry.live("prom") is not None:
            gg.down("prom")
