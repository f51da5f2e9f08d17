"""gpugeek-jupyter: price → plan → provision → run → meter → view, from a notebook.

``%load_ext gpugeek_jupyter`` registers ``%gpugeek``; the same steps are plain functions here.
"""

from __future__ import annotations

from .api import Plan, offers, plan, price_performance
from .errors import GpugeekError

__version__ = "0.1.0"
__all__ = ["GpugeekError", "Plan", "load_ipython_extension", "offers", "plan", "price_performance"]


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpugeek_jupyter``"""
    from .magics import GpugeekMagics

    ipython.register_magics(GpugeekMagics)
