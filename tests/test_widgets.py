"""Widgets call the same API as the magics: filters re-query the catalog, buttons start and stop
real clusters, and the panel's dollars are the ledger's."""

from __future__ import annotations

import html
import re
import time

import numpy as np
import pytest
from cluster_processes import wait_until

import gpugeek_jupyter.api as api
from gpugeek_jupyter.cluster import processes, registry
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.kernel.session import current
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.widgets import ClusterPanel, CostDashboard, OfferPicker
from gpugeek_jupyter.widgets.job import JobMonitor


def test_every_filter_change_requeries_the_catalog():
    picker = OfferPicker(gpu="A100", count=8)
    asked = picker.queries
    picker.pricing.value = "spot"
    assert picker.queries == asked + 1
    expected = api.offers(gpu="A100", count=8, pricing="spot")
    assert list(picker.offers["id"]) == list(expected["id"])
    assert picker.choice.value == expected["id"].iloc[0]
    assert f"{len(expected)} offers" in picker.count_label.value
    points = sum(len(t.x) for t in picker.chart.figure.data if t.name != "frontier")
    assert points == len(expected.dropna(subset=["peak_tflops", "price_per_gpu_hour"]))

    picker.provider.value = "aws"
    picker.min_mem.value = 80
    assert picker.queries == asked + 3
    assert list(picker.offers["id"]) == list(api.offers(gpu="A100", count=8, pricing="spot", provider="aws",
                                                        min_gpu_mem=80)["id"])
    assert (picker.offers["gpu_mem_gib"] >= 80).all()

    picker.max_price.value = 0.01          # nothing that cheap: one line says why, nothing chosen
    assert "no offers match" in picker.message.value and picker.choice.value is None
    with pytest.raises(GpugeekError, match="no offer chosen"):
        picker.provision()


def test_plan_button_plans_against_the_filtered_offers():
    picker = OfferPicker(gpu="H100", count=8, pricing="spot", params="7B")
    picker.plan_button.click()
    plan = current().last_plan
    assert plan is not None and picker.message.value == ""
    assert set(plan.table["gpu"]) == {"H100"} and plan.pricing == "spot"
    assert plan.best is not None and plan.memory.gpus == 8
    assert picker.shown is plan


def test_an_offer_no_backend_rents_gets_the_ssh_way_in_and_starts_nothing(gpugeek_home):
    """RunPod, Lambda, Vast, Nebius: rented on their own sites. The picker marks them, and its
    cloud launch (dry or not) answers with the command that starts Ray on the rented box, priced
    as the offer — counted against the catalog file read here, not by our mark."""
    import pandas as pd

    from gpugeek_jupyter.catalog.fresh import bundled_path
    from gpugeek_jupyter.provision.request import UpRequest, spec_of

    raw = pd.read_csv(bundled_path())
    launched = {"aws", "gcp", "azure"}            # the clouds Ray's cluster launcher rents (docs/machines/cloud.md)
    every = api.offers()
    assert (every["up_with"] == "rent, then ssh").sum() == (~raw["provider"].isin(launched)).sum()
    assert set(every.loc[every["provider"].isin(launched), "up_with"].str.removesuffix(api.YOUR_IMAGE)) == launched

    picker = OfferPicker(provider="runpod")
    offer, price = picker.choice.value, picker.offers["price"].iloc[0]
    assert "rent, then ssh" in picker.table.value and "rent, then ssh" in picker.choice.label
    for kind in ("cloud-dry-run", "cloud"):
        picker.backend.value, picker.budget.value = kind, 20
        picker.provision_button.click()
        said = html.unescape(re.sub("<[^>]+>", "", picker.message.value))
        assert said.endswith(f"%gpugeek up runpod --backend ssh --hosts USER@ADDRESS --offer {offer} --budget 20"), said
        assert "firebrick" not in picker.message.value and registry.all_records() == []
    with pytest.raises(GpugeekError, match=r"^offer runpod/.*: `up` cannot rent runpod machines .* --offer runpod/"):
        api.up(backend="aws", offer=offer, dry_run=True)
    with pytest.raises(GpugeekError, match=r"^`up` cannot rent lambda machines .*offers --provider lambda\)$"):
        api.up(backend="lambda")
    assert spec_of(UpRequest.of({"backend": "sim", "offer": offer})).node_types[0].offer_id == offer, \
        "a rehearsal of any offer goes on"
    spec = spec_of(UpRequest.of({"backend": "ssh", "hosts": "root@box", "offer": offer}))
    assert spec.head_price.usd_per_hour == pytest.approx(price) and spec.node_types[0].provider == "runpod"


def test_picker_rejects_bad_starting_filters_in_one_line():
    with pytest.raises(GpugeekError, match="one GPU family"):
        OfferPicker(gpu="H100,A100")
    with pytest.raises(GpugeekError, match="--count 3"):
        OfferPicker(count=3)


def _gone(record, timeout=15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not processes.session_processes(record.session_id, record.created, record.marker) and \
                not processes.alive(record.watchdog_pid):
            return True
        time.sleep(0.3)
    return False


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_provision_button_starts_a_sim_cluster_and_the_panel_shuts_it_down():
    picker = OfferPicker(gpu="A100", count=8)
    picker.workers.value, picker.budget.value = 1, 50
    offer = picker.choice.value
    picker.provision_button.click()
    assert picker.message.value == "", picker.message.value
    record = registry.live("sim")
    assert record is not None and record.backend == "sim" and record.budget_usd == 50
    try:
        import ray

        deadline = time.monotonic() + 60
        while ray.cluster_resources().get("GPU", 0) < 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray.cluster_resources()["GPU"] == 8
        assert [t["offer_id"] for t in record.spec["node_types"]] == [offer]

        panel = ClusterPanel("sim", period=0.5)
        assert panel.refresher.running
        time.sleep(1.5)                               # the refresher has redrawn meanwhile
        live_cost = api.cost("sim").total_usd
        assert abs(panel.status.spent_usd - live_cost) < 0.01
        assert "SIMULATED" in panel.header.value
        assert panel.gauge.max == 50 and "of $50.00" in panel.gauge_label.value
        assert panel.workers.value == 1
        # the node table in words, GPUs counted whole
        titles = re.findall(r"<th>(.*?)</th>", panel.nodes.value)
        rows = [re.findall(r"<td>(.*?)</td>", row) for row in panel.nodes.value.split("<tr>")[1:]]
        assert titles == ["node", "type", "GPUs", "pricing", "$/h", "up for"], panel.nodes.value
        assert sorted(row[2] for row in rows) == ["0", "8"], panel.nodes.value
        dashboard = CostDashboard("sim", by="job", start=False)
        assert dashboard.by.description == "cost by" and "node type" in dashboard.by._options_labels
        assert "<th>job</th>" in dashboard.table.value and "<th>$</th>" in dashboard.table.value
        assert "job_id" not in dashboard.table.value and "usd" not in dashboard.table.value

        panel.down_button.click()                     # asks first
        assert registry.live("sim") is not None and "Really" in panel.down_button.description
        panel.down_button.click()
        assert registry.live("sim") is None
        assert _gone(record), "every process of the cluster stopped"
        final = api.cost("sim").total_usd
        assert panel.status.spent_usd == pytest.approx(final, abs=1e-9)
        assert f"${final:,.4f}" in panel.message.value and final > 0
        assert not panel.refresher.running
    finally:
        if registry.live("sim"):
            api.down("sim")


def test_the_job_monitor_redraws_at_most_once_a_second_and_keeps_few_points():
    record = registry.create("m", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.job_started(record.id, "j1", "job", workers=2)
    monitor = JobMonitor(cluster_id=record.id, job_id="j1", name="job", workers=2, simulated=False,
                         show_after=0.0, every=1.0)
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 2.5:            # a fast job: 2 workers × thousands of reports
        step += 1
        monitor.update([{"rank": r, "t": time.time(), "step": step, "loss": 1.0 / step,
                         "samples_per_s": 100.0, "total_steps": 10**7} for r in (0, 1)])
    assert step > 2000
    assert 2 <= monitor.draws <= 4, monitor.draws
    assert len(monitor.loss.points()) <= 1001 and len(monitor.speed) <= 1000
    assert monitor.loss.points()[-1][0] == step         # thinned, never the newest dropped
    shown = int(re.match(r"step (\d+)/10000000 · ", monitor.progress.value).group(1))
    assert step / 3 < shown <= step and "ETA" in monitor.progress.value   # as of the last redraw
    assert monitor.bar.max == 10**7 and monitor.bar.value == shown


def test_a_finished_job_leaves_a_static_summary_and_figure():
    record = registry.create("m", "local", {}, simulated=True, budget_usd=None, idle_minutes=None)
    ledger.job_started(record.id, "j1", "job", workers=2)
    t = time.time()
    ledger.record_samples(record.id, "j1", [{"rank": r, "t": t + i, "step": i, "loss": 2.0 - i / 10,
                                              "samples_per_s": 50.0, "total_steps": 9, "loop_start": 0}
                                             for i in range(10) for r in (0, 1)])
    ledger.job_ended(record.id, "j1")
    monitor = JobMonitor(cluster_id=record.id, job_id="j1", name="job", workers=2, simulated=True)
    report = monitor.finish("finished")
    summary = report.summary_bundle()
    assert "<progress" in summary["text/html"] and "value='9' max='9'" in summary["text/html"]
    assert "step 9/9" in summary["text/plain"] and "(simulated)" in summary["text/plain"]
    assert report.usd == float(costs.cost_table(record.id, "job")["usd"].iloc[0])
    figure = report.figure_bundle()
    assert {"application/vnd.plotly.v1+json", "text/html", "text/plain"} <= set(figure)
    loss = next(t for t in report.figure().data if t.name == "rank 0")
    assert list(loss.y) == pytest.approx([2.0 - i / 10 for i in range(10)])


def test_a_quiet_short_cell_leaves_nothing():
    record = registry.create("m", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.job_started(record.id, "j1", "x = 1")
    monitor = JobMonitor(cluster_id=record.id, job_id="j1", name="x", workers=2, simulated=False)
    monitor.update([])
    assert monitor.finish("finished") is None and monitor.box is None


def test_objects_fall_back_to_html_and_text_outside_a_kernel():
    picker = OfferPicker(gpu="T4")
    bundle = picker._repr_mimebundle_()
    assert "text/html" in bundle and "text/plain" in bundle and "offers" in bundle["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in bundle      # the picker is a widget itself


def test_total_steps_follow_the_loop_with_accumulation_across_epochs():
    from gpugeek_jupyter.workers.helper import _last_step

    assert _last_step(range(10), 3, 3, None, 0) == 10          # 30 micro-batches // 3
    assert _last_step(range(10), 3, 3, 7, 0) == 7               # max_steps is absolute
    assert _last_step(range(10), 1, 1, None, 40) == 50          # a second loop on the same model
    assert _last_step(iter(range(10)), 1, 1, None, 0) is None   # no length: no total


def test_showing_a_panel_again_stops_the_older_refresher():
    from gpugeek_jupyter.widgets._base import Refresher

    ticks = {"a": 0, "b": 0}
    notes = []

    def counter(name):
        def tick():
            ticks[name] += 1
            return True
        return tick

    first = Refresher(counter("a"), 0.05, notes.append, key=("cluster", "x"))
    first.on_superseded = notes.append
    first.start()
    wait_until(lambda: ticks["a"] >= 2, 10, "the first panel to tick")
    second = Refresher(counter("b"), 0.05, notes.append, key=("cluster", "x")).start()
    assert not first.running and second.running
    assert notes == ["a newer panel of this cluster is the live one"]
    seen, begun = ticks["a"], ticks["b"]
    wait_until(lambda: ticks["b"] >= begun + 4, 10, "the newer panel to tick four times")
    assert ticks["a"] == seen, "the superseded panel went on ticking"
    second.stop()
    assert not second.thread.is_alive()


def test_results_show_as_their_widget_only_where_a_front_end_can(ipython, monkeypatch):
    """The notebook layer plugs itself in (``%load_ext`` registered it): a cost report is text and
    HTML in plain IPython, and gains its dashboard only inside a kernel."""
    import pandas as pd
    import plotly.graph_objects as go

    from gpugeek_jupyter import display
    from gpugeek_jupyter.api import CostReport

    report = CostReport(name="x", by="node", table=pd.DataFrame({"usd": [1.0]}), figure=go.Figure(),
                        total_usd=1.0, spot_saved_usd=0.0, simulated=False, budget_figure=go.Figure(),
                        utilisation_figure=go.Figure())
    assert set(report._repr_mimebundle_()) == {"text/plain", "text/html"}      # plain IPython
    monkeypatch.setattr(display, "in_kernel", lambda: True)
    bundle = report._repr_mimebundle_()
    assert {"text/plain", "text/html", display.WIDGET_MIME} <= set(bundle)
    assert "x: $1.00" in bundle["text/plain"]


def _wait_for(check, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_every_panel_of_a_stopped_cluster_says_stopped_and_offers_no_shut_down():
    """The panel of ``up`` is superseded by the one of ``status``; both end disabled once it stops."""
    from gpugeek_jupyter.provision.nodetypes import spec_for

    record = registry.create("p", "local", spec_for("local").to_json(), simulated=False, budget_usd=None,
                             idle_minutes=None)
    first = ClusterPanel("p", period=0.05)
    second = ClusterPanel("p", period=0.05)
    try:
        assert not first.refresher.running and second.refresher.running
        assert not first.down_button.disabled                 # the cluster still runs: it can be stopped
        registry.mark_stopped(record.id, "down")
        for panel in (second, first):
            assert _wait_for(lambda p=panel: p.down_button.disabled), panel.header.value
            assert panel.down_button.description == "Stopped" and panel.down_button.button_style == ""
            assert "stopped" in panel.header.value and panel.scale_button.disabled
    finally:
        first.close()
        second.close()


def test_three_panels_and_the_shut_down_button_leave_every_panel_stopped(monkeypatch):
    """``up``, then ``status`` twice: the oldest panel is handed on, not dropped; and when the
    newest panel's own button stops the cluster, the older ones say stopped too."""
    from gpugeek_jupyter.provision.nodetypes import spec_for

    record = registry.create("q", "local", spec_for("local").to_json(), simulated=False, budget_usd=None,
                             idle_minutes=None)
    panels = [ClusterPanel("q", period=0.05) for _ in range(3)]
    monkeypatch.setattr(api, "down", lambda name: registry.mark_stopped(record.id, "down"))
    try:
        assert [p.refresher.running for p in panels] == [False, False, True]
        assert panels[2].refresher.followers == [panels[0].refresher, panels[1].refresher]
        newest = panels[2]
        newest.shut_down()
        newest.shut_down()                     # the second click stops it
        for panel in panels:
            assert _wait_for(lambda p=panel: p.down_button.disabled), panel.header.value
            assert "stopped" in panel.header.value
    finally:
        for panel in panels:
            panel.close()


def test_a_free_cluster_dashboard_says_free_instead_of_drawing_spend():
    from test_views import node

    from gpugeek_jupyter.vocab import NodePrice
    from gpugeek_jupyter.widgets import CostDashboard

    record = registry.create("free", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.sync_nodes(record.id, [node("head0", "", time.time() - 60, gpus=0, head=True)],
                      {"": NodePrice(None, "local", 0.0)})
    dashboard = CostDashboard("free", by="job", report=api.cost("free", by="job", sync=False), start=False)
    try:
        assert dashboard.cost.layout.display == "none" and dashboard.budget.layout.display == "none"
        assert "free" in dashboard.free.value and "no $ to chart" in dashboard.free.value
        assert dashboard.free.layout.display != "none"
    finally:
        dashboard.close()


def test_the_live_throughput_chart_starts_at_zero_with_every_worker_counted():
    """Reports arrive in batches, both ranks at once: each point is Σ of the workers' rates over
    the same second — never one worker's alone (a vertical jump) — from the job's first report,
    without the warm-up window or the loop's tail (one batch over a fraction of a millisecond)."""
    record = registry.create("m", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.job_started(record.id, "j1", "job", workers=2)
    monitor = JobMonitor(cluster_id=record.id, job_id="j1", name="job", workers=2, simulated=False,
                         show_after=0.0, every=0.0)
    t0 = time.time() - 30

    def report(rank, at, step, rate=None):
        return {"rank": rank, "t": t0 + at, "step": step, **({"samples_per_s": rate} if rate else {})}

    time.sleep(0.2)                                   # the workers took a while to start
    monitor.update([report(0, 0.0, 1), report(1, 0.01, 1)])
    monitor.update([report(0, 1.0, 40, 57.0), report(0, 2.0, 80, 62.0), report(1, 1.01, 40, 56.0),
                    report(1, 2.01, 80, 61.0)])
    monitor.update([report(0, 3.0, 120, 60.0), report(1, 3.01, 120, 60.0),
                    report(1, 3.0104, 121, 43912.0), report(0, 3.0104, 121, 40000.0)])
    xs, ys = zip(*monitor.speed, strict=True)
    assert list(ys) == [57.0 + 56.0, 62.0 + 61.0, 60.0 + 60.0]
    assert xs == pytest.approx([1.01, 2.01, 3.01], abs=1e-3)      # seconds since the first report
    assert "120.0 samples/s" in monitor.stats.value
    layout = monitor.figure.outputs[0]["data"]["application/vnd.plotly.v1+json"]["layout"]
    assert layout["xaxis2"]["rangemode"] == "tozero" and layout["yaxis2"]["rangemode"] == "tozero"


def _monitor(workers=2, name="m"):
    record = registry.create(name, "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.job_started(record.id, "j1", "job", workers=workers)
    return JobMonitor(cluster_id=record.id, job_id="j1", name="job", workers=workers, simulated=False,
                      show_after=0.0, every=0.0)


def _table(monitor) -> list[list[str]]:
    return [re.findall(r"<td>(.*?)</td>", row) for row in monitor.table.value.split("<tr>")[2:]]


def test_the_rank_table_shows_every_rank_as_of_one_step():
    """Each rank reports on its own clock: rank 0's newest report is at step 120, rank 1's at 70.
    The table shows both as of step 70 (the latest both have reported), each with the figures of
    its report whose window holds step 70 — never rank 0 at 120 beside rank 1 at 70."""
    monitor = _monitor()
    t0 = time.time()

    def report(rank, step, rate, gib):
        return {"rank": rank, "t": t0 + step / 40, "step": step, "samples_per_s": rate,
                "memory_bytes": gib * 2**30, "total_steps": 200}

    monitor.update([report(0, 40, 10.0, 1), report(1, 30, 20.0, 2), report(0, 80, 11.0, 1),
                    report(1, 70, 21.0, 2), report(0, 120, 12.0, 1)])
    assert _table(monitor) == [["0", "70", "11.0", "1.00", "—"], ["1", "70", "21.0", "2.00", "—"]]
    assert "every rank as of step 70, the latest step all of them have reported (rank 0 has reported " \
        "step 120)" in monitor.table.value
    assert "step 120/200" in monitor.progress.value            # the progress line: rank 0's newest
    monitor.update([report(1, 110, 22.0, 2), report(1, 150, 23.0, 2)])
    assert [row[:3] for row in _table(monitor)] == [["0", "120", "12.0"], ["1", "120", "23.0"]]


def test_the_live_loss_has_every_logged_step_until_the_bound_then_says_how_few():
    from gpugeek_jupyter.widgets.job import MAX_POINTS

    monitor = _monitor()
    t0 = time.time()

    def report(rank, end, every=50):
        done = list(range(end - every + 1, end + 1))
        return {"rank": rank, "t": t0 + end / 50, "step": end, "loss": 1.0 / end,
                "logged": {"step": done, "loss": [1.0 / s for s in done]}}

    monitor.update([report(r, end) for end in (50, 100) for r in (0, 1)])
    spec = monitor.figure.outputs[0]["data"]["application/vnd.plotly.v1+json"]
    assert spec["data"][0]["x"] == list(range(1, 101))                      # rank 0's every logged step
    assert spec["data"][0]["y"] == pytest.approx([1.0 / s for s in range(1, 101)])
    assert spec["layout"]["annotations"][0]["text"] == "loss (rank 0, every logged step)"
    assert spec["layout"]["xaxis"]["title"]["text"] == "step"

    last = 5 * MAX_POINTS
    monitor.update([report(0, end) for end in range(150, last + 1, 50)])
    spec = monitor.figure.outputs[0]["data"]["application/vnd.plotly.v1+json"]
    x = spec["data"][0]["x"]
    assert len(x) <= 2 * MAX_POINTS + 1 and x[0] == 1 and x[-1] == last       # the newest kept
    stride = monitor.loss.stride
    assert stride == 4 and set(np.diff(x[:-1])) == {stride}                  # evenly: 1 in 4 logged steps
    assert spec["layout"]["annotations"][0]["text"] == f"loss (rank 0, 1 in {stride} logged steps)"

    monitor = _monitor(name="m2")       # reports without their steps' log: a point per report, said
    monitor.update([{"rank": 0, "t": t0 + i, "step": 40 * i, "loss": 1.0 / i} for i in (1, 2, 3)])
    spec = monitor.figure.outputs[0]["data"]["application/vnd.plotly.v1+json"]
    assert spec["data"][0]["x"] == [40, 80, 120]
    assert spec["layout"]["annotations"][0]["text"] == "loss (rank 0, at each report)"
