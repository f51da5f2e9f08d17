"""The REST API the Lab front end reads, through a real in-process jupyter_server (``jp_fetch``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse

import cluster_processes
import pytest
from tornado.httpclient import HTTPClientError

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.raynodes import RayNode
from gpugeek_jupyter.vocab import NodePrice


def node(node_id: str, started: float, gpus: float = 8, ended: float | None = None, head=False) -> RayNode:
    return RayNode(node_id=node_id, node_type="" if head else "gpu", alive=ended is None, is_head=head,
                   started=started, ended=ended, idle_s=None, raylet_socket="",
                   resources={"GPU": gpus} if gpus else {})


def synthetic(name: str, *, backend="sim", simulated=True, budget=None, hours=2.0, usd=10.0,
              stopped=False, ready=True) -> registry.ClusterRecord:
    """A cluster row with a head ($1/h) and one GPU node (``usd``/h) running for ``hours``."""
    record = registry.create(name, backend, {}, simulated=simulated, budget_usd=budget, idle_minutes=None)
    now = time.time()
    if ready:
        registry.update(record.id, ready=now - hours * 3600)
    ledger.sync_nodes(record.id, [node(f"{name}-head", now - hours * 3600, gpus=0, head=True),
                                  node(f"{name}-gpu", now - hours * 3600)],
                      {"head": NodePrice(None, "on-demand", 1.0), "gpu": NodePrice("o1", "spot", usd, 2 * usd)})
    if stopped:
        ledger.end_all_nodes(record.id, now, "down")
        registry.mark_stopped(record.id, "down", now)
    return registry.get(record.id)


async def get_json(jp_fetch, *path, **params) -> dict:
    response = await jp_fetch("gpugeek", *path, params=params or None)
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    return json.loads(response.body)


async def error_of(call) -> tuple[int, dict]:
    with pytest.raises(HTTPClientError) as info:
        await call
    return info.value.code, json.loads(info.value.response.body)


async def test_no_clusters_is_an_empty_list(jp_fetch):
    data = await get_json(jp_fetch, "clusters")
    assert data["clusters"] == [] and data["live"] == 0 and data["spent_usd"] == 0


async def test_clusters_carry_the_ledgers_dollars(jp_fetch):
    a = synthetic("a", budget=100.0, hours=2.0, usd=10.0)
    b = synthetic("b", backend="local", simulated=False, hours=1.0, usd=3.0)
    gone = synthetic("old", hours=1.0, usd=5.0, stopped=True)
    before = time.time()
    data = await get_json(jp_fetch, "clusters")
    after = time.time()
    by_name = {c["name"]: c for c in data["clusters"]}
    assert [c["name"] for c in data["clusters"]] == ["a", "b", "old"]      # live first
    for record in (a, b):
        c = by_name[record.name]
        # the ledger's own arithmetic, at the instants around the request
        assert ledger.spend(record.id, before) - 1e-9 <= c["spent_usd"] <= ledger.spend(record.id, after) + 1e-9
        assert c["usd_per_hour"] == pytest.approx(ledger.burn_rate(record.id))
        assert c["live"] and c["state"] == "running" and c["nodes"] == 2 and c["gpus"] == 8
        assert c["orphan"] and "orphan" in c["status"]
        assert "%gpugeek up " + record.name in c["attach_code"]
    assert by_name["a"]["spent_usd"] == pytest.approx(22.0, abs=0.01)     # 2 h × ($1 + $10)
    assert by_name["a"]["budget_used"] == pytest.approx(0.22, abs=1e-3) and by_name["a"]["simulated"]
    assert not by_name["b"]["simulated"] and by_name["b"]["budget_used"] is None
    old = by_name["old"]
    assert not old["live"] and old["state"] == "stopped" and old["usd_per_hour"] == 0
    assert old["spent_usd"] == pytest.approx(ledger.spend(gone.id)) and old["nodes"] == 0
    # totals are over the live clusters only
    assert data["live"] == 2 and data["simulated"]
    assert data["spent_usd"] == pytest.approx(by_name["a"]["spent_usd"] + by_name["b"]["spent_usd"])
    assert data["usd_per_hour"] == pytest.approx(11.0 + 4.0)


async def test_one_cluster_has_its_nodes_utilisation_and_events(jp_fetch):
    from gpugeek_jupyter.meter import telemetry

    record = synthetic("d")
    now = time.time()
    telemetry.record_node_samples(record.id, [
        {"t": now - 120, "node_id": "d-gpu", "gpus": [{"gpu": 0, "gpu_util": 5.0}]},      # too old
        {"t": now - 3, "node_id": "d-gpu", "gpus": [{"gpu": 0, "gpu_util": 60.0}]},
        {"t": now - 2, "node_id": "d-gpu", "gpus": [{"gpu": 0, "gpu_util": 97.0, "gpu_mem_used": 32.0,
                                                      "gpu_mem_total": 80.0}]},
        {"t": now - 1, "node_id": "d-gpu", "host": {"cpu_percent": 12.5, "mem_used": 3.0, "mem_total": 10.0}},
    ])
    ledger.event(record.id, "budget", "80% of the budget used")
    data = await get_json(jp_fetch, "clusters", "d")
    assert {r["node"] for r in data["node_rows"]} == {"d-head", "d-gpu"}
    gpu_row = next(r for r in data["node_rows"] if r["node"] == "d-gpu")
    assert gpu_row["usd"] == pytest.approx(20.0, abs=0.01) and gpu_row["alive"] and gpu_row["pricing"] == "spot"
    assert sorted((u["gpu"], u["util_pct"], u["mem_pct"]) for u in data["utilisation"]
                  if u["gpu"] is not None) == [(0, 97.0, 40.0)]
    host = next(u for u in data["utilisation"] if u["gpu"] is None)
    assert host["util_pct"] == 12.5 and host["mem_pct"] == pytest.approx(30.0)
    assert data["events"][0]["message"] == "80% of the budget used"


async def test_unknown_names_are_404_with_a_message(jp_fetch):
    code, body = await error_of(jp_fetch("gpugeek", "clusters", "nope"))
    assert code == 404 and "no cluster named 'nope'" in body["message"]
    code, body = await error_of(jp_fetch("gpugeek", "clusters", "nope", method="DELETE"))
    assert code == 404 and "nope" in body["message"]
    code, body = await error_of(jp_fetch("gpugeek", "clusters", "no such name"))   # not a name at all
    assert code == 404 and "no such name" in body["message"]
    code, body = await error_of(jp_fetch("gpugeek", "clusters", "nope", params={"id": "x"}))
    assert code == 400 and "id" in body["message"]
    assert (await get_json(jp_fetch, "clusters/"))["live"] == 0                     # a trailing slash


async def test_a_name_used_again_keeps_its_runs_apart_and_a_stopped_run_stops_costing(jp_fetch):
    old = synthetic("again", hours=2.0, usd=10.0)
    stop_at = time.time() - 3600                     # stopped an hour ago, one node never closed
    registry.mark_stopped(old.id, "down", stop_at)
    new = synthetic("again", hours=0.5, usd=10.0)
    listed = await get_json(jp_fetch, "clusters")
    runs = [c for c in listed["clusters"] if c["name"] == "again"]
    assert [(c["id"], c["live"]) for c in runs] == [(new.id, True), (old.id, False)]
    # the old run's dollars end at its stop: 1 h × ($1 + $10), not 2 h
    assert runs[1]["spent_usd"] == pytest.approx(11.0, abs=0.01) and runs[1]["usd_per_hour"] == 0
    assert (await get_json(jp_fetch, "clusters", "again"))["id"] == new.id          # the live one
    past = await get_json(jp_fetch, "clusters", "again", id=str(old.id))
    assert past["id"] == old.id and not past["live"]
    code, _ = await error_of(jp_fetch("gpugeek", "clusters", "other", params={"id": str(old.id)}))
    assert code == 404


async def test_a_cluster_still_starting_says_so_and_is_not_stopped_half_way(jp_fetch):
    """Until `up` has recorded the processes it starts, a stop could not reach them."""
    synthetic("booting", ready=False)
    listed = await get_json(jp_fetch, "clusters")
    assert listed["clusters"][0]["state"] == "starting" and not listed["clusters"][0]["orphan"]
    code, body = await error_of(jp_fetch("gpugeek", "clusters", "booting", method="DELETE"))
    assert code == 409 and "still starting" in body["message"]
    assert registry.live("booting") is not None


async def test_every_route_needs_the_token(jp_fetch, http_server_client, jp_base_url):
    synthetic("s")
    for path, method in (("clusters", "GET"), ("clusters/s", "GET"), ("clusters/s", "DELETE"),
                         ("offers?gpu=H100", "GET"), ("metrics", "GET")):
        with pytest.raises(HTTPClientError) as info:
            await http_server_client.fetch(f"{jp_base_url}gpugeek/{path}", method=method,
                                           follow_redirects=False)
        assert info.value.code == 403, path
    assert registry.live("s") is not None       # the refused DELETE did nothing


async def test_metrics_are_prometheus_text_with_the_ledgers_dollars_and_a_scrape_is_no_activity(
        jp_fetch, jp_serverapp):
    from prometheus_client.parser import text_string_to_metric_families

    m = synthetic("m", budget=40.0)           # $1/h head + $10/h GPU node for 2 h: $22 of $40
    synthetic("gone", stopped=True)
    now = time.time()      # two jobs share the burn for the last half hour; one of them still runs
    ledger.job_started(m.id, "j1", "train", at=now - 3600)
    ledger.job_started(m.id, "j2", "eval", at=now - 1800)
    ledger.job_ended(m.id, "j2", at=now - 600)
    before = jp_serverapp.web_app.settings.get("api_last_activity")
    bearer = {"Authorization": f"Bearer {jp_serverapp.identity_provider.token}"}     # as Prometheus sends it
    response = await jp_fetch("gpugeek", "metrics", headers=bearer)
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(response.body.decode())}
    value = {f: {tuple(sorted(s.labels.items())): s.value for s in families[f].samples} for f in families}
    key = (("backend", "sim"), ("cluster", "m"))
    assert value["gpugeek_cluster_spent_usd"][key] == pytest.approx(22.0, rel=1e-3)
    assert value["gpugeek_cluster_usd_per_hour"][key] == 11.0
    assert value["gpugeek_cluster_budget_used_ratio"][key] == pytest.approx(22.0 / 40.0, rel=1e-3)
    assert value["gpugeek_cluster_gpus"][key] == 8 and value["gpugeek_cluster_simulated"][key] == 1
    assert value["gpugeek_cluster_state"][(*key, ("state", "running"))] == 1
    assert not any("gone" in str(labels) for f in value.values() for labels in f), "a stopped cluster is listed"
    by_job = costs.cost_table(m.id, by="job").set_index("job_id")["usd"]    # what `cost --by job` says
    assert value["gpugeek_job_spent_usd"][(("cluster", "m"), ("job", "train"))] == pytest.approx(by_job["j1"], rel=1e-3)
    assert not any(("job", "eval") in labels for labels in value["gpugeek_job_spent_usd"]), "an ended job is listed"
    assert jp_serverapp.web_app.settings.get("api_last_activity") == before, "a scrape kept the server busy"


async def test_a_browser_session_must_send_the_xsrf_token_to_delete(jp_serverapp, http_server_client, jp_base_url):
    """Cookie-authenticated requests (a browser) need jupyter_server's XSRF token for DELETE."""
    synthetic("x")
    login = await http_server_client.fetch(f"{jp_base_url}login", follow_redirects=False)
    cookies = _cookies(login)
    body = urllib.parse.urlencode({"_xsrf": cookies["_xsrf"], "password": jp_serverapp.identity_provider.token})
    logged_in = await http_server_client.fetch(
        f"{jp_base_url}login", method="POST", body=body, follow_redirects=False, raise_error=False,
        headers={"Cookie": _cookie_header(cookies)})
    assert logged_in.code == 302
    cookies.update(_cookies(logged_in))
    url = f"{jp_base_url}gpugeek/clusters/x"
    listed = await http_server_client.fetch(url, headers={"Cookie": _cookie_header(cookies)})
    assert listed.code == 200                     # the cookie alone is enough to read
    with pytest.raises(HTTPClientError) as info:
        await http_server_client.fetch(url, method="DELETE", headers={"Cookie": _cookie_header(cookies)})
    assert info.value.code == 403
    assert registry.live("x") is not None


def _cookies(response) -> dict[str, str]:
    out = {}
    for header in response.headers.get_list("Set-Cookie"):
        name, _, rest = header.partition("=")
        out[name] = rest.split(";", 1)[0]
    return out


def _cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{k}={v}" for k, v in cookies.items())


async def test_offers_are_the_catalogs(jp_fetch):
    from gpugeek_jupyter import offers

    data = await get_json(jp_fetch, "offers", gpu="H100", count="8", pricing="spot", limit="5")
    expected = offers(gpu="H100", count=8, pricing="spot", top=5)
    assert data["count"] == len(expected) == 5
    assert [o["offer_id"] for o in data["offers"]] == list(expected["id"])
    assert [o["usd_per_hour"] for o in data["offers"]] == pytest.approx(list(expected["price"]))
    assert all(o["gpu"] == "H100" and o["gpus"] == 8 and o["pricing"] == "spot" for o in data["offers"])

    nothing = await get_json(jp_fetch, "offers", gpu="H100", count="3")
    assert nothing["offers"] == [] and nothing["message"]
    code, body = await error_of(jp_fetch("gpugeek", "offers", params={"pricing": "cheap"}))
    assert code == 400 and "cheap" in body["message"]
    code, body = await error_of(jp_fetch("gpugeek", "offers", params={"limit": "lots"}))
    assert code == 400 and "limit" in body["message"]
    for bad in ({"count": "abc"}, {"gpu": "A1000"}, {"pricing": ""}, {"limit": "0"}):
        code, body = await error_of(jp_fetch("gpugeek", "offers", params=bad))
        assert code == 400 and body["message"], bad


@pytest.mark.slow
async def test_delete_stops_an_orphaned_local_cluster_and_returns_its_cost(jp_fetch, gpugeek_home):
    """A kernel started the cluster and is gone; DELETE stops every process of it, by PID."""
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text("[cluster]\nlocal_usd_per_hour = 3.6\n")
    started = subprocess.run(
        [sys.executable, "-c", "import gpugeek_jupyter as gg; gg.up('orphan')"],
        env={**os.environ, "GPUGEEK_HOME": str(gpugeek_home)}, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    record = registry.live("orphan")
    ours = cluster_processes.of_cluster(record)
    assert record.watchdog_pid in [p.pid for p in ours] and len(ours) >= 3   # GCS, raylet, watchdog…

    listed = await get_json(jp_fetch, "clusters")
    assert listed["live"] == 1 and listed["clusters"][0]["orphan"]
    response = await jp_fetch("gpugeek", "clusters", "orphan", method="DELETE")
    data = json.loads(response.body)
    assert response.code == 200 and data["stopped"] and data["reason"] == "down (from JupyterLab)"

    assert cluster_processes.still_running(ours, wait=10) == [], "processes of the stopped cluster run on"
    final = registry.get(record.id)
    assert final.stopped is not None and final.stop_reason == "down (from JupyterLab)"
    assert data["spent_usd"] == pytest.approx(ledger.spend(record.id), abs=1e-9) and data["spent_usd"] > 0
    assert "$" in data["message"]

    code, body = await error_of(jp_fetch("gpugeek", "clusters", "orphan", method="DELETE"))
    assert code == 409 and "already stopped" in body["message"]
