"""What a cloud cluster's head costs: the CPU machine that runs Ray's head, the keeper and the
watchdog, priced like the GPU nodes from the same public catalog (``data/aws-head-nodes.csv``:
rows of SkyPilot's ``catalogs/v7/aws/vms.csv`` at the commit ``data/README.md`` names, verbatim).
A cloud or machine the file does not hold is not priced, and says so; no price is made up.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

FILES = {"aws": "aws-head-nodes.csv"}


@dataclass(frozen=True)
class HeadOffer:
    """One head machine's on-demand price in one region (and zone: an AZ id, as the catalog's)."""

    provider: str
    instance_type: str
    region: str
    zone: str
    usd_per_hour: float

    @property
    def id(self) -> str:
        return "/".join(p for p in (self.provider, self.instance_type, self.region, self.zone) if p)


@cache
def _rows(provider: str) -> tuple[HeadOffer, ...]:
    name = FILES.get(provider)
    if name is None:
        return ()
    text = resources.files(__package__).joinpath("data", name).read_text()
    return tuple(HeadOffer(provider, r["InstanceType"], r["Region"], r["AvailabilityZone"], float(r["Price"]))
                 for r in csv.DictReader(text.splitlines()) if r["Price"])


def head_offer(provider: str, instance_type: str, region: str, zone: str = "") -> HeadOffer | None:
    """The head's price where it runs: its zone's row, else its region's first; None: not in the catalog."""
    rows = [r for r in _rows(provider) if r.instance_type == instance_type and r.region == region]
    return next((r for r in rows if r.zone == zone), rows[0] if rows else None)
