"""The views draw only what the ledger holds: each figure's numbers equal the ledger's, to the cent."""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import pytest

from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.meter import costs, ledger
from gpugeek_jupyter.raynodes import RayNode
from gpugeek_jupyter.views.cost import budget_figure, budget_projection, cost_figure, spend_note
from gpugeek_jupyter.views.jobs import FIGURE, MAX_POINTS, job_figure, job_summary, measured_rates
from gpugeek_jupyter.views.utilisation import idle_dollars, utilisation_heatmap
from gpugeek_jupyter.vocab import NodePrice

T0 = 1_700_000_000.0
PRICES = {
    "a100-spot": NodePrice("aws/p4d/us-east-1", "spot", 12.0, on_demand_usd_per_hour=32.0),
    "a100-od": NodePrice("aws/p4d/us-east-1", "on-demand", 32.0, on_demand_usd_per_hour=32.0),
    "head": NodePrice(None, "local", 0.0),
}


def node(node_id, node_type, start, end=None, gpus=8.0, head=False):
    return RayNode(node_id=node_id, node_type=node_type, alive=end is None, is_head=head, started=start,
                   ended=end, idle_s=None, raylet_socket="", resources={"GPU": gpus} if gpus else {})


@pytest.fixture
def cluster():
    """A ledger with a head, two spot nodes (one preempted) and an on-demand replacement."""
    record = registry.create("views", "sim", {}, simulated=True, budget_usd=100.0, idle_minutes=None)
    ledger.sync_nodes(record.id, [
        node("head0", "", T0, gpus=0, head=True),
        node("spot1", "a100-spot", T0 + 60, T0 + 1860),          # 30 min × $12/h = $6
        node("spot2", "a100-spot", T0 + 60),                      # open: runs to `now`
        node("od1", "a100-od", T0 + 1900),                        # open
    ], PRICES)
    return record


NOW = T0 + 3660.0      # spot2: 1 h × $12; od1: 1760 s × $32/h


def test_cumulative_cost_ends_at_the_ledger_total_of_each_node_type_and_pricing(cluster):
    nodes = costs.nodes_frame(cluster.id, NOW)
    curve = costs.spend_curve(nodes, NOW)
    last = curve.groupby(["node_type", "pricing"])["usd"].last()
    table = nodes.groupby(["node_type", "pricing"])["usd"].sum()
    for key, usd in table.items():
        assert round(last[key], 2) == round(usd, 2)
    assert round(last[("a100-spot", "spot")], 2) == 18.00           # 6 + 12, by hand
    assert round(last[("a100-od", "on-demand")], 2) == round(1760 / 3600 * 32, 2)
    # what the same spot hours cost on demand: the gap is the ledger's spot saving
    od = curve.groupby(["node_type", "pricing"])["on_demand_usd"].last()
    saved = od[("a100-spot", "spot")] - last[("a100-spot", "spot")]
    assert round(saved, 2) == round(float(nodes["spot_saved_usd"].sum()), 2) == 30.00
    # cumulative: never decreasing
    for _, group in curve.groupby("label"):
        assert np.all(np.diff(group["usd"].to_numpy()) >= -1e-12)


def test_the_curve_is_the_ledgers_sum_by_each_moment_worked_by_hand(cluster):
    """15 min into the spot nodes: 2 × 900 s × $12/h = $6 spot and $16 at on-demand; 1 h in, spot1
    has ended (30 min: $6) and spot2 runs on ($12); the on-demand node starts at 1900 s."""
    rows = {(r["time"], r["node_type"]): r for r in costs.spend_by(cluster.id, [T0 + 960, T0 + 3660], NOW)}
    assert rows[(T0 + 960, "a100-spot")]["usd"] == pytest.approx(6.0)
    assert rows[(T0 + 960, "a100-spot")]["on_demand_usd"] == pytest.approx(16.0)
    assert rows[(T0 + 960, "a100-od")]["usd"] == 0.0
    assert rows[(T0 + 3660, "a100-spot")]["usd"] == pytest.approx(18.0)
    assert rows[(T0 + 3660, "a100-od")]["usd"] == pytest.approx(1760 / 3600 * 32)
    assert sum(r["usd"] for (t, _), r in rows.items() if t == NOW) == pytest.approx(ledger.spend(cluster.id, NOW))


def test_cost_figure_traces_and_title_carry_the_ledger_numbers(cluster):
    nodes = costs.nodes_frame(cluster.id, NOW)
    fig = cost_figure(nodes, costs.spend_curve(nodes, NOW), title="views", simulated=True)
    stacked = [t for t in fig.data if t.stackgroup == "cost"]
    assert "$" not in fig.layout.title.text, "plotly.js would read the text between two $ as LaTeX"
    # the head at $0/h adds nothing: drawn, its trace would run along the total's edge
    assert {t.name for t in stacked} == {"a100-spot · spot", "a100-od · on-demand"}
    assert "$0 so far, not drawn: head · local" in title(fig)
    assert round(sum(t.y[-1] for t in stacked), 2) == round(ledger.spend(cluster.id, NOW), 2)
    on_demand = next(t for t in fig.data if t.name == "same hours at on-demand")
    assert round(on_demand.y[-1], 2) == round(float(nodes["on_demand_usd"].sum()), 2)
    assert "SIMULATED" in title(fig)
    assert f"total ${ledger.spend(cluster.id, NOW):,.2f}" in title(fig)
    assert "spot saved $30.00" in title(fig)


def test_budget_projection_reaches_the_budget_when_the_burn_says(cluster):
    nodes = costs.nodes_frame(cluster.id, NOW)
    spent = ledger.spend(cluster.id, NOW)
    burn = ledger.burn_rate(cluster.id)
    assert burn == 12.0 + 32.0
    curve = costs.spend_curve(nodes, NOW)
    data = budget_projection(nodes, curve, NOW, 100.0)
    projected = data[data["kind"] == "projected"]
    assert round(projected["usd"].iloc[0], 2) == round(spent, 2)
    assert round(projected["usd"].iloc[-1], 2) == 100.00
    hours = (projected["time"].iloc[-1] - projected["time"].iloc[0]).total_seconds() / 3600
    assert math.isclose(hours, (100.0 - spent) / burn, rel_tol=1e-6)
    fig = budget_figure(nodes, curve, NOW, 100.0, title="b", simulated=True)
    assert {s.y0 for s in fig.layout.shapes} == {100.0, 80.0}
    # no budget: 24 h at the same burn
    free = budget_projection(nodes, curve, NOW, None)
    assert round(free["usd"].iloc[-1], 2) == round(spent + 24 * burn, 2)


def title(fig) -> str:
    """A figure's title as it reads (its dollar signs are HTML entities: see ``views.cost.dollars``)."""
    return html.unescape(fig.layout.title.text)


def gpu_samples(rows):
    return pd.DataFrame([{"node_id": n, "at": T0 + t, "device": d, "gpu_util": u} for n, d, t, u in rows])


def test_idle_dollars_on_a_synthetic_ledger_with_known_answers(cluster):
    """spot2 has 8 GPUs at $12/h → $1.50/GPU-h. gpu0 samples every second for 3600 s, busy for the
    first 2400 s, idle (10 %) for the last 1200 s → idle $ = 1200 s × $1.5/h = $0.50.
    gpu1 is idle throughout but its samples stop after 600 s and resume at 1800 s: the gap is not
    counted (a sample stands for at most 5 s) → 1200 samples × 1 s idle = $0.50."""
    rows = [("spot2", "gpu0", 60 + t, 95.0 if t < 2400 else 10.0) for t in range(3600)]
    rows += [("spot2", "gpu1", 60 + t, 5.0) for t in [*range(600), *range(1800, 2400)]]
    samples = gpu_samples(rows)
    nodes = costs.nodes_frame(cluster.id, NOW)
    idle = idle_dollars(samples, nodes, now=NOW).set_index("device")
    assert round(idle.loc["gpu0", "idle_usd"], 4) == 0.5
    assert round(idle.loc["gpu0", "usd"], 4) == 1.5        # 3600 samples × 1 s (the last one to `now`)
    assert round(idle.loc["gpu1", "idle_usd"], 4) == round((599 + 5 + 599 + 5) / 3600 * 1.5, 4)
    fig = utilisation_heatmap(samples, nodes, now=NOW, simulated=True)
    total_idle = float(idle["idle_usd"].sum())
    assert f"idle ${total_idle:,.2f}" in title(fig)
    assert list(fig.data[0].y) == ["node spot2 · gpu0", "node spot2 · gpu1"]
    # contiguous buckets: gpu0 sampled throughout fills every one; gpu1, sampled a third of the time, shows its gaps
    z = np.asarray(fig.data[0].z, dtype=float)
    assert len(fig.data[0].x) == z.shape[1] + 1              # bucket edges: no gap between bricks
    assert not np.isnan(z[0]).any()
    assert 0.6 < np.isnan(z[1]).mean() < 0.7, z[1]      # sampled 1200 of the 3600 s: the rest shows empty


def test_idle_dollars_stop_at_the_node_end(cluster):
    """spot1 was preempted at T0+1860: a sample just before the end counts only up to the end."""
    samples = gpu_samples([("spot1", "gpu0", 1858, 0.0)])
    idle = idle_dollars(samples, costs.nodes_frame(cluster.id, NOW), now=NOW)
    assert math.isclose(idle["idle_hours"].iloc[0], 2 / 3600)


def test_heatmap_without_gpu_samples_says_so_and_invents_no_idle_dollars(cluster):
    host = pd.DataFrame([{"node_id": "spot2", "at": T0 + t, "device": "host", "cpu_percent": 50.0}
                         for t in range(10)])
    fig = utilisation_heatmap(host, costs.nodes_frame(cluster.id, NOW))
    assert "no GPU telemetry" in title(fig) and "idle $ not measured" in title(fig)
    # ten samples a second apart: buckets no shorter than that, every one filled (not 60 thin stripes)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (1, 9) and not np.isnan(z).any(), z
    assert idle_dollars(host, costs.nodes_frame(cluster.id, NOW)).empty


def job_samples():
    rows = []
    for rank in (0, 1):
        for i in range(5):
            rows.append({"job_id": "j", "rank": rank, "at": T0 + i, "step": 10 * (i + 1),
                         "loss": 2.0 - 0.1 * i + rank, "samples_per_s": 100.0 + rank,
                         "memory_bytes": 2**30 * (1 + rank)})
    return pd.DataFrame(rows)


def test_job_figure_per_worker_series_equal_the_samples():
    samples = job_samples()
    fig = job_figure(samples, title="job")
    loss = [t for t in fig.data if t.xaxis == "x" or t.xaxis is None]
    by_rank = {t.name: t for t in loss}
    assert np.allclose(by_rank["rank 0"].y, [2.0, 1.9, 1.8, 1.7, 1.6])
    assert np.allclose(by_rank["rank 1"].y, [3.0, 2.9, 2.8, 2.7, 2.6])
    memory = [t for t in fig.data if t.xaxis == "x3"]
    assert sorted(t.y[0] for t in memory) == [1.0, 2.0]
    note = next(a for a in fig.layout.annotations if a.text == "no GPU on these workers")
    assert (note.xref, note.yref) == ("x4 domain", "y4 domain")      # in the GPU panel
    assert (note.x, note.y, note.xanchor, note.yanchor) == (0.5, 0.5, "center", "middle")
    # plotly.js makes a subplot only for a trace on it: else the note's axes are the loss chart's
    assert [(t.xaxis, t.yaxis, len(t.x), t.showlegend) for t in fig.data if t.xaxis == "x4"] == \
        [("x4", "y4", 0, False)]
    summary = job_summary(samples)
    assert summary["step"] == 50 and summary["loss"] == pytest.approx(1.6)
    assert summary["samples_per_s"] == pytest.approx(201.0) and summary["workers"] == 2
    assert summary["peak_memory_gib"] == pytest.approx(2.0)


def test_the_cost_report_equals_the_ledger(cluster, monkeypatch):
    """``cost()`` — what ``%gpugeek cost`` and the dashboard show — reads the same numbers."""
    import gpugeek_jupyter.api as api

    monkeypatch.setattr(api.time, "time", lambda: NOW)
    report = api.cost("views", by="pricing")
    assert round(report.total_usd, 2) == round(ledger.spend(cluster.id, NOW), 2)
    assert round(float(report.table["usd"].sum()), 2) == round(report.total_usd, 2)
    assert report.spot_saved_usd == pytest.approx(30.0)
    assert "budget $100.00" in report.summary()
    assert report.idle_usd is None           # no GPU samples: nothing claimed
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}   # no kernel here: no widget
    assert f"${report.total_usd:,.2f}" in bundle["text/plain"]


def test_a_free_cluster_draws_no_spend_chart_and_says_so_in_one_line():
    """A local cluster at $0/h has no $ to chart: no flat $0 line, one line that says it is free."""
    record = registry.create("free", "local", {}, simulated=False, budget_usd=None, idle_minutes=None)
    ledger.sync_nodes(record.id, [node("head0", "", T0, gpus=0, head=True)], PRICES)
    nodes = costs.nodes_frame(record.id, NOW)
    curve = costs.spend_curve(nodes, NOW)
    for fig in (cost_figure(nodes, curve, title="free: cumulative cost", simulated=False),
                budget_figure(nodes, curve, NOW, None, title="free: spend and budget", simulated=False)):
        assert list(fig.data) == [], [t.name for t in fig.data]
        assert not fig.layout.xaxis.visible and not fig.layout.yaxis.visible
        assert "free" in title(fig) and "no $ to chart" in title(fig)
        assert "<br>" not in title(fig)           # one line
        assert spend_note(fig) == "free: every node at $0/h, no $ to chart"
    empty = costs.nodes_frame(record.id, NOW).iloc[0:0]
    assert spend_note(cost_figure(empty, costs.spend_curve(empty, NOW), title="t",
                                  simulated=False)) is None      # nothing metered yet: not "free"


def test_a_cluster_that_costs_something_keeps_its_spend_charts(cluster):
    nodes = costs.nodes_frame(cluster.id, NOW)
    curve = costs.spend_curve(nodes, NOW)
    assert spend_note(cost_figure(nodes, curve, title="t", simulated=True)) is None
    assert spend_note(budget_figure(nodes, curve, NOW, 100.0, title="b", simulated=True)) is None


def test_memory_and_throughput_axes_start_at_zero():
    """Memory that moves by 0.4 MiB around 0.5 GiB is flat on an axis from 0, not a trend."""
    samples = job_samples().assign(memory_bytes=[int(2**30 * (0.4986 + 0.0001 * (i % 5))) for i in range(10)])
    fig = job_figure(samples, title="job")
    assert fig.layout.yaxis2.rangemode == "tozero"       # samples/s
    assert fig.layout.yaxis3.rangemode == "tozero"       # memory
    assert fig.layout.yaxis4.rangemode == "tozero"       # GPU %


def reports(rank, rates, start=0.0):
    """A worker's reports as the helper sends them: the first is over the loop's start (warm-up),
    then one a second, then the loop's tail (one batch, a fraction of a millisecond later)."""
    rows = [{"job_id": "j", "rank": rank, "at": T0 + start, "step": 1, "samples_per_s": 3.0}]
    rows += [{"job_id": "j", "rank": rank, "at": T0 + start + i + 1, "step": 10 * (i + 1),
              "samples_per_s": rate} for i, rate in enumerate(rates)]
    rows.append({"job_id": "j", "rank": rank, "at": T0 + start + len(rates) + 0.0004,
                 "step": 10 * len(rates) + 1, "samples_per_s": 43912.0})
    return rows


def test_throughput_leaves_out_each_workers_warm_up_and_a_loops_tail():
    samples = pd.DataFrame(reports(0, [100.0, 110.0, 90.0]) + reports(1, [101.0, 99.0, 100.0], start=0.01))
    fig = job_figure(samples, title="job")
    speed = {t.name: list(t.y) for t in fig.data if t.xaxis == "x2"}
    assert speed == {"rank 0": [100.0, 110.0, 90.0], "rank 1": [101.0, 99.0, 100.0]}
    assert job_summary(samples)["samples_per_s"] == pytest.approx(100.0 + 100.0)
    rates = measured_rates(samples)
    assert sorted(rates["samples_per_s"].dropna()) == [90.0, 99.0, 100.0, 100.0, 101.0, 110.0]


def steps_job(steps=128, every=32, logged=True):
    """Two ranks of a job of ``steps`` steps whose workers report every ``every`` steps (about once
    a second), each report with the loss of every step logged since the previous one."""
    rows = []
    for rank in (0, 1):
        for end in range(every, steps + 1, every):
            done = list(range(end - every + 1, end + 1))
            rows.append({"job_id": "j", "rank": rank, "at": T0 + end / every + rank * 0.3, "step": end,
                         "loss": 1.0 / end + rank, "samples_per_s": 100.0, "memory_bytes": 2**29,
                         **({"logged": {"step": done, "loss": [1.0 / s + rank for s in done]}}
                            if logged else {})})
    return pd.DataFrame(rows)


def test_a_finished_jobs_figure_has_every_logged_step_of_every_rank_by_step(cluster):
    """A 128-step job whose workers reported 4 times each: the loss is drawn at all 128 steps of
    each rank (as the ledger keeps them), and every panel's x axis is the step."""
    job = steps_job()
    ledger.record_samples(cluster.id, "j", [{k: v for k, v in r.items() if k not in ("job_id", "at")}
                                            | {"t": r["at"]} for r in job.to_dict("records")])
    fig = job_figure(ledger.samples_frame(cluster.id, "j"), title="job")
    loss = {t.name: t for t in fig.data if t.xaxis == "x"}
    assert set(loss) == {"rank 0", "rank 1"}
    for rank, trace in enumerate(loss[f"rank {r}"] for r in (0, 1)):
        assert list(trace.x) == list(range(1, 129))
        assert np.allclose(trace.y, [1.0 / s + rank for s in range(1, 129)])
    speed = [t for t in fig.data if t.xaxis == "x2"]
    assert [list(t.x) for t in speed] == [[64, 96, 128]] * 2          # each report at its step (the first: warm-up)
    assert fig.layout.xaxis3.title.text == fig.layout.xaxis4.title.text == "step"
    assert {fig.layout[f"xaxis{i}"].matches for i in (2, 3, 4)} == {"x"}     # one step axis for the four
    assert [a.text for a in fig.layout.annotations][:2] == ["loss", "samples/s"]     # nothing thinned

    # reports without the logged steps: one point per report, still at its step
    plain = job_figure(steps_job(logged=False), title="job")
    assert [list(t.x) for t in plain.data if t.xaxis == "x"] == [[32, 64, 96, 128]] * 2
    assert plain.layout.annotations[0].text == "loss · at each report"          # and says so


def test_a_long_jobs_loss_is_thinned_past_the_bound_and_says_so():
    steps = 3 * MAX_POINTS
    fig = job_figure(steps_job(steps=steps, every=100), title="job")
    loss = [t for t in fig.data if t.xaxis == "x"]
    assert [len(t.x) for t in loss] == [MAX_POINTS] * 2
    assert all(t.x[0] == 1 and t.x[-1] == steps for t in loss)            # the first and the last kept
    assert fig.layout.annotations[0].text == f"loss · {MAX_POINTS} of {steps:,} points per worker"
    assert fig.layout.annotations[1].text == "samples/s"                  # 15 reports: all drawn


def _row_gap_px(fig) -> float:
    """Pixels between the top row's plot area and the bottom row's."""
    plot = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    return (fig.layout.yaxis.domain[0] - fig.layout.yaxis3.domain[1]) * plot


def test_the_bottom_panels_titles_clear_what_is_under_the_top_panels():
    """Each bottom panel's title sits above its plot area; what hangs under the top panel above it
    (tick labels, and an axis title if there is one) must end before the title begins."""
    fig = job_figure(job_samples(), title="job")
    font = 12                                 # plotly's default font size; titles 16, axis titles 14
    tick_labels = 3 + 1.3 * font              # plotly's tick label pad and one line of text
    for title in fig.layout.annotations[2:4]:
        assert title.yanchor == "bottom" and title.y == fig.layout.yaxis3.domain[1]
        col = "" if title.x < 0.5 else "2"
        above = fig.layout[f"xaxis{col}"]
        under_top = tick_labels + (1.3 * 14 + 10 if above.title.text else 0)
        title_px = 1.3 * 16
        assert under_top + title_px < _row_gap_px(fig), (title.text, above.title.text, _row_gap_px(fig))
    assert not fig.layout.xaxis.title.text and not fig.layout.xaxis2.title.text
    assert FIGURE["height"] == fig.layout.height
