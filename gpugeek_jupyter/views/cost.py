"""Cost figures from the ledger's node rows: cumulative dollars by node type over time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go


def cumulative_cost(nodes: pd.DataFrame, now: float, points: int = 200) -> pd.DataFrame:
    """$ spent so far by each node type, sampled on a time grid plus every start/end instant."""
    if nodes.empty:
        return pd.DataFrame(columns=["time", "node_type", "usd"])
    start = nodes["started"].astype(float).to_numpy()
    end = nodes["ended"].fillna(now).astype(float).to_numpy()
    grid = np.unique(np.concatenate([np.linspace(start.min(), max(end.max(), start.min() + 1), points),
                                     start, end]))
    frames = []
    for node_type, group in nodes.groupby("node_type"):
        s = group["started"].astype(float).to_numpy()[:, None]
        e = group["ended"].fillna(now).astype(float).to_numpy()[:, None]
        rate = group["usd_per_hour"].astype(float).to_numpy()[:, None]
        usd = (np.clip(np.minimum(grid, e) - s, 0, None) * rate / 3600.0).sum(axis=0)
        frames.append(pd.DataFrame({"time": pd.to_datetime(grid, unit="s"), "node_type": node_type, "usd": usd}))
    return pd.concat(frames, ignore_index=True)


def cost_figure(nodes: pd.DataFrame, now: float, *, title: str, simulated: bool) -> go.Figure:
    """Stacked cumulative $ per node type; the title carries total, spot savings and 'simulated'."""
    curve = cumulative_cost(nodes, now)
    fig = go.Figure()
    for node_type, group in curve.groupby("node_type", sort=False):
        fig.add_trace(go.Scatter(x=group["time"], y=group["usd"], name=str(node_type), mode="lines",
                                 stackgroup="cost", line_shape="linear"))
    total = float(nodes["usd"].sum()) if not nodes.empty else 0.0
    saved = float(nodes["spot_saved_usd"].sum()) if not nodes.empty else 0.0
    label = " — SIMULATED" if simulated else ""
    subtitle = f"total ${total:,.2f}" + (f"; spot saved ${saved:,.2f} against on-demand" if saved > 0 else "")
    fig.update_layout(
        title=f"{title}{label}<br><sup>{subtitle}</sup>", xaxis_title="time",
        yaxis_title="cumulative $" + (" (simulated)" if simulated else ""), template="plotly_white",
        legend_title="node type", height=380, margin=dict(l=60, r=20, t=70, b=40),
    )
    return fig
