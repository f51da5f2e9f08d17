"""Pick the cheapest offer that fits a training run, and price the run three ways.

Time is an estimate: training FLOPs (6·N per token, i.e. forward × 3, plus one more forward when
activations are recomputed) over the offer's peak dense TFLOP/s × an assumed MFU. Communication
between nodes is not modelled.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .. import config
from ..catalog import offers as catalog_offers
from ..catalog.residency import residency_mask
from ..errors import GpugeekError
from ..units import human_count, parse_count
from . import memory, spot
from .request import PlanRequest

if TYPE_CHECKING:  # torch loads when a model is planned
    from torch import nn

CHINCHILLA_TOKENS_PER_PARAM = 20
TABLE_COLUMNS = [
    "id", "provider", "instance_type", "gpu", "gpu_count", "nodes", "gpu_mem_gib",
    "mem_per_gpu_gib", "headroom_gib", "peak_tflops", "est_hours", "est_tokens", "price",
    "cost", "usd_per_m_tokens", "cost_on_demand", "cost_spot", "cost_reserved", "spot_hours",
    "preemptions_per_hour", "ckpt_every_min", "best_ckpt_min",
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
                f"~{b['est_hours']:.3g} h, ~${b['cost']:,.2f} {self.pricing} (estimates"
                + (")" if self.pricing != "spot" else "; expected, preemptions priced in)"
                   if b["preemptions_per_hour"] == b["preemptions_per_hour"]
                   else "; no preemption rate known, so preemptions are not priced)"))

    def shown(self) -> pd.DataFrame:
        """The top rows for display: one per instance type and price (other regions folded)."""
        keys = ["provider", "instance_type", "gpu_count", "nodes", "price"]
        distinct = self.table.drop_duplicates(keys).head(self.top)
        places = self.table.groupby(keys, sort=False).size().rename("regions")
        return distinct.join(places, on=keys).round(
            {"mem_per_gpu_gib": 1, "headroom_gib": 1, "est_hours": 3, "price": 2, "cost": 2,
             "cost_on_demand": 2, "cost_spot": 2, "cost_reserved": 2, "spot_hours": 3,
             "ckpt_every_min": 0, "best_ckpt_min": 0})

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


def plan(params: str | float | None = None, model: nn.Module | None = None, **options) -> Plan:
    """Size a training run and find the offers that fit it, best first by ``objective``.

    Give either ``params`` (``'7B'``) or ``model`` (a ``torch.nn.Module``: exact parameter bytes,
    activations measured). ``batch`` is the micro-batch per GPU; ``seq`` its sequence length.
    ``tokens`` (or samples, for models without a sequence) or ``hours`` sizes the run; with
    neither, the run is 20 tokens per parameter (Chinchilla-optimal). ``ckpt_class`` names the
    block class to checkpoint when the model keeps its blocks outside an ``nn.ModuleList``.
    The options are ``PlanRequest``'s fields (``sizing/request.py``).

    Spot columns are *expected* hours and $: preemptions at each offer's rate redo the work since
    the last checkpoint (every ``checkpoint_every`` minutes, else the interval that minimises the
    cost, ``best_ckpt_min``) and pay ``restart_minutes`` each. See ``sizing/spot.py``.
    """
    return planned(PlanRequest.of(params=params, model=model, **options))


plan.__signature__ = inspect.signature(PlanRequest).replace(return_annotation=Plan)  # help() and completion


def planned(ask: PlanRequest) -> Plan:
    """The plan for a checked request: the run's memory, its length, the offers that hold it."""
    model, precision, batch, seq, hours = ask.model, ask.precision, ask.batch, ask.seq, ask.hours
    if model is not None:
        est = memory.from_model(model, precision, ask.optimizer, batch, seq, ask.grad_ckpt, ask.strategy,
                                ask.gpus, ask.example, ask.ckpt_class)
    else:
        n = parse_count(ask.params, "--params")
        est = memory.from_params(n, precision, ask.optimizer, batch, seq or 2048, ask.grad_ckpt,
                                 ask.strategy, ask.gpus)
    checkpoint_h, checkpoint_note = spot.checkpoint_hours(
        est.weights_gib + est.optimizer_gib, ask.checkpoint_seconds)
    run_tokens = parse_count(ask.tokens, "--tokens") if ask.tokens is not None else None
    if run_tokens is None and hours is None:
        run_tokens = CHINCHILLA_TOKENS_PER_PARAM * est.trainable_params

    options = dict(gpus=ask.gpus, pricing=ask.pricing, gpu=ask.gpu, provider=ask.provider, region=ask.region,
                   residency=ask.residency, catalog=ask.catalog, precision=precision, grad_ckpt=ask.grad_ckpt,
                   tokens=run_tokens, hours=hours, mfu=ask.mfu, checkpoint_h=checkpoint_h,
                   restart_h=ask.restart_minutes / 60,
                   interval_h=ask.checkpoint_every / 60 if ask.checkpoint_every else None,
                   tokens_per_step=batch * (seq or 1) if model is not None else batch * (seq or 2048))
    table = rank(candidates(est, **options), ask.objective, by_hours=hours is not None)
    best = table.iloc[0] if not table.empty else None
    why_empty = "" if best is not None else _why_empty(est, options, precision)
    return Plan(
        memory=est, table=table[TABLE_COLUMNS].reset_index(drop=True), best=best,
        pricing=ask.pricing, objective=ask.objective, tokens=run_tokens, hours=hours, mfu=ask.mfu, top=ask.top,
        why_empty=why_empty,
        assumptions=_assumptions(est, precision, ask.optimizer, ask.mfu, run_tokens, hours, ask.tokens, ask.pricing)
        + _spot_assumptions(table, checkpoint_note, ask.restart_minutes, ask.checkpoint_every)
        + _catalog_notes(catalog_offers.load_catalog(ask.catalog), ask.residency),
    )


def candidates(est: memory.MemoryEstimate, *, gpus: int | None, pricing: str, precision: str,
               grad_ckpt: bool, tokens: float | None, hours: float | None, mfu: float,
               tokens_per_step: int, checkpoint_h: float, restart_h: float,
               interval_h: float | None = None, gpu: str | None = None, provider: str | None = None,
               region: str | None = None, catalog: str | None = None,
               residency: str | None = None) -> pd.DataFrame:
    """Every priced offer whose GPUs hold the run, with its estimated hours and $ (spot: expected,
    preemptions priced in).

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
                 catalog_offers.region_mask(offers, region),
                 _residency_mask(offers, residency)):
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
    price_now = price[rows] * n
    mem = col["gpu_mem_gib"][rows]
    need_now = np.broadcast_to(need, keep.shape)[rows]

    # spot: any node lost stops every rank, so the run's rate is its nodes' rates summed
    rate = _node_rates(offers)[rows] * n
    best = spot.best_interval(rate, checkpoint_h)
    interval = best if interval_h is None else np.full(len(rows), interval_h)
    spot_hours = spot.expected_hours(est_hours, rate, np.minimum(interval, 1e9), checkpoint_h, restart_h)
    unknown = np.isnan(rate)
    spot_price = col["spot_price"][rows] * n
    tokens = est_hours * tokens_per_hour
    spot_tokens = tokens
    if hours is not None:
        # --hours is wall time: spot trains less in it, at the expected share of time not lost
        spot_tokens = np.where(unknown, tokens, tokens * est_hours / spot_hours)
        spot_hours = np.where(unknown, np.nan, est_hours)
    # where no rate is known the bare spot price is all there is (and a spot plan ranks those after)
    cost_spot = np.where(unknown, est_hours, spot_hours) * spot_price
    hours_now, tokens_now = est_hours, tokens
    if pricing == "spot":
        hours_now = np.where(unknown, est_hours, spot_hours)
        tokens_now = spot_tokens
    # one frame built at once: planning is interactive (column-by-column inserts cost milliseconds)
    columns = {name: offers[name].to_numpy()[rows] for name in (
        "id", "provider", "instance_type", "gpu", "gpu_count")}
    return pd.DataFrame({
        **columns, "gpu_mem_gib": mem, "nodes": n, "mem_per_gpu_gib": need_now,
        "headroom_gib": mem - need_now, "peak_tflops": peak[rows], "est_hours": hours_now,
        "est_tokens": tokens_now, "price": price_now, "cost": hours_now * price_now,
        "cost_on_demand": est_hours * col["on_demand_price"][rows] * n,
        "cost_reserved": est_hours * col["reserved_price"][rows] * n,
        "spot_hours": spot_hours, "preemptions_per_hour": rate, "ckpt_every_min": interval * 60,
        "best_ckpt_min": best * 60, "cost_spot": cost_spot,
        "has_spot_price": ~np.isnan(col["spot_price"][rows]),
        "_unpriced_risk": unknown if pricing == "spot" else np.zeros(len(rows), bool),
    })


def _residency_mask(offers: pd.DataFrame, residency: str | None) -> pd.Series | None:
    return residency_mask(offers, residency)[0] if residency else None


_rates_cache: dict[tuple[int, tuple], tuple[pd.DataFrame, np.ndarray]] = {}


def _node_rates(offers: pd.DataFrame) -> np.ndarray:
    """Per-node preemptions per hour of every catalog row, for this catalog and these settings."""
    overrides = config.settings().spot_rates
    key = (id(offers), overrides)
    if key not in _rates_cache or _rates_cache[key][0] is not offers:
        providers = offers["provider"].to_numpy()
        gpus = np.array([spot.gpu_key(f, v) for f, v in zip(offers["gpu"], offers["variant"], strict=True)])
        table = spot.rate_table(dict(overrides))
        if wrong := spot.unmatched(table, providers, gpus):
            raise GpugeekError(f"config.toml [spot] preemptions_per_hour: {', '.join(wrong)} names no offer "
                               "— use a provider (aws) or provider/GPU as `%gpugeek offers` spells it "
                               "(aws/H100, aws/A100-80GB)")
        _rates_cache.clear()       # one catalog at a time (kept with it: its id is not reused)
        _rates_cache[key] = (offers, spot.node_rates(providers, gpus, table))
    return _rates_cache[key][1]


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
    # spot offers whose preemptions cannot be priced go after every offer whose can
    return frame.sort_values(["_unpriced_risk", *keys], kind="stable").drop(
        columns=["_more_tokens", "_unpriced_risk"])


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
        notes.append(f"run length: {hours:g} h of wall time on every offer"
                     + ("; on spot, preemptions leave fewer tokens trained in it" if pricing == "spot" else ""))
    elif tokens_arg is None:
        notes.append(f"run length: {human_count(run_tokens)} tokens "
                     f"({CHINCHILLA_TOKENS_PER_PARAM} per parameter, Chinchilla-optimal); "
                     "set --tokens or --hours")
    else:
        notes.append(f"run length: {human_count(run_tokens)} tokens")
    notes.append("reserved = on-demand × (1 − discount), an estimate; spot prices are a snapshot")
    if pricing == "spot":
        notes.append("spot hours and $ are expected values with preemptions priced in (below)")
    if est.strategy == "fsdp":
        notes.append("fsdp shards weights, gradients and optimizer state evenly over all GPUs")
    notes.extend(est.notes)
    if math.isnan(est.activations_gib):
        notes.append("activations unknown")
    return notes


def _spot_assumptions(table: pd.DataFrame, checkpoint_note: str, restart_minutes: float,
                      checkpoint_every: float | None) -> list[str]:
    """Say what the spot columns rest on, and which offers have no preemption rate at all."""
    unknown = table[table["has_spot_price"] & table["preemptions_per_hour"].isna()]
    interval = (f"a checkpoint every {checkpoint_every:g} min" if checkpoint_every else
                "a checkpoint at each offer's best interval (best_ckpt_min; Young's √(2·C·MTBP) "
                "refined)")
    notes = [f"spot: Poisson preemptions at each offer's rate (sizing/data/preemption.csv, or "
             f"[spot] in config.toml) × nodes; {interval}; {checkpoint_note}; a restart costs "
             f"{restart_minutes:g} min (assumed; set --restart-minutes); all estimates"]
    if not unknown.empty:
        providers = ", ".join(sorted(unknown["provider"].unique()))
        notes.append(f"no preemption rate known for {len(unknown)} offer(s) ({providers}): their "
                     "cost_spot is the bare spot price × hours, preemptions not priced (a spot plan ranks "
                     "them last) — set [spot] preemptions_per_hour in config.toml")
    return notes


def _catalog_notes(offers: pd.DataFrame, residency: str | None) -> list[str]:
    """The prices' date (and a warning when it is old), and what a residency left out."""
    notes = []
    if residency:
        _mask, unknown = residency_mask(offers, residency)
        notes.append(catalog_offers.unknown_regions_note(residency, unknown) if unknown else
                     f"--residency {residency}: only regions the region table places there")
    if offers.attrs.get("prices_as_of"):
        notes.append(f"prices as of {offers.attrs['prices_as_of']}")
    return notes + ([offers.attrs["stale_warning"]] if offers.attrs.get("stale_warning") else [])
