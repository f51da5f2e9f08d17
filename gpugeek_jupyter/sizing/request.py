"""What a plan is asked: one value, checked once, that the planner reads (``planner.planned``).

``plan(params="7B", gpus=8, …)`` takes its keywords into a ``PlanRequest``: a wrong value, or a
keyword that is no option, is one line naming the flag. Its fields are the run (model or size,
precision, optimizer, batch, sequence, strategy, GPUs, how long), where to look for offers
(pricing, GPU, provider, region, catalog, residency) and how a spot run checkpoints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import GpugeekError
from ..units import number, positive_number, whole_number
from ..vocab import Objective, Optimizer, Precision, Pricing, Strategy
from . import spot

if TYPE_CHECKING:  # torch loads when a model is planned
    from torch import nn

DEFAULT_MFU = 0.40


@dataclass(frozen=True)
class PlanRequest:
    params: str | float | None = None        # '7B', or give ``model``
    model: nn.Module | None = None
    precision: str = "bf16"
    optimizer: str = "adam"
    batch: int = 1                            # the micro-batch per GPU
    seq: int | None = None                    # its sequence length
    grad_ckpt: bool = False
    strategy: str = "ddp"
    gpus: int | None = None
    tokens: str | float | None = None         # the run's length in tokens (samples) …
    hours: float | None = None                # … or in wall-clock hours
    pricing: str = "on-demand"
    objective: str = "cost"
    top: int = 10
    mfu: float = DEFAULT_MFU
    gpu: str | None = None
    provider: str | None = None
    region: str | None = None
    catalog: str | None = None
    example: object = None                    # a batch for ``model``'s forward pass
    ckpt_class: str | None = None             # the block class to checkpoint
    residency: str | None = None
    checkpoint_every: float | None = None     # minutes between a spot run's checkpoints
    checkpoint_seconds: float | None = None   # how long one checkpoint takes
    restart_minutes: float = spot.DEFAULT_RESTART_MINUTES

    @classmethod
    def of(cls, **asked) -> PlanRequest:
        """The request ``asked`` makes, checked; a keyword that is no option is said in one line."""
        names = [f.name for f in dataclasses.fields(cls)]
        if wrong := [k for k in asked if k not in names]:
            raise GpugeekError(f"plan: no option {', '.join(map(repr, wrong))} — the options are {', '.join(names)}")
        return cls(**asked).checked()

    def checked(self) -> PlanRequest:
        """The same request with each value parsed (``'bf16'`` → its canonical name, ``'2'`` → 2)
        and every rule between values held; the first wrong one is one line naming its flag."""
        if (self.params is None) == (self.model is None):
            raise GpugeekError("both or neither of --params and --model given — give exactly one of --params (like "
                               "7B) or --model VAR")
        mfu = positive_number(self.mfu, "--mfu")
        if mfu is None or not 0 < mfu <= 1:
            raise GpugeekError(f"--mfu {self.mfu} is not a fraction in (0, 1] — give one, like 0.4")
        if self.tokens is not None and self.hours is not None:
            raise GpugeekError("--tokens and --hours given together — give --tokens or --hours, not both")
        made = dataclasses.replace(
            self, batch=whole_number(self.batch, "--batch"), top=whole_number(self.top, "--top"),
            seq=whole_number(self.seq, "--seq"), gpus=whole_number(self.gpus, "--gpus"),
            precision=Precision.parse(self.precision, "--precision").value,
            optimizer=Optimizer.parse(self.optimizer, "--optimizer").value,
            strategy=Strategy.parse(self.strategy, "--strategy").value,
            objective=Objective.parse(self.objective, "--objective").value,
            pricing=Pricing.parse(self.pricing, "--pricing").value, mfu=mfu,
            hours=positive_number(self.hours, "--hours"),
            checkpoint_every=positive_number(self.checkpoint_every, "--checkpoint-every"),
            checkpoint_seconds=positive_number(self.checkpoint_seconds, "--checkpoint-seconds"),
            restart_minutes=number(self.restart_minutes, "--restart-minutes", least=0))
        if made.strategy == "fsdp" and made.gpus == 1:
            raise GpugeekError("--strategy fsdp needs more than one GPU — raise --gpus or use ddp")
        return made
