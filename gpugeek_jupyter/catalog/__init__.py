"""Price: GPU offers from the bundled catalog (and the user's own), normalised and filtered.

Runs on: a kernel (offers, plan, the picker) and the Jupyter server (``GET /gpugeek/offers``).
May import: the ground floor.
"""

from .gpus import GpuSpec, family_of, spec
from .offers import find_offers, load_catalog, with_pricing

__all__ = ["GpuSpec", "family_of", "find_offers", "load_catalog", "spec", "with_pricing"]
