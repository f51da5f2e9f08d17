"""Which offers ``up`` rents for you, and the way in for the rest.

A cloud whose machines a backend launches (``backends.interface.renting``) is one ``up`` away.
The others — RunPod, Lambda, Vast, Nebius, often the cheapest — are rented on their own sites
and handed over as an address and a key: ``up --backend ssh --hosts …`` is then the way in, and
``--offer ID`` prices the box in the ledger at that offer's rate. Said as a command ready to copy.
"""

from __future__ import annotations

import pandas as pd

from ..backends.interface import BY_SSH, renting
from ..vocab import Pricing

RENT_THERE = f"rent, then {BY_SSH}"      # the offers table's word for an offer up cannot launch


def mark(frame: pd.DataFrame) -> pd.DataFrame:
    """The offers with an ``up_with`` column: the backend that launches each, or ``RENT_THERE``."""
    marked = frame.copy()
    marked["up_with"] = [renting(p) or RENT_THERE for p in marked["provider"]]
    marked.attrs.update(frame.attrs)
    if (marked["up_with"] == RENT_THERE).any():
        marked.attrs["renting_note"] = (f"up_with '{RENT_THERE}': rent the box on its provider's site, then "
                                        f"%gpugeek up NAME --backend {BY_SSH} --hosts USER@ADDRESS --offer ID")
    return marked


def way_in(offer_id: str | None, provider: str, *, pricing: str = Pricing.ON_DEMAND, price: float | None = None,
           name: str | None = None, budget: float | None = None, idle: float | None = None) -> str:
    """One line: ``up`` cannot rent this provider's offer (``None``: any of its offers); the
    command that starts Ray on the box once rented there."""
    flags = f" --pricing {Pricing.parse(pricing, '--pricing').value}" if pricing != Pricing.ON_DEMAND else ""
    flags += f" --budget {budget:g}" if budget else ""
    flags += f" --idle {idle:g}" if idle else ""
    rate = f" (${price:,.2f}/h)" if price is not None else ""
    which = f"offer {offer_id}: " if offer_id else ""
    ids = "" if offer_id else f" (its ids: %gpugeek offers --provider {provider})"
    return (f"{which}`up` cannot rent {provider} machines for you — rent the box on {provider}, then start Ray "
            f"on it over SSH, priced in the ledger at the offer's rate{rate}: %gpugeek up {name or provider} "
            f"--backend {BY_SSH} --hosts USER@ADDRESS --offer {offer_id or 'ID'}{flags}{ids}")
