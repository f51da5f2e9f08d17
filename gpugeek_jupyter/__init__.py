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

WIDGETS = ("ClusterPanel", "CostDashboard", "JobMonitor", "OfferPicker")

__version__ = "0.1.0"
__all__ = [
    "Cluster", "ClusterPanel", "ClusterStatus", "CostDashboard", "CostReport", "GpugeekError",
    "JobMonitor", "LaunchConfig", "OfferPicker", "Plan", "clusters",
    "cost", "down", "load_ipython_extension", "offers", "plan", "preempt", "price_performance",
    "reset", "run", "scale", "status", "up",
]


def __getattr__(name: str):
    """Widgets load on first use: a Ray worker importing this package needs none of them."""
    if name in WIDGETS:
        from . import widgets

        return getattr(widgets, name)
    raise AttributeError(f"module 'gpugeek_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpugeek_jupyter``: the magic, and after every cell the node samplers'
    reports go to the ledger (so time between cells — idle GPUs — is recorded too)."""
    from .magics import GpugeekMagics, drain_telemetry

    ipython.register_magics(GpugeekMagics)
    if drain_telemetry not in ipython.events.callbacks["post_execute"]:
        ipython.events.register("post_execute", drain_telemetry)


def _jupyter_server_extension_points() -> list[dict]:
    """The REST API under ``/gpugeek/`` that JupyterLab's status bar and sidebar read."""
    return [{"module": "gpugeek_jupyter.server"}]


def _jupyter_labextension_paths() -> list[dict]:
    """For ``jupyter labextension develop``: the built front end, next to this package."""
    return [{"src": "labextension", "dest": "gpugeek-jupyter"}]
