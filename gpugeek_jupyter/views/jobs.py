"""A training job as its workers reported it: loss, throughput, memory and GPU % per worker.

The input is the ledger's sample rows for one job (each worker reports at most once a second:
step, what the cell passed to ``gg.log``, samples/s, tokens/s, memory, NVML GPU %). A report may
also carry ``logged``: every ``gg.log`` since that worker's previous report, as columns
(``{"step": [...], "loss": [...]}``); the loss is then drawn at every logged step, not only at the
steps the reports fell on (``logged_points``). Where reports come without it, the loss is drawn
at each report's step, and the panel's title says so.

Every panel is drawn against the step, so the four read side by side: a loss spike and a
throughput dip at the same step sit one above the other. Each line keeps every point up to
``MAX_POINTS`` per worker; past that it is thinned evenly (the last point kept), and the panel's
title says so.

A worker's rate is measured over the window since its previous report. Two windows measure no
throughput and are left out of the charts and the summary: a worker's first (it began at the
loop's start, so it holds the warm-up: the first batch, compilation, the first all-reduce) and a
loop's tail (the flush at its end, often a batch or two over a fraction of a millisecond). Axes
of quantities with a natural zero start there, so noise does not read as a trend.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PANELS = (("loss", "loss", "loss"), ("samples_per_s", "samples/s", "samples/s"),
          ("memory_bytes", "memory (GiB)", "GiB"), ("gpu_util", "GPU utilisation (%)", "%"))
RATES = ("samples_per_s", "tokens_per_s")
LOGGED = "logged"             # a report's every gg.log since the worker's previous report
MAX_POINTS = 500              # per worker and panel in a job's figure: past it, thinned evenly
MIN_RATE_WINDOW_S = 0.25      # workers report at most once a second: a shorter window is a loop's tail
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
FIGURE = {"height": 520, "top": 80, "bottom": 50, "vertical_spacing": 0.16}


def rate_counts(previous_at: float | None, at: float) -> bool:
    """Whether a rate a worker reported at ``at`` measures throughput: its window, from that
    worker's previous report (None: this is its first, whose window began at the loop's start),
    is at least ``MIN_RATE_WINDOW_S`` long."""
    return previous_at is not None and at - previous_at >= MIN_RATE_WINDOW_S


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def logged_points(report: dict, metric: str = "loss") -> list[tuple[int, float]]:
    """One report's (step, value) points of ``metric``: every one logged since the worker's
    previous report where the report carries them (``logged``), else its latest value at its step."""
    history = report.get(LOGGED)
    if isinstance(history, dict) and metric in history and "step" in history:
        pairs = zip(history["step"], history[metric], strict=False)
    else:
        pairs = [(report.get("step"), report.get(metric))]
    points = []
    for step, value in pairs:
        step, value = _number(step), _number(value)
        if step is not None and value is not None:
            points.append((int(step), value))
    return points


def every_step_logged(samples: pd.DataFrame, metric: str = "loss") -> bool:
    """Whether each report of ``metric`` came with every step logged since the one before it."""
    if metric not in samples:
        return LOGGED in samples
    reported = samples[samples[metric].notna()]
    return LOGGED in samples and bool(reported[LOGGED].map(lambda h: isinstance(h, dict)).all())


def logged_frame(samples: pd.DataFrame, metric: str = "loss") -> pd.DataFrame:
    """Every logged step of ``metric`` per worker (rank, step, value), by step; a step logged more
    than once (accumulation's micro-batches, a step done again after a resume) keeps its last value."""
    if samples.empty or (metric not in samples and LOGGED not in samples):
        return pd.DataFrame(columns=["rank", "step", metric])
    columns = [c for c in ("rank", "step", metric, LOGGED) if c in samples]
    rows = [(int(r["rank"]), step, value)
            for r in samples.sort_values("at", kind="stable")[columns].to_dict("records")
            for step, value in logged_points(r, metric)]
    frame = pd.DataFrame(rows, columns=["rank", "step", metric])
    return frame.drop_duplicates(["rank", "step"], keep="last").sort_values(["rank", "step"], kind="stable")


def thinned(rows: pd.DataFrame, points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``points`` rows, evenly spaced, the first and last kept (all of them up to ``points``)."""
    if len(rows) <= points:
        return rows
    keep = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
    return rows.iloc[keep]


def measured_rates(samples: pd.DataFrame) -> pd.DataFrame:
    """The samples with each rate that measures no throughput (see ``rate_counts``) blanked."""
    if samples.empty or not any(column in samples for column in RATES):
        return samples
    order = samples.sort_values(["rank", "at"], kind="stable")
    window = order["at"].astype(float) - order.groupby("rank")["at"].shift().astype(float)
    keep = window >= MIN_RATE_WINDOW_S               # a first report's window is NaN: not kept
    out = samples.copy()
    for column in RATES:
        if column in out:
            out[column] = out[column].where(keep)
    return out


def job_series(samples: pd.DataFrame) -> pd.DataFrame:
    """The samples as plotted: seconds since the job's first sample, memory in GiB, and only the
    rates that measure throughput."""
    if samples.empty:
        return samples
    out = measured_rates(samples).sort_values(["at", "rank"]).copy()
    out["seconds"] = out["at"].astype(float) - float(out["at"].min())
    if "memory_bytes" in out:
        out["memory_gib"] = out["memory_bytes"].astype(float) / 2**30
    return out.reset_index(drop=True)


def job_summary(samples: pd.DataFrame) -> dict:
    """Last step, last loss (rank 0), samples/s and tokens/s (Σ of the workers' mean rates, over
    the windows that measure throughput where there are any), peak memory of any worker."""
    if samples.empty:
        return {"step": 0, "loss": None, "samples_per_s": None, "tokens_per_s": None,
                "peak_memory_gib": None, "workers": 0}
    rank0 = samples[samples["rank"] == 0].sort_values("at")
    loss = rank0["loss"].dropna() if "loss" in rank0 else pd.Series(dtype=float)

    measured = measured_rates(samples)

    def total(column: str) -> float | None:
        """Σ over workers of each worker's mean rate; a job so short that its only rates are
        first windows is summed from those."""
        if column not in samples or not samples[column].notna().any():
            return None
        rates = measured if measured[column].notna().any() else samples
        return float(rates.groupby("rank")[column].mean().sum())

    return {
        "step": int(samples["step"].max()) if samples["step"].notna().any() else 0,
        "loss": float(loss.iloc[-1]) if len(loss) else None,
        "samples_per_s": total("samples_per_s"), "tokens_per_s": total("tokens_per_s"),
        "peak_memory_gib": (float(samples["memory_bytes"].max()) / 2**30
                            if "memory_bytes" in samples and samples["memory_bytes"].notna().any() else None),
        "workers": int(samples["rank"].nunique()),
    }


def _panel_rows(data: pd.DataFrame, samples: pd.DataFrame, column: str) -> tuple[str, pd.DataFrame]:
    """A panel's (y column, rows with rank, step and y): every logged step for the loss, every
    report for the others."""
    if column == "loss":
        return column, logged_frame(samples, column)
    y_col = "memory_gib" if column == "memory_bytes" else column
    if data.empty or y_col not in data or "step" not in data:
        return y_col, pd.DataFrame(columns=["rank", "step", y_col])
    return y_col, data.loc[data[y_col].notna() & data["step"].notna(), ["rank", "step", y_col]]


def job_figure(samples: pd.DataFrame, *, title: str, max_points: int = MAX_POINTS) -> go.Figure:
    """2×2 panels by step: loss (every logged step), samples/s, memory, GPU % — one line per
    worker, at most ``max_points`` points each. A panel with nothing reported says so, inside
    that panel, instead of drawing zeros."""
    data = job_series(samples)
    panels = [_panel_rows(data, samples, column) for column, _, _ in PANELS]
    titles = []
    for (_, rows), (column, name, _) in zip(panels, PANELS, strict=True):
        most = int(rows.groupby("rank").size().max()) if len(rows) else 0
        sparse = column == "loss" and len(rows) and not every_step_logged(samples, column)
        titles.append(name + (" · at each report" if sparse else "")
                      + (f" · {max_points} of {most:,} points per worker" if most > max_points else ""))
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.09,
                        vertical_spacing=FIGURE["vertical_spacing"])
    legend = next((i for i, (_, rows) in enumerate(panels) if len(rows)), 0)
    for i, ((y_col, rows), (column, _, unit)) in enumerate(zip(panels, PANELS, strict=True)):
        row, col = divmod(i, 2)
        if column != "loss":            # rates, memory and GPU % have a natural zero
            fig.update_yaxes(rangemode="tozero", row=row + 1, col=col + 1)
        if not len(rows):
            why = ("no GPU on these workers" if column == "gpu_util" else
                   "only warm-up and tail windows: see the summary" if column in RATES and column in samples
                   and samples[column].notna().any() else "not reported")
            axis = "" if i == 0 else str(i + 1)           # subplot i's axes: x, x2, x3, x4
            # plotly.js draws a subplot only where a trace is: without one the panel stays blank
            # and a note placed on its axes falls back to the first subplot's (the loss chart's)
            fig.add_trace(go.Scatter(x=[], y=[], showlegend=False, hoverinfo="skip", name=why),
                          row=row + 1, col=col + 1)
            fig.add_annotation(text=why, showarrow=False, xref=f"x{axis} domain", yref=f"y{axis} domain",
                               x=0.5, y=0.5, xanchor="center", yanchor="middle")
            continue
        for rank, points in rows.groupby("rank", sort=True):
            points = thinned(points, max_points)
            fig.add_trace(go.Scatter(
                x=points["step"], y=points[y_col], mode="lines+markers", marker={"size": 4},
                name=f"rank {rank}", legendgroup=f"rank {rank}", showlegend=i == legend,
                line={"color": COLOURS[int(rank) % len(COLOURS)]},
                hovertemplate=f"step %{{x}}: %{{y:.4g}} {unit}<extra>rank {rank}</extra>",
            ), row=row + 1, col=col + 1)
    # one x axis for all four: the same steps, one "step" title under the bottom row (a title
    # under the top row would sit where the bottom row's panel titles are)
    for row, col in ((1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(matches="x", row=row, col=col)
    fig.update_xaxes(title_text="step", row=2)
    fig.update_layout(title=title, template="plotly_white", height=FIGURE["height"], legend_title="worker",
                      margin=dict(l=60, r=20, t=FIGURE["top"], b=FIGURE["bottom"]))
    return fig
