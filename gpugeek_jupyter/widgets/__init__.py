"""Widgets (ipywidgets; plotly figures redrawn in place) over the same API the magics call:
``OfferPicker``, ``ClusterPanel``, ``JobMonitor``, ``CostDashboard``. Each also renders as HTML
and text where widgets cannot show (nbconvert, plain IPython, a saved notebook)."""

from .cluster import ClusterPanel
from .cost import CostDashboard
from .job import JobMonitor
from .offers import OfferPicker

__all__ = ["ClusterPanel", "CostDashboard", "JobMonitor", "OfferPicker"]
