"""Plan: how much GPU memory a run needs, how long it takes, and which offer is cheapest.

Runs on: a kernel.
May import: `catalog/`, `meter/`, the ground floor.
"""

from .memory import MemoryEstimate
from .planner import Plan, plan

__all__ = ["MemoryEstimate", "Plan", "plan"]
