"""gpugeek-jupyter: price → plan → provision → run → meter → view, from a notebook.

``%load_ext gpugeek_jupyter`` registers ``%gpugeek``; the same steps are plain functions here.
"""

from __future__ import annotations

from .api import (
    Cluster,
    ClusterStatus,
    CostReport,
    LaunchConfig,
    Plan,
    clusters,
    cost,
    down,
    offers,
    plan,
    preempt,
    price_performance,
    reset,
    run,
    scale,
    status,
    up,
)
from .errors import GpugeekError
from .widgets import ClusterPanel, CostDashboard, JobMonitor, OfferPicker

__version__ = "0.1.0"
__all__ = [
    "Cluster", "ClusterPanel", "ClusterStatus", "CostDashboard", "CostReport", "GpugeekError",
    "JobMonitor", "LaunchConfig", "OfferPicker", "Plan", "clusters",
    "cost", "down", "load_ipython_extension", "offers", "plan", "preempt", "price_performance",
    "reset", "run", "scale", "status", "up",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpugeek_jupyter``"""
    from .magics import GpugeekMagics

    ipython.register_magics(GpugeekMagics)
