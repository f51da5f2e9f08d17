"""View: pure functions from records to plotly figures and pandas tables (no widgets here).

Runs on: a kernel (and whatever draws a ledger's figures).
May import: the ground floor.
"""

from .pricing import frontier, price_performance

__all__ = ["frontier", "price_performance"]
