"""Pick the cheapest offer that fits a training run, and price the run three ways.

Time is an estimate: training FLOPs (6·N per token, i.e. forward × 3, plus one more forward when
activations are recomputed) over the offer's peak dense TFLOP/s × an assumed MFU. Communication
between nodes is not modelled.
"""

from __future__ import annotations

import dataclasses
import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..catalog import offers as catalog_offers
from ..errors import GpugeekError
from ..units import human_count, parse_count, positive_number, whole_number
from ..vocab import Objective, Optimizer, Precision, Pricing, Strategy
from . import memory

if TYPE_CHECKING:  # torch loads when a model is planned
    from torch import nn

DEFAULT_MFU = 0.40
CHINCHILLA_TOKENS_PER_PARAM = 20
TABLE_COLUMNS = [
    "id", "provider", "instance_type", "gpu", "gpu_count", "nodes", "gpu_mem_gib",
    "mem_per_gpu_gib", "headroom_gib", "peak_tflops", "est_hours", "est_tokens", "price",
    "cost", "usd_per_m_tokens", "cost_on_demand", "cost_spot", "cost_reserved",
]


@dataclass
class Plan:
    """What a run needs (``memory``), what could run it (``table``) and the pick (``best``)."""

    memory: memory.MemoryEstimate
    table: pd.DataFrame
    best: pd.Series | None
    pricing: str
    objective: str
    tokens: float | None
    hours: float | None
    mfu: float
    assumptions: list[str] = field(default_factory=list)
    top: int = 10
    why_empty: str = ""

    @property
    def memory_table(self) -> pd.DataFrame:
        """GiB per GPU for the best offer's world size (or for ``--gpus``/1 GPU if none fits)."""
        world = int(self.best["gpu_count"] * self.best["nodes"]) if self.best is not None else (
            self.memory.gpus or 1)
        parts = self.memory.per_gpu(world)
        return pd.DataFrame({"GiB per GPU": parts}).round(2)

    def summary(self) -> str:
        if self.best is None:
            return f"no offer fits: {self.why_empty}"
        b = self.best
        where = f"{int(b['nodes'])}× " if b["nodes"] > 1 else ""
        return (f"best: {where}{b['id']} ({b['gpu']}×{int(b['gpu_count'])}) — "
                f"~{b['mem_per_gpu_gib']:.1f} of {b['gpu_mem_gib']:.0f} GiB per GPU, "
                f"~{b['est_hours']:.3g} h, ~${b['cost']:,.2f} {self.pricing} (estimates)")

    def shown(self) -> pd.DataFrame:
        """The top rows for display: one per instance type and price (other regions folded)."""
        keys = ["provider", "instance_type", "gpu_count", "nodes", "price"]
        distinct = self.table.drop_duplicates(keys).head(self.top)
        places = self.table.groupby(keys, sort=False).size().rename("regions")
        return distinct.join(places, on=keys).round(
            {"mem_per_gpu_gib": 1, "headroom_gib": 1, "est_hours": 3, "price": 2, "cost": 2,
             "cost_on_demand": 2, "cost_spot": 2, "cost_reserved": 2})

    def __repr__(self) -> str:
        lines = [self.summary(), "", "memory per GPU (estimate):", self.memory_table.to_string(),
                 "", f"top {self.top} offers by {self.objective} (other regions at the same "
                 "price folded into 'regions'):"]
        shown = self.shown()
        lines.append(shown.to_string(index=False) if not shown.empty else "(none fits)")
        lines += ["", "assumptions:"] + [f"- {a}" for a in self.assumptions]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        shown = self.shown()
        parts = [
            f"<p><b>{html.escape(self.summary())}</b></p>",
            "<p>memory per GPU (estimate)</p>", self.memory_table.to_html(),
            f"<p>top {self.top} offers by {self.objective}; hours and $ are estimates; other "
            "regions at the same price are folded into <i>regions</i></p>",
            shown.to_html(index=False)
            if not shown.empty else "<p>(none fits)</p>",
            "<p>assumptions:</p><ul>"
            + "".join(f"<li>{html.escape(a)}</li>" for a in self.assumptions) + "</ul>",
        ]
        return "\n".join(parts)


def plan(
    params: str | float | None = None,
    model: nn.Module | None = None,
    precision: str = "bf16",
    optimizer: str = "adam",
    batch: int = 1,
    seq: int | None = None,
    grad_ckpt: bool = False,
    strategy: str = "ddp",
    gpus: int | None = None,
    tokens: str | float | None = None,
    hours: float | None = None,
    pricing: str = "on-demand",
    objective: str = "cost",
    top: int = 10,
    mfu: float = DEFAULT_MFU,
    gpu: str | None = None,
    provider: str | None = None,
    region: str | None = None,
    catalog: str | None = None,
    example: object = None,
    ckpt_class: str | None = None,
) -> Plan:
    """Size a training run and find the offers that fit it, best first by ``objective``.

    Give either ``params`` (``'7B'``) or ``model`` (a ``torch.nn.Module``: exact parameter bytes,
    activations measured). ``batch`` is the micro-batch per GPU; ``seq`` its sequence length.
    ``tokens`` (or samples, for models without a sequence) or ``hours`` sizes the run; with
    neither, the run is 20 tokens per parameter (Chinchilla-optimal). ``ckpt_class`` names the
    block class to checkpoint when the model keeps its blocks outside an ``nn.ModuleList``.
    """
    batch, top = whole_number(batch, "--batch"), whole_number(top, "--top")
    seq, gpus = whole_number(seq, "--seq"), whole_number(gpus, "--gpus")
    precision = Precision.parse(precision, "--precision").value
    optimizer = Optimizer.parse(optimizer, "--optimizer").value
    strategy = Strategy.parse(strategy, "--strategy").value
    objective = Objective.parse(objective, "--objective").value
    pricing = Pricing.parse(pricing, "--pricing").value
    if (params is None) == (model is None):
        raise GpugeekError("give exactly one of --params (like 7B) or --model VAR")
    mfu = positive_number(mfu, "--mfu")
    if mfu is None or not 0 < mfu <= 1:
        raise GpugeekError(f"--mfu {mfu} must be a fraction in (0, 1]")
    if tokens is not None and hours is not None:
        raise GpugeekError("give --tokens or --hours, not both")
    hours = positive_number(hours, "--hours")
    if strategy == "fsdp" and gpus == 1:
        raise GpugeekError("--strategy fsdp needs more than one GPU — raise --gpus or use ddp")

    if model is not None:
        est = memory.from_model(model, precision, optimizer, batch, seq, grad_ckpt, strategy,
                                gpus, example, ckpt_class)
    else:
        n = parse_count(params, "--params")
        est = memory.from_params(n, precision, optimizer, batch, seq or 2048, grad_ckpt,
                                 strategy, gpus)
    run_tokens = parse_count(tokens, "--tokens") if tokens is not None else None
    if run_tokens is None and hours is None:
        run_tokens = CHINCHILLA_TOKENS_PER_PARAM * est.trainable_params

    options = dict(gpus=gpus, pricing=pricing, gpu=gpu, provider=provider, region=region,
                   catalog=catalog, precision=precision, grad_ckpt=grad_ckpt, tokens=run_tokens,
                   hours=hours, mfu=mfu,
                   tokens_per_step=batch * (seq or 1) if model is not None else batch * (seq or 2048))
    table = rank(candidates(est, **options), objective, by_hours=hours is not None)
    best = table.iloc[0] if not table.empty else None
    why_empty = "" if best is not None else _why_empty(est, options, precision)
    return Plan(
        memory=est, table=table[TABLE_COLUMNS].reset_index(drop=True), best=best,
        pricing=pricing, objective=objective, tokens=run_tokens, hours=hours, mfu=mfu, top=top,
        why_empty=why_empty,
        assumptions=_assumptions(est, precision, optimizer, mfu, run_tokens, hours, tokens, pricing),
    )


def candidates(est: memory.MemoryEstimate, *, gpus: int | None, pricing: str, precision: str,
               grad_ckpt: bool, tokens: float | None, hours: float | None, mfu: float,
               tokens_per_step: int, gpu: str | None = None, provider: str | None = None,
               region: str | None = None, catalog: str | None = None) -> pd.DataFrame:
    """Every priced offer whose GPUs hold the run, with its estimated hours and $.

    Works on whole-catalog numpy columns and builds one small frame at the end: planning is
    interactive, so it must stay well under 10 ms for the full catalog.
    """
    offers = catalog_offers.load_catalog(catalog)
    col = {name: offers[name].to_numpy() for name in (
        "gpu_count", "gpu_mem_gib", "on_demand_price", "spot_price", "reserved_price",
        f"{precision}_tflops")}
    price = col[catalog_offers.price_column(pricing)]
    peak = col[f"{precision}_tflops"]
    per_node = col["gpu_count"]
    keep = ~np.isnan(price) & ~np.isnan(peak)
    if gpu:
        keep &= catalog_offers.gpu_mask(offers, gpu).to_numpy()
    for mask in (catalog_offers.provider_mask(offers, provider),
                 catalog_offers.region_mask(offers, region)):
        if mask is not None:
            keep &= mask.to_numpy()
    if gpus is not None:
        keep &= (per_node == gpus) | ((per_node >= 8) & (gpus % per_node == 0))
        nodes = np.maximum(gpus // per_node, 1)
    else:
        nodes = np.ones_like(per_node)
    world = per_node * nodes
    shard = world if est.strategy == "fsdp" else 1
    need = (est.static_gib / shard + est.activations_gib) * (1 + memory.FRAGMENTATION)
    need = need + memory.CUDA_OVERHEAD_GIB
    keep &= need <= col["gpu_mem_gib"]

    rows = np.flatnonzero(keep)
    flops_per_token = 3 * est.forward_flops_per_step / tokens_per_step
    if grad_ckpt:
        flops_per_token *= 4 / 3  # one more forward pass to recompute activations
    tokens_per_hour = world[rows] * peak[rows] * 1e12 * mfu * 3600 / flops_per_token
    est_hours = np.full(len(rows), float(hours)) if hours is not None else tokens / tokens_per_hour
    n = nodes[rows]
    frame = offers.iloc[rows][["id", "provider", "instance_type", "gpu", "gpu_count",
                               "gpu_mem_gib"]].reset_index(drop=True)
    frame["nodes"] = n
    frame["mem_per_gpu_gib"] = np.broadcast_to(need, keep.shape)[rows]
    frame["headroom_gib"] = frame["gpu_mem_gib"] - frame["mem_per_gpu_gib"]
    frame["peak_tflops"] = peak[rows]
    frame["est_hours"] = est_hours
    frame["est_tokens"] = est_hours * tokens_per_hour
    frame["price"] = price[rows] * n
    frame["cost"] = est_hours * frame["price"].to_numpy()
    frame["cost_on_demand"] = est_hours * col["on_demand_price"][rows] * n
    frame["cost_spot"] = est_hours * col["spot_price"][rows] * n
    frame["cost_reserved"] = est_hours * col["reserved_price"][rows] * n
    return frame


def rank(frame: pd.DataFrame, objective: str, by_hours: bool = False) -> pd.DataFrame:
    """Best first. A fixed run (tokens) ranks by $ or hours; a fixed time (``--hours``) ranks by
    $ per token trained, or by tokens trained for the time objective."""
    frame = frame.assign(usd_per_m_tokens=frame["cost"] / frame["est_tokens"] * 1e6,
                         _more_tokens=-frame["est_tokens"])
    if by_hours:
        keys = (["usd_per_m_tokens", "id"] if objective == "cost"
                else ["_more_tokens", "usd_per_m_tokens", "id"])
    else:
        keys = ["cost", "est_hours", "id"] if objective == "cost" else ["est_hours", "cost", "id"]
    return frame.sort_values(keys, kind="stable").drop(columns="_more_tokens")


def _why_empty(est: memory.MemoryEstimate, options: dict, precision: str) -> str:
    """Say which constraint emptied the table: the offers themselves, or memory."""
    weightless = dataclasses.replace(est, weights_gib=0, gradients_gib=0, optimizer_gib=0,
                                     activations_gib=0)
    if candidates(weightless, **options).empty:
        gpus = options["gpus"]
        count = (f"with {gpus} GPUs (one instance of {gpus}, or 8+-GPU instances that divide "
                 f"{gpus})" if gpus else "")
        return (f"no priced offer {count} matches the filters with a known {precision} speed "
                "— relax --gpus, --gpu, --provider, --region or --pricing")
    need = est.per_gpu(est.gpus or 1)["total"]
    fixes = ["--grad-ckpt", "a smaller --batch", "--strategy fsdp with more --gpus"]
    if precision == "fp32":
        fixes.append("--precision bf16")
    return f"the run needs ~{need:.1f} GiB per GPU (estimate) — try {', '.join(fixes)}"


def _assumptions(est, precision, optimizer, mfu, run_tokens, hours, tokens_arg, pricing):
    notes = [
        f"{human_count(est.trainable_params)} trainable parameters; {precision} "
        + ("(torch.amp: fp32 weights, grads and optimizer state; half-precision activations)"
           if precision != "fp32" else "(fp32 throughout)")
        + f"; {optimizer} keeps {memory.OPTIMIZER_STATES[optimizer]} state tensor(s) per weight",
        f"activations: {est.activations_method}",
        f"overhead: {memory.CUDA_OVERHEAD_GIB:.0f} GiB CUDA context + "
        f"{memory.FRAGMENTATION:.0%} allocator slack",
        f"time: training FLOPs at {mfu:.0%} MFU of each GPU's peak dense {precision} TFLOP/s; "
        "no inter-node communication cost",
    ]
    if hours is not None:
        notes.append(f"run length: {hours:g} h on every offer")
    elif tokens_arg is None:
        notes.append(f"run length: {human_count(run_tokens)} tokens "
                     f"({CHINCHILLA_TOKENS_PER_PARAM} per parameter, Chinchilla-optimal); "
                     "set --tokens or --hours")
    else:
        notes.append(f"run length: {human_count(run_tokens)} tokens")
    notes.append("reserved = on-demand × (1 − discount), an estimate; spot prices are a snapshot")
    if est.strategy == "fsdp":
        notes.append("fsdp shards weights, gradients and optimizer state evenly over all GPUs")
    notes.extend(est.notes)
    if math.isnan(est.activations_gib):
        notes.append("activations unknown")
    return notes
