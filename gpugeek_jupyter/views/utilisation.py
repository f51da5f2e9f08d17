"""GPU utilisation over time and "idle $": dollars paid for GPUs that sat mostly unused.

Inputs are the ledger's node rows (price, GPUs, lifetime) and the node samplers' rows (one per
GPU per sample). Each sample stands for the time until that GPU's next sample — at most
``max_gap_s``, and never past the node's end — so a pause in sampling is not billed as idle.
A GPU's share of its node's price is the node's $/h ÷ its GPU count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .cost import dollars

IDLE_BELOW = 30.0     # % utilisation under which a GPU counts as idle
MAX_GAP_S = 5.0       # a sample stands for at most this long (samplers report at ≤ 1 Hz)

COLUMNS = ["node_id", "device", "label", "sampled_hours", "idle_hours", "usd", "idle_usd"]


def _gpu_rows(samples: pd.DataFrame) -> pd.DataFrame:
    if samples.empty or "gpu_util" not in samples:
        return samples.iloc[0:0]
    rows = samples[samples["device"].astype(str).str.startswith("gpu") & samples["gpu_util"].notna()]
    return rows.sort_values(["node_id", "device", "at"])


def _label(node_id: str, device: str) -> str:
    return f"node {str(node_id)[-6:]} · {device}"


def idle_dollars(samples: pd.DataFrame, nodes: pd.DataFrame, *, below: float = IDLE_BELOW,
                 max_gap_s: float = MAX_GAP_S, now: float | None = None) -> pd.DataFrame:
    """Per GPU: hours covered by samples, hours below ``below`` %, their $ and idle $."""
    gpus = _gpu_rows(samples)
    if gpus.empty or nodes.empty:
        return pd.DataFrame(columns=COLUMNS)
    node = nodes.set_index("node_id")
    out = []
    for (node_id, device), rows in gpus.groupby(["node_id", "device"], sort=True):
        if node_id not in node.index or float(node.loc[node_id, "gpus"]) < 1:
            continue        # a node the ledger does not price, or bills for no GPU: not guessed
        info = node.loc[node_id]
        per_gpu = float(info["usd_per_hour"]) / float(info["gpus"])
        end = float(info["ended"]) if pd.notna(info["ended"]) else (now if now is not None else np.inf)
        at = rows["at"].astype(float).to_numpy()
        nxt = np.append(at[1:], np.inf)
        span = np.clip(np.minimum(np.minimum(nxt, at + max_gap_s), end) - at, 0, None)
        idle = rows["gpu_util"].astype(float).to_numpy() < below
        hours, idle_hours = span.sum() / 3600.0, span[idle].sum() / 3600.0
        out.append({"node_id": node_id, "device": device, "label": _label(node_id, device),
                    "sampled_hours": hours, "idle_hours": idle_hours,
                    "usd": hours * per_gpu, "idle_usd": idle_hours * per_gpu})
    return pd.DataFrame(out, columns=COLUMNS)


def utilisation_heatmap(samples: pd.DataFrame, nodes: pd.DataFrame, *, below: float = IDLE_BELOW,
                        bins: int = 60, now: float | None = None, simulated: bool = False,
                        idle: pd.DataFrame | None = None) -> go.Figure:
    """GPU × time heatmap of utilisation %, titled with the idle $. Without GPU samples (no NVML
    on the nodes, or declared GPUs) it shows the nodes' host CPU % instead and says so."""
    gpus = _gpu_rows(samples)
    fig = go.Figure()
    if not gpus.empty:
        labels = [_label(n, d) for n, d in zip(gpus["node_id"], gpus["device"], strict=True)]
        metric, rows = "gpu_util", gpus.assign(label=labels)
        idle = idle_dollars(samples, nodes, below=below, now=now) if idle is None else idle
        idle_usd, usd = float(idle["idle_usd"].sum()), float(idle["usd"].sum())
        sim = " (simulated $)" if simulated else ""
        title = (f"GPU utilisation — idle ${idle_usd:,.2f}{sim} on GPUs below {below:g} %, "
                 f"of ${usd:,.2f} over the sampled GPU time")
        colorbar = "GPU %"
    else:
        host = samples[samples["device"] == "host"] if not samples.empty and "device" in samples else samples
        if host.empty or "cpu_percent" not in host:
            fig.update_layout(title="utilisation: no samples yet", template="plotly_white", height=240)
            return fig
        metric, rows = "cpu_percent", host.assign(label=[f"node {str(n)[-6:]} · host" for n in host["node_id"]])
        title = "host CPU % — no GPU telemetry on these nodes (NVML not available); idle $ not measured"
        colorbar = "CPU %"
    grid, edges = _buckets(rows, metric, bins, max_gap_s=MAX_GAP_S)
    fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=pd.to_datetime(edges, unit="s"), y=list(grid.index), zmin=0,
                             zmax=100 if metric == "gpu_util" else None, colorscale="Viridis",
                             colorbar={"title": colorbar},
                             hovertemplate="%{y}<br>%{x|%H:%M:%S}: %{z:.0f} %<extra></extra>"))
    fig.update_layout(title=dollars(title), xaxis_title="time (UTC)", template="plotly_white",
                      height=max(220, 60 + 28 * len(grid.index)), margin=dict(l=140, r=20, t=60, b=40))
    return fig


def _buckets(rows: pd.DataFrame, metric: str, bins: int, *, max_gap_s: float) -> tuple[pd.DataFrame, np.ndarray]:
    """``metric`` per label in contiguous time buckets: (label × bucket means, the bucket edges).
    A bucket is never shorter than the samplers' period (else most are empty and the map is
    stripes); a bucket no sample fell in takes the sample before it, as far as that sample stands
    (``max_gap_s``), so a gap shows only where sampling really stopped."""
    at = rows["at"].astype(float)
    gaps = [np.diff(np.sort(times.to_numpy())) for _, times in at.groupby(rows["label"])]
    gaps = np.concatenate(gaps) if gaps else np.array([])
    period = float(np.median(gaps[gaps > 0])) if (gaps > 0).any() else 1.0
    span = max(float(at.max() - at.min()), 1.0)
    width = max(span / bins, period, 1e-3)
    count = max(1, int(np.ceil(span / width)))
    edges = at.min() + width * np.arange(count + 1)
    rows = rows.assign(bin=np.clip(np.searchsorted(edges, at, side="right") - 1, 0, count - 1))
    grid = rows.pivot_table(index="label", columns="bin", values=metric, aggfunc="mean")
    grid = grid.reindex(columns=range(count)).ffill(axis=1, limit=max(1, int(max_gap_s // width)))
    return grid, edges
