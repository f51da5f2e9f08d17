"""``JobMonitor``: a running ``%%gpugeek run`` job, live — steps and ETA, loss, throughput,
per-worker GPU % and memory, and what the job has cost so far.

The run loop hands it the workers' reports as they arrive (in the kernel's main thread, between
waits — nothing here touches the workers). It appears once the job has run ~2 s (short cells stay
quiet, like ipyparallel's progress), redraws at most once a second whatever the report rate,
and keeps at most 2 × ``MAX_POINTS`` points per line (the final figure at most ``MAX_POINTS`` per
worker and metric), so a 100k-step job neither floods the notebook
nor slows training. When the job ends the live widget is replaced by a static summary and the
job's figure, drawn from the ledger, so the saved notebook reads the same without a kernel.

The loss is drawn by step, at every step rank 0 logged (``views.jobs.logged_points``) until the
line holds 2 × ``MAX_POINTS``; from then on 1 in 2 logged steps, then 1 in 4, … — always with
the newest — and the chart's title says which. The table shows every rank as of one step:
the latest step all of them have reported (their reports come at different moments, so each
rank's newest report stands at a step of its own); each rank's figures are from its report whose
window holds that step.

The live samples/s chart runs from the job's first report (0 s, on the workers' clock). Each
point is Σ of every worker's rate over the same round of reports — never some workers' alone,
which drew a jump wherever a batch of reports arrived — and leaves out what measures no
throughput (a worker's warm-up window, a loop's tail: ``views.jobs.rate_counts``).
"""

from __future__ import annotations

import html
import time
from collections import deque

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..errors import GpugeekError
from ..meter import costs, ledger
from ..sizing.advise import advise_job
from ..units import duration
from ..views.jobs import LOGGED, job_figure, job_summary, logged_points, rate_counts
from ._base import LiveFigure, figure_json

SHOW_AFTER_S = 2.0
REDRAW_EVERY_S = 1.0
MAX_POINTS = 500
RATES_WAITING = 8       # per worker, for a round to be complete (a worker without rates: no points)
KEPT_REPORTS = 32       # per worker, its newest reports with a step: the table's common step is among them


class JobMonitor:
    def __init__(self, *, cluster_id: int, job_id: str, name: str, workers: int, simulated: bool,
                 show_after: float = SHOW_AFTER_S, every: float = REDRAW_EVERY_S):
        self.cluster_id, self.job_id, self.name = cluster_id, job_id, name
        self.workers, self.simulated = workers, simulated
        self.show_after, self.every = show_after, every
        self.started = time.monotonic()
        self.latest: dict[int, dict] = {}          # rank → its newest report
        self.reports: dict[int, deque[dict]] = {}  # rank → its newest reports with a step, oldest first
        self.loss = StepSeries(2 * MAX_POINTS)     # (step, loss) from rank 0, every logged step
        self.speed: list[tuple[float, float]] = []  # (seconds since the first report, Σ samples/s)
        self.origin: float | None = None            # the job's first report (workers' clock): 0 s
        self.reported: dict[int, float] = {}        # rank → its last report: its next rate's window opens there
        self.rates: dict[int, deque[tuple[float, float]]] = {}   # rank → (at, samples/s) not in a point yet
        self.tokens: dict[int, float] = {}          # rank → its last tokens/s that measures throughput
        self.handle = None
        self.box: w.VBox | None = None
        self.drawn_at = 0.0
        self.draws = 0
        self.first: tuple[float, int] | None = None   # (time, step) of rank 0's first report: the rate's origin

    # -- fed by the run loop --------------------------------------------------------------------

    def update(self, samples: list[dict]) -> None:
        for sample in samples:
            rank = int(sample.get("rank", 0))
            self.latest[rank] = sample
            if sample.get("step") is not None:
                self.reports.setdefault(rank, deque(maxlen=KEPT_REPORTS)).append(sample)
            if rank == 0 and self.first is None and sample.get("step") is not None:
                self.first = (time.monotonic(), int(sample["step"]))
            if rank == 0:
                for step, loss in logged_points(sample):
                    self.loss.add(step, loss, logged=isinstance(sample.get(LOGGED), dict))
            self._count_rate(rank, sample)
        if len(self.speed) > 2 * MAX_POINTS:
            del self.speed[1::2]                 # thin out evenly; the shape stays
        now = time.monotonic()
        if now - self.started < self.show_after or now - self.drawn_at < self.every:
            return
        if self.box is None:
            self._build()
        self._draw()
        self.drawn_at = now

    def _count_rate(self, rank: int, sample: dict) -> None:
        """Add a point each time every worker heard from has a rate that measures throughput:
        the oldest waiting one of each, so reports that arrive in batches pair up by round."""
        at = float(sample.get("t") or time.time())
        self.origin = at if self.origin is None else min(self.origin, at)
        previous, self.reported[rank] = self.reported.get(rank), at
        if sample.get("tokens_per_s") is not None and rate_counts(previous, at):
            self.tokens[rank] = float(sample["tokens_per_s"])      # as samples/s: no warm-up, no tail
        rate = sample.get("samples_per_s")
        if rate is None or not rate_counts(previous, at):
            return
        self.rates.setdefault(rank, deque(maxlen=RATES_WAITING)).append((at, float(rate)))
        if all(self.rates.get(r) for r in self.latest):
            round_ = [self.rates[r].popleft() for r in self.latest]
            self.speed.append((max(a for a, _ in round_) - self.origin, sum(r for _, r in round_)))

    def _build(self) -> None:
        from IPython.display import display

        self.header = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="420px"))
        self.progress = w.Label()
        self.stats = w.HTML()
        self.figure = LiveFigure()
        self.layout = _live_layout()
        self.table = w.HTML()
        self.box = w.VBox([self.header, w.HBox([self.bar, self.progress]), self.stats, self.figure,
                           self.table])
        self.box.add_class("gpugeek-job")
        self.handle = display(self.box, display_id=True)

    def _draw(self) -> None:
        elapsed = time.monotonic() - self.started
        first = self.latest.get(0) or next(iter(self.latest.values()), {})
        step = int(first.get("step") or 0)
        total, start = first.get("total_steps"), int(first.get("loop_start") or 0)
        self.header.value = (f"<b>{html.escape(self.name)}</b> · running on {self.workers} worker(s)"
                             + (" · <b style='color:#b35c00'>SIMULATED $</b>" if self.simulated else ""))
        self.progress.value = _progress_text(step, total, elapsed, self.first)
        if total:
            self.bar.max, self.bar.value = max(1, int(total) - start), max(0, step - start)
        else:
            self.bar.max, self.bar.value = max(1, step), step
        self.stats.value = self._stats_html()
        self.figure.show_json(_live_spec(self.layout, self.loss, self.speed), "loss and samples/s")
        self.table.value = _workers_html(self.latest, self.reports)
        self.draws += 1

    def _stats_html(self) -> str:
        parts = []
        if self.loss.newest is not None:
            parts.append(f"loss {self.loss.newest[1]:.4g}")
        if self.speed:                   # the chart's latest point: every worker, one round
            parts.append(f"{self.speed[-1][1]:,.1f} samples/s")
        tokens = sum(self.tokens.values())
        if tokens:
            parts.append(f"{tokens:,.0f} tokens/s")
        usd = self.usd()
        parts.append(f"this job ${usd:,.4f}" + (" (simulated)" if self.simulated else ""))
        return " · ".join(parts)

    def usd(self) -> float:
        """This job's $ from the ledger (its share of the cluster's burn while it runs)."""
        table = costs.cost_table(self.cluster_id, "job")
        row = table[table["job_id"] == self.job_id]
        return float(row["usd"].iloc[0]) if len(row) else 0.0

    # -- the end --------------------------------------------------------------------------------

    def finish(self, status: str) -> JobReport | None:
        """Replace the live widget with the static report (if the job was shown or reported)."""
        samples = ledger.samples_frame(self.cluster_id, self.job_id)
        if self.box is None and samples.empty:
            return None
        report = JobReport(name=self.name, status=status, samples=samples, usd=self.usd(),
                           simulated=self.simulated, seconds=time.monotonic() - self.started,
                           advice=advice_line(self.cluster_id, self.job_id, samples))
        from IPython.display import display

        if self.handle is not None:
            self.handle.update(report.summary_bundle(), raw=True)
            self.box.close()
        else:
            display(report.summary_bundle(), raw=True)
        if not samples.empty:
            display(report.figure_bundle(), raw=True)
        return report


class JobReport:
    """What a finished job leaves in the notebook: a summary line with a static progress bar,
    and the per-worker figure — plain outputs that render without a kernel."""

    def __init__(self, *, name: str, status: str, samples, usd: float, simulated: bool, seconds: float,
                 advice: str | None = None):
        self.name, self.status, self.samples, self.usd = name, status, samples, usd
        self.simulated, self.seconds, self.advice = simulated, seconds, advice
        self.summary = job_summary(samples)
        self.total, self.start = _loop_span(samples)

    def text(self) -> str:
        s = self.summary
        steps = f"step {s['step']}" + (f"/{self.total}" if self.total else "")
        parts = [f"{self.name}: {self.status} after {duration(self.seconds)}", steps]
        if s["loss"] is not None:
            parts.append(f"loss {s['loss']:.4g}")
        if s["samples_per_s"]:
            parts.append(f"{s['samples_per_s']:,.1f} samples/s")
        if s["peak_memory_gib"]:
            parts.append(f"peak memory {s['peak_memory_gib']:.2f} GiB")
        parts.append(f"${self.usd:,.4f}" + (" (simulated)" if self.simulated else ""))
        return " · ".join(parts)

    def summary_bundle(self) -> dict:
        bar = ""
        if self.total:
            bar = (f"<progress class='gpugeek-progress' value='{self.summary['step'] - self.start}' "
                   f"max='{self.total - self.start}'></progress> ")
        advice = f"<div class='gpugeek-job-advice'>{html.escape(self.advice)}</div>" if self.advice else ""
        return {"text/plain": self.text() + (f"\n{self.advice}" if self.advice else ""),
                "text/html": f"<div class='gpugeek-job-done'>{bar}{html.escape(self.text())}</div>{advice}"}

    def figure(self) -> go.Figure:
        title = f"{self.name} — {self.status}" + (" (simulated $)" if self.simulated else "")
        return job_figure(self.samples, title=title, max_points=MAX_POINTS)

    def figure_bundle(self) -> dict:
        figure = self.figure()
        return {"application/vnd.plotly.v1+json": figure_json(figure),
                "text/html": figure.to_html(full_html=False, include_plotlyjs="cdn"),
                "text/plain": self.text()}


def advice_line(cluster_id: int, job_id: str, samples) -> str | None:
    """Right-sizing's findings for a job that ran on GPUs (``%gpugeek advise``), as one line;
    None for a CPU job or a cluster with no offer to compare against."""
    if samples.empty or "gpu_util" not in samples or samples["gpu_util"].isna().all():
        return None
    try:
        advice = advise_job(cluster_id, job_id)
    except GpugeekError:
        return None
    return " · ".join(advice.lines[1:]) or None


def _loop_span(samples) -> tuple[int | None, int]:
    """The loop's last step and first step as the latest report gave them (None: unknown)."""
    if samples.empty or "total_steps" not in samples:
        return None, 0
    last = samples.sort_values("at").iloc[-1]
    total, start = last.get("total_steps"), last.get("loop_start")
    if total is None or pd.isna(total):
        return None, 0
    return int(total), 0 if start is None or pd.isna(start) else int(start)


class StepSeries:
    """A line's (step, value) points as logged: every one until there are more than ``bound``,
    then 1 in 2 logged points, 1 in 4, … (each time the bound is passed the stride doubles
    and every other kept point goes), and always the newest."""

    def __init__(self, bound: int):
        self.bound, self.stride, self.seen = bound, 1, 0
        self.kept: list[tuple[int, float]] = []     # the logged points 0, stride, 2 × stride, …
        self.newest: tuple[int, float] | None = None
        self.sparse = False         # a point came from a report without its steps' log: one per report

    def add(self, step: int, value: float, logged: bool = True) -> None:
        self.sparse = self.sparse or not logged
        if self.seen % self.stride == 0:
            self.kept.append((step, value))
            if len(self.kept) > self.bound:
                del self.kept[1::2]
                self.stride *= 2
        self.seen += 1
        self.newest = (step, value)

    def points(self) -> list[tuple[int, float]]:
        tail = [self.newest] if self.newest is not None and (self.seen - 1) % self.stride else []
        return self.kept + tail

    def said(self) -> str:
        """Which logged steps the line holds, in a few words."""
        if self.sparse:
            return "at each report" if self.stride == 1 else f"1 in {self.stride} reports"
        return "every logged step" if self.stride == 1 else f"1 in {self.stride} logged steps"


def _live_layout() -> dict:
    """The live chart's layout, drawn once (the loss title's words are set at each draw): loss
    by step, samples/s by time."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss (rank 0)", "samples/s (all workers)"))
    fig.update_layout(height=260, showlegend=False, template="plotly_white", margin=dict(l=50, r=20, t=30, b=30))
    fig.update_xaxes(title_text="step", row=1, col=1)
    fig.update_xaxes(title_text="seconds", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    return figure_json(fig)["layout"]


def _live_spec(layout: dict, loss: StepSeries, speed: list[tuple[float, float]]) -> dict:
    """Plotly JSON of the live chart, written directly (a figure object per redraw costs ~50 ms
    of the kernel's CPU, which the workers share on a small machine)."""
    def trace(points, axis: str, name: str) -> dict:
        x, y = (list(v) for v in zip(*points, strict=True)) if points else ([], [])
        return {"type": "scatter", "mode": "lines+markers", "marker": {"size": 3}, "name": name,
                "x": x, "y": y, "xaxis": f"x{axis}", "yaxis": f"y{axis}"}
    titles = [dict(a) for a in layout.get("annotations", [])]
    if titles:
        titles[0]["text"] = f"loss (rank 0, {loss.said()})"
    return {"data": [trace(loss.points(), "", "loss"), trace(speed, "2", "samples/s")],
            "layout": {**layout, "annotations": titles}}


def _progress_text(step: int, total, elapsed: float, first: tuple[float, int] | None) -> str:
    """Steps, time, and the rate since the first report (not since the cell began, which
    includes start-up; nor counting steps a resumed checkpoint already held)."""
    text = f"step {step}" + (f"/{int(total)}" if total else "") + f" · {duration(elapsed)}"
    if first is not None:
        seconds, done = time.monotonic() - first[0], step - first[1]
        if done > 0 and seconds > 0:
            rate = done / seconds
            text += f" · {rate:,.1f} steps/s"
            if total:
                text += f" · ETA {duration(max(0, int(total) - step) / rate)}"
    return text


def common_step(reports: dict[int, deque[dict]]) -> int | None:
    """The latest step every rank has reported: the least of their newest reports' steps."""
    newest = [int(kept[-1]["step"]) for kept in reports.values() if kept]
    return min(newest) if newest else None


def report_at(kept: deque[dict], step: int) -> dict:
    """A rank's report whose window holds ``step``: the first of its newest reports at or past it
    (its previous report came before the step)."""
    chosen = kept[-1]
    for report in reversed(kept):
        if int(report["step"]) < step:
            break
        chosen = report
    return chosen


def _workers_html(latest: dict[int, dict], reports: dict[int, deque[dict]]) -> str:
    """Every rank as of one step (``common_step``); a rank that has reported no step yet, as it is."""
    step = common_step(reports)
    rows = []
    for rank in sorted(latest):
        s = report_at(reports[rank], step) if reports.get(rank) and step is not None else latest[rank]
        gpu = f"{s['gpu_util']:.0f} %" if s.get("gpu_util") is not None else "—"
        mem = f"{float(s['memory_bytes']) / 2**30:.2f}" if s.get("memory_bytes") is not None else "—"
        speed = f"{float(s['samples_per_s']):,.1f}" if s.get("samples_per_s") is not None else "—"
        shown = step if reports.get(rank) and step is not None else "—"
        rows.append(f"<tr><td>{rank}</td><td>{shown}</td><td>{speed}</td>"
                    f"<td>{mem}</td><td>{gpu}</td></tr>")
    moment = ""
    if step is not None:
        ahead = max(reports, key=lambda r: int(reports[r][-1]["step"]) if reports[r] else -1)
        newest = int(reports[ahead][-1]["step"])
        moment = (f"<div class='gpugeek-workers-moment'>every rank as of step {step}, the latest step all "
                  "of them have reported" + (f" (rank {ahead} has reported step {newest})" if newest > step
                                             else "") + "</div>")
    return (moment + "<table class='gpugeek-workers'><tr><th>rank</th><th>step</th><th>samples/s</th>"
            "<th>memory GiB</th><th>GPU</th></tr>" + "".join(rows) + "</table>")
