"""Which offers ``up`` rents for you, and the way in for the rest.

A cloud whose machines a backend launches (``backends.interface.renting``) is one ``up`` away.
The others — RunPod, Lambda, Vast, Nebius, often the cheapest — are rented on their own sites
and handed over as an address and a key: ``up --backend ssh --hosts …`` is then the way in, and
``--offer ID`` prices the box in the ledger at that offer's rate. Said as a command ready to copy.
"""

from __future__ import annotations

import pandas as pd

from ..backends.interface import BY_SSH, capable, renting
from ..vocab import Pricing

RENT_THERE = f"rent, then {BY_SSH}"      # the offers table's word for an offer up cannot launch
YOUR_IMAGE = ", with your image"         # … after the backend's, where it has no machine image of its own


def mark(frame: pd.DataFrame) -> pd.DataFrame:
    """The offers with an ``up_with`` column: the backend that launches each (and whether it needs
    your machine image in that region: ``YOUR_IMAGE``), or ``RENT_THERE``."""
    marked = frame.copy()
    marked["up_with"] = [_up_with(p, r) for p, r in zip(marked["provider"], marked["region"], strict=True)]
    marked.attrs.update(frame.attrs)
    if (marked["up_with"] == RENT_THERE).any():
        marked.attrs["renting_note"] = (f"up_with '{RENT_THERE}': rent the box on its provider's site, then "
                                        f"%gpugeek up NAME --backend {BY_SSH} --hosts USER@ADDRESS --offer ID")
    imaged = marked["up_with"].str.endswith(YOUR_IMAGE)
    if imaged.any():
        first = marked[imaged].iloc[0]
        marked.attrs["image_note"] = f"up_with '…{YOUR_IMAGE}': " + capable(renting(first["provider"])) \
            .cannot_start_in(first["region"]).replace(first["region"], "REGION")
    return marked


def _up_with(provider: str, region: str) -> str:
    backend = renting(provider)
    if backend is None:
        return RENT_THERE
    return backend + (YOUR_IMAGE if capable(backend).cannot_start_in(region) else "")


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
