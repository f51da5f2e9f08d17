"""The Python API. The ``%gpugeek`` magics and the widgets call exactly these functions."""

from __future__ import annotations

from .catalog.offers import find_offers as offers
from .plan.planner import Plan, plan
from .views.pricing import price_performance

__all__ = ["Plan", "offers", "plan", "price_performance"]
