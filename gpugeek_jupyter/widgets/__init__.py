"""Widgets (ipywidgets; plotly figures redrawn in place) over the same API the magics call:
``OfferPicker``, ``ClusterPanel``, ``JobMonitor``, ``CostDashboard``. Each also renders as HTML
and text where widgets cannot show (nbconvert, plain IPython, a saved notebook).

``register()`` plugs them in: from then on, in a notebook, a cluster's status shows as its live
panel, a cost report as its dashboard, and every ``%%gpugeek run`` gets a job monitor.

Runs on: a notebook's kernel.
May import: `api.py`, `views/`, `catalog/`, `sizing/`, `meter/`, the types `provision/` and
`cells/` show, the ground floor.
"""

from __future__ import annotations

from .. import display
from ..api import CostReport
from ..cells.watch import JobWatch
from ..provision.status import ClusterStatus
from ._base import widget_view
from .cluster import ClusterPanel
from .cost import CostDashboard
from .job import JobMonitor
from .offers import OfferPicker

__all__ = ["ClusterPanel", "CostDashboard", "JobMonitor", "OfferPicker", "register"]


def register() -> None:
    """What the API's results show as in a notebook (``display`` asks only inside a kernel)."""
    display.register(ClusterStatus, lambda status: widget_view(ClusterPanel(status.name)))
    display.register(CostReport, lambda report: widget_view(
        CostDashboard(report.name, by=report.by, report=report)))
    display.register(JobWatch, JobMonitor)
