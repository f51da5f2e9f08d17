"""Cost figures from the ledger's node rows: cumulative $ by node type and pricing over time,
what on-demand would have cost (the spot saving is the gap), and spend projected to the budget.

The curves are drawn from the ledger's ``spend_curve`` — its own sum (Σ $/h × hours over the node
lifetimes) by each moment, computed there — so each last point is exactly the ledger's total for
that group. A cluster whose every node bills $0/h has no $ to chart: its figures are one line that
says so, not a flat $0 line.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..config import BUDGET_WARN_AT as WARN_AT  # where the watchdog warns


def dollars(text: str) -> str:
    """``text`` for a plotly title: plotly.js reads whatever stands between two dollar signs as
    LaTeX and, without MathJax, draws none of the title; an HTML entity shows the same "$"."""
    return text.replace("$", "&#36;")


def no_spend(nodes: pd.DataFrame) -> str | None:
    """Why there is no $ to chart — every node the ledger holds bills $0/h — in one line; None
    when there is (or nothing is metered yet)."""
    if nodes.empty or (nodes["usd_per_hour"].astype(float) > 0).any():
        return None
    if (nodes["pricing"] == "unpriced").any():       # an attached cluster: nobody priced its nodes
        return "not priced: every node at $0/h, no $ to chart"
    return "free: every node at $0/h, no $ to chart"


def note_figure(title: str, note: str) -> go.Figure:
    """A figure that is one line of text: no traces, no axes. ``spend_note`` reads the note back."""
    fig = go.Figure()
    fig.update_layout(title=dollars(f"{title} — {note}"), meta={"no_spend": note},
                      xaxis={"visible": False}, yaxis={"visible": False}, template="plotly_white",
                      height=60, margin=dict(l=60, r=20, t=40, b=0))
    return fig


def spend_note(figure: go.Figure) -> str | None:
    """The one line a figure of a cluster with no $ to chart holds instead of a chart, or None."""
    meta = figure.layout.meta
    return meta.get("no_spend") if isinstance(meta, dict) else None


def cost_figure(nodes: pd.DataFrame, curve: pd.DataFrame, *, title: str, simulated: bool) -> go.Figure:
    """Stacked cumulative $ per node type and pricing (``curve``: the ledger's ``spend_curve``);
    with spot nodes, a dashed line shows what on-demand would have cost, and the title carries
    total and saving. Simulated says so."""
    if note := no_spend(nodes):
        return note_figure(title, note)
    fig = go.Figure()
    free = []       # a group at $0/h adds nothing: drawn, it would trace the total's edge
    for label, group in curve.groupby("label", sort=False):
        if not group["usd"].any():
            free.append(str(label))
            continue
        fig.add_trace(go.Scatter(x=group["time"], y=group["usd"], name=str(label), mode="lines",
                                 stackgroup="cost", line_shape="linear",
                                 hovertemplate="%{x|%H:%M:%S} $%{y:,.4f}<extra>%{fullData.name}</extra>"))
    total = float(nodes["usd"].sum()) if not nodes.empty else 0.0
    saved = float(nodes["spot_saved_usd"].sum()) if not nodes.empty else 0.0
    if saved > 0:
        on_demand = curve.groupby("time", sort=True)["on_demand_usd"].sum()
        fig.add_trace(go.Scatter(x=on_demand.index, y=on_demand.to_numpy(), name="same hours at on-demand",
                                 mode="lines", line={"dash": "dash", "color": "black"}))
    label = " — SIMULATED" if simulated else ""
    subtitle = (f"total ${total:,.2f}" + (f"; spot saved ${saved:,.2f} against on-demand" if saved > 0 else "")
                + (f"; $0 so far, not drawn: {', '.join(free)}" if free else ""))
    fig.update_layout(
        title=dollars(f"{title}{label}<br><sup>{subtitle}</sup>"), xaxis_title="time (UTC)",
        yaxis_title="cumulative $" + (" (simulated)" if simulated else ""), template="plotly_white",
        legend_title="node type · pricing", height=380, margin=dict(l=60, r=20, t=70, b=40),
    )
    return fig


def burn_per_hour(nodes: pd.DataFrame) -> float:
    """$/h of the nodes alive now (the ledger's rates)."""
    return float(nodes.loc[nodes["alive"], "usd_per_hour"].sum()) if not nodes.empty else 0.0


def budget_projection(nodes: pd.DataFrame, curve: pd.DataFrame, now: float, budget: float | None,
                      horizon_h: float = 24.0) -> pd.DataFrame:
    """Spent so far (time, usd, kind="spent": the ledger's ``curve``, summed) and the same burn
    continued (kind="projected") from now until the budget is reached — or ``horizon_h`` hours
    with no budget or no burn."""
    if curve.empty:
        spent = pd.DataFrame({"time": [pd.Timestamp(now, unit="s")], "usd": [0.0]})
    else:
        spent = curve.groupby("time", as_index=False)["usd"].sum()
    total = float(nodes["usd"].sum()) if not nodes.empty else 0.0
    burn = burn_per_hour(nodes)
    hours = horizon_h
    if budget and burn > 0:
        hours = max(0.0, budget - total) / burn
    end = now + hours * 3600.0
    projected = pd.DataFrame({"time": pd.to_datetime([now, end], unit="s"),
                              "usd": [total, total + burn * hours]})
    return pd.concat([spent.assign(kind="spent"), projected.assign(kind="projected")], ignore_index=True)


def budget_figure(nodes: pd.DataFrame, curve: pd.DataFrame, now: float, budget: float | None, *, title: str,
                  simulated: bool) -> go.Figure:
    """Spend so far and projected at the current burn, against the budget and its 80 % warning."""
    if note := no_spend(nodes):
        return note_figure(title, note)
    data = budget_projection(nodes, curve, now, budget)
    spent, projected = data[data["kind"] == "spent"], data[data["kind"] == "projected"]
    burn = burn_per_hour(nodes)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=spent["time"], y=spent["usd"], name="spent", mode="lines",
                             line={"color": "#1f77b4"}))
    fig.add_trace(go.Scatter(x=projected["time"], y=projected["usd"], name=f"at ${burn:,.2f}/h",
                             mode="lines", line={"dash": "dot", "color": "#1f77b4"}))
    if budget:
        fig.add_hline(y=budget, line={"color": "firebrick"}, annotation_text=f"budget ${budget:,.2f}")
        fig.add_hline(y=WARN_AT * budget, line={"color": "orange", "dash": "dash"},
                      annotation_text=f"warning at {WARN_AT:.0%}")
        when = projected["time"].iloc[-1]
        spent_now = float(projected["usd"].iloc[0])
        sub = (f"budget exceeded: ${spent_now:,.2f} spent" if spent_now >= budget
               else f"budget reached {when:%Y-%m-%d %H:%M} UTC at this rate" if burn > 0
               else "nothing is billing now")
    else:
        sub = f"no budget set; next 24 h at this rate: ${projected['usd'].iloc[-1]:,.2f}"
    fig.update_layout(
        title=dollars(f"{title}{' — SIMULATED' if simulated else ''}<br><sup>{sub}</sup>"),
        xaxis_title="time (UTC)", yaxis_title="$" + (" (simulated)" if simulated else ""),
        template="plotly_white", height=340, margin=dict(l=60, r=20, t=70, b=40),
    )
    return fig
