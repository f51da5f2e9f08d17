"""The words every layer shares: the choices a user makes (pricing, strategy, precision, …), the
phases a cluster goes through, and what one node costs.

Each choice is an enum whose members *are* their strings (``Pricing.SPOT == "spot"``), so they go
into SQLite, JSON and f-strings unchanged, and each has one validator, ``parse``, that the magics,
the API, the server and the widgets all call: a wrong value reads the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .errors import GpugeekError


class Choice(str, Enum):
    """A value a user picks from a short list."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> list[str]:
        return [member.value for member in cls]

    @classmethod
    def parse(cls, value: object, flag: str) -> Choice:
        """``value`` as a member, or one line naming the flag and every allowed value."""
        try:
            return cls(value)
        except ValueError:
            raise GpugeekError(f"{flag} {value!r} is not known — use one of {', '.join(cls.values())}") from None


class Pricing(Choice):
    """How an offer is bought."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"
    RESERVED = "reserved"


class Strategy(Choice):
    """How the model is spread over the workers."""

    DDP = "ddp"
    FSDP = "fsdp"


class Precision(Choice):
    """The dtype a model trains in (planning)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Amp(Choice):
    """Mixed precision for ``gg.autocast()`` on the workers."""

    BF16 = "bf16"
    FP16 = "fp16"
    OFF = "off"


class Optimizer(Choice):
    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"


class Objective(Choice):
    """What a plan ranks offers by."""

    COST = "cost"
    TIME = "time"


class CostGrouping(Choice):
    """How ``cost`` groups a cluster's dollars."""

    NODE = "node"
    NODE_TYPE = "node_type"
    PRICING = "pricing"
    JOB = "job"


class ClusterPhase(Choice):
    """Where a cluster is in its life, as the registry records it.

    ``failed``: its ``up`` failed and stopping what had started failed too — it may still be
    running and billing, so it stays live, watched, and ``down`` retries the stop.
    """

    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"

    @property
    def live(self) -> bool:
        return self is not ClusterPhase.STOPPED


@dataclass(frozen=True)
class NodePrice:
    """What one node of a node type costs: the offer, how it was bought, and $/h.

    ``pricing`` is a ``Pricing`` value for an offer, or ``local`` (this machine, at the configured
    rate), ``unpriced`` (an attached cluster) or ``not billed`` (a cloud head the catalog cannot
    price).
    """

    offer_id: str | None
    pricing: str
    usd_per_hour: float
    on_demand_usd_per_hour: float | None = None


UNPRICED = NodePrice(offer_id=None, pricing="unpriced", usd_per_hour=0.0)
