"""Price–performance of offers: $/GPU-hour against peak TFLOP/s, with the frontier marked."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go


def frontier(offers: pd.DataFrame) -> pd.DataFrame:
    """Offers no other offer beats on both axes (more TFLOP/s per GPU for less $/GPU-hour)."""
    data = offers.dropna(subset=["peak_tflops", "price_per_gpu_hour"])
    data = data.sort_values(["price_per_gpu_hour", "peak_tflops"], ascending=[True, False])
    best = -np.inf
    keep = []
    for index, tflops in zip(data.index, data["peak_tflops"], strict=True):
        if tflops > best:
            keep.append(index)
            best = tflops
    return data.loc[keep]


def dated_caption(offers: pd.DataFrame) -> str:
    """``prices as of 2026-11-21`` (plus the stale warning, if any) from the offers' attrs; '' if unknown."""
    date, warning = offers.attrs.get("prices_as_of"), offers.attrs.get("stale_warning")
    caption = f"prices as of {date}" if date else ""
    return f"{caption} — {warning}" if caption and warning else caption or (warning or "")


def price_performance(offers: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Scatter of offers (one colour per GPU family) with the price–performance frontier line."""
    data = offers.dropna(subset=["peak_tflops", "price_per_gpu_hour"])
    pricing = offers.attrs.get("pricing") or (
        offers["pricing"].iloc[0] if "pricing" in offers and len(offers) else "")
    fig = go.Figure()
    for family, group in data.groupby("gpu", sort=True):
        fig.add_trace(go.Scatter(
            x=group["peak_tflops"], y=group["price_per_gpu_hour"], mode="markers", name=family,
            text=group["id"], marker={"size": 7, "opacity": 0.7},
            hovertemplate="%{text}<br>%{x:.0f} TFLOP/s · $%{y:.2f}/GPU-h<extra></extra>",
        ))
    edge = frontier(data)
    fig.add_trace(go.Scatter(
        x=edge["peak_tflops"], y=edge["price_per_gpu_hour"], mode="lines+markers",
        name="frontier", text=edge["id"], line={"color": "black", "dash": "dash"},
        marker={"symbol": "star", "size": 11, "color": "black"},
        hovertemplate="frontier: %{text}<br>%{x:.0f} TFLOP/s · $%{y:.2f}/GPU-h<extra></extra>",
    ))
    title = title or f"Price–performance ({pricing} $/GPU-hour vs peak dense bf16 TFLOP/s)"
    if caption := dated_caption(offers):
        title += f"<br><sup>{html.escape(caption)}</sup>"
    fig.update_layout(
        title=title,
        xaxis_title="peak dense TFLOP/s per GPU (bf16, else fp16/fp32; vendor spec)",
        yaxis_title=f"$ per GPU-hour ({pricing})", template="plotly_white", height=480,
    )
    return fig
