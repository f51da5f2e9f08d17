"""A training job as its workers reported it: loss, throughput, memory and GPU % per worker.

The input is the ledger's sample rows for one job (each worker reports at most once a second:
step, what the cell passed to ``gg.log``, samples/s, tokens/s, memory, NVML GPU %).

A worker's rate is measured over the window since its previous report. Two windows measure no
throughput and are left out of the charts and the summary: a worker's first (it began at the
loop's start, so it holds the warm-up: the first batch, compilation, the first all-reduce) and a
loop's tail (the flush at its end, often a batch or two over a fraction of a millisecond). Axes
of quantities with a natural zero start there, so noise does not read as a trend.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PANELS = (("loss", "loss", "loss"), ("samples_per_s", "samples/s", "samples/s"),
          ("memory_bytes", "memory (GiB)", "GiB"), ("gpu_util", "GPU utilisation (%)", "%"))
RATES = ("samples_per_s", "tokens_per_s")
MIN_RATE_WINDOW_S = 0.25      # workers report at most once a second: a shorter window is a loop's tail
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def rate_counts(previous_at: float | None, at: float) -> bool:
    """Whether a rate a worker reported at ``at`` measures throughput: its window, from that
    worker's previous report (None: this is its first, whose window began at the loop's start),
    is at least ``MIN_RATE_WINDOW_S`` long."""
    return previous_at is not None and at - previous_at >= MIN_RATE_WINDOW_S


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


def job_figure(samples: pd.DataFrame, *, title: str) -> go.Figure:
    """2×2 panels over time since the job started: loss, samples/s, memory, GPU % — one line per
    worker. A panel with nothing reported says so instead of drawing zeros."""
    data = job_series(samples)
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[1] for p in PANELS],
                        horizontal_spacing=0.09, vertical_spacing=0.16)
    for i, (column, _, unit) in enumerate(PANELS):
        row, col = divmod(i, 2)
        y_col = "memory_gib" if column == "memory_bytes" else column
        if column != "loss":            # rates, memory and GPU % have a natural zero
            fig.update_yaxes(rangemode="tozero", row=row + 1, col=col + 1)
        have = not data.empty and y_col in data and data[y_col].notna().any()
        if not have:
            why = ("no GPU on these workers" if column == "gpu_util" else
                   "only warm-up and tail windows: see the summary" if column in samples
                   and samples[column].notna().any() else "not reported")
            axis = "" if i == 0 else str(i + 1)           # subplot i's axes: x, x2, x3, x4
            fig.add_annotation(text=why, showarrow=False, xref=f"x{axis} domain", yref=f"y{axis} domain",
                               x=0.5, y=0.5)
            continue
        for rank, rows in data.groupby("rank", sort=True):
            rows = rows[rows[y_col].notna()]
            fig.add_trace(go.Scatter(
                x=rows["seconds"], y=rows[y_col], mode="lines+markers", marker={"size": 4},
                name=f"rank {rank}", legendgroup=f"rank {rank}", showlegend=i == _first_panel(data),
                line={"color": COLOURS[int(rank) % len(COLOURS)]},
                customdata=rows["step"],
                hovertemplate=f"step %{{customdata}}: %{{y:.4g}} {unit}<extra>rank {rank}</extra>",
            ), row=row + 1, col=col + 1)
        fig.update_xaxes(title_text="seconds", row=row + 1, col=col + 1)
    fig.update_layout(title=title, template="plotly_white", height=520, legend_title="worker",
                      margin=dict(l=60, r=20, t=80, b=40))
    return fig


def _first_panel(data: pd.DataFrame) -> int:
    """The first panel with data carries the legend (one entry per worker)."""
    for i, (column, _, _) in enumerate(PANELS):
        y_col = "memory_gib" if column == "memory_bytes" else column
        if y_col in data and data[y_col].notna().any():
            return i
    return 0
