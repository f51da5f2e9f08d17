"""View: pure functions from records to plotly figures and pandas tables (no widgets here)."""

from .pricing import frontier, price_performance

__all__ = ["frontier", "price_performance"]
