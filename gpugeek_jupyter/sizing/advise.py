"""Right-sizing: from what a job measured to the cheaper offers that would do the same work.

The job's GPUs were busy ``busy`` of the time, so the work it asked of them is at most
``busy × GPUs × peak`` TFLOP/s. An offer delivers the same steps when its GPUs hold the measured
peak memory (plus a margin) and ``GPUs × peak × BUSY_TARGET`` covers that work: it then runs as
fast, and the same work costs its $/h for the same hours. Peaks are each GPU's dense bf16 spec;
busy is NVML's utilisation (time a kernel ran, not FLOPs), so every figure is an estimate.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field

import pandas as pd

from ..catalog import offers as catalog_offers
from . import memory

BUSY_TARGET = 0.9          # an offer is sized to run at most this busy
MEMORY_MARGIN = 0.2        # headroom over the measured peak
MEMORY_BOUND_AT = 0.9      # peak / GPU memory from which a job is memory-bound
SHOWN = 5


@dataclass
class Usage:
    """What a job measured on the GPUs it ran on."""

    gpu: str                   # family of the job's GPUs (H100, A100, …)
    gpus: int                  # how many
    peak_tflops: float         # one GPU's dense bf16 peak
    mem_gib: float             # one GPU's memory
    usd_per_hour: float        # what those GPUs cost
    busy: float                # mean GPU utilisation, 0–1 (NaN: no GPU telemetry)
    peak_gib: float            # peak memory one GPU held
    hours: float               # how long the job ran
    samples_per_s: float | None = None


@dataclass
class Advice:
    usage: Usage | None
    offers: pd.DataFrame = field(default_factory=pd.DataFrame)
    lines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        table = "" if self.offers.empty else "\n\n" + self.offers.to_string(index=False)
        return str(self) + table

    def _repr_html_(self) -> str:
        lines = "".join(f"<p>{html.escape(line)}</p>" for line in self.lines)
        return lines + ("" if self.offers.empty else self.offers.to_html(index=False))


def right_size(usage: Usage, candidates: pd.DataFrame) -> Advice:
    """The offers in ``candidates`` (priced: ``price`` $/h) that hold the job's memory and match
    its throughput for less, cheapest first, and one line per finding."""
    if usage.busy != usage.busy:      # NaN
        return Advice(usage, lines=["no GPU telemetry for this job (it ran on CPU, or NVML was "
                                    "not available) — nothing to advise"])
    need_gib = usage.peak_gib * (1 + MEMORY_MARGIN) + memory.CUDA_OVERHEAD_GIB
    work = usage.busy * usage.gpus * usage.peak_tflops
    lines = [f"measured: {usage.gpus}× {usage.gpu} {usage.busy:.0%} busy, {usage.peak_gib:.1f} of "
             f"{usage.mem_gib:.0f} GiB peak per GPU, ${usage.usd_per_hour:,.2f}/h"]
    if usage.peak_gib >= MEMORY_BOUND_AT * usage.mem_gib:
        lines.append(f"memory-bound: {usage.peak_gib:.1f} of {usage.mem_gib:.0f} GiB — "
                     f"gradient checkpointing (--grad-ckpt), or FSDP over {2 * usage.gpus} GPUs of the "
                     "current type")
    capacity = candidates["gpu_count"] * candidates["bf16_tflops"] * BUSY_TARGET
    fits = candidates[(candidates["gpu_mem_gib"] >= need_gib) & (capacity >= work)
                      & (candidates["price"] < usage.usd_per_hour)]
    cheaper = (fits.sort_values(["price", "id"], kind="stable")
               .drop_duplicates(["gpu", "gpu_count"]).head(SHOWN).copy())
    if cheaper.empty:
        why = ("its GPUs are busy" if usage.busy >= BUSY_TARGET
               else f"none holds {need_gib:.1f} GiB per GPU and keeps up for less")
        lines.append(f"nothing cheaper delivers the same throughput ({why}) (estimate)")
        return Advice(usage, lines=lines)
    cheaper["saving"] = 1 - cheaper["price"] / usage.usd_per_hour
    cheaper["usd_same_work"] = cheaper["price"] * usage.hours
    best = cheaper.iloc[0]
    lines.append(f"GPUs {usage.busy:.0%} busy, {usage.peak_gib:.0f} of {usage.mem_gib:.0f} GiB peak → "
                 f"{best['gpu']} ×{int(best['gpu_count'])} would cost ~{best['saving']:.0%} less for "
                 f"the same steps: ${best['price']:,.2f}/h ({best['id']}) (estimate)")
    shown = cheaper[["id", "gpu", "gpu_count", "gpu_mem_gib", "price", "saving", "usd_same_work"]]
    return Advice(usage, offers=shown.rename(columns={"price": "usd_per_hour"}).reset_index(drop=True),
                  lines=lines)


def candidates(pricing: str = "on-demand", catalog: str | None = None,
               residency: str | None = None) -> pd.DataFrame:
    """Every single-node offer priced under ``pricing`` with a known peak and memory."""
    frame = catalog_offers.load_catalog(catalog)
    if residency:
        from ..catalog.residency import residency_mask

        frame = frame[residency_mask(frame, residency)[0]]
    frame = catalog_offers.with_pricing(frame, pricing)
    return frame[frame["bf16_tflops"].notna() & frame["gpu_mem_gib"].notna()]


def measured_usage(samples: pd.DataFrame, *, gpu: str, gpus: int, peak_tflops: float,
                   mem_gib: float, usd_per_hour: float, hours: float) -> Usage:
    """A job's telemetry (the ledger's samples) as the usage right-sizing reads."""
    def column(name: str) -> pd.Series:
        return samples[name].dropna() if name in samples else pd.Series(dtype=float)

    busy = column("gpu_util")
    memory_bytes = column("memory_bytes")
    rate = column("samples_per_s")
    return Usage(gpu=gpu, gpus=gpus, peak_tflops=peak_tflops, mem_gib=mem_gib,
                 usd_per_hour=usd_per_hour, hours=hours,
                 busy=float(busy.mean()) / 100 if len(busy) else math.nan,
                 peak_gib=float(memory_bytes.max()) / 2**30 if len(memory_bytes) else math.nan,
                 samples_per_s=float(samples.groupby("rank")["samples_per_s"].mean().sum())
                 if len(rate) else None)


def advise_job(cluster_id: int, job: str | None = None, *, gpu: str | None = None,
               usd_per_hour: float | None = None, pricing: str = "on-demand",
               catalog: str | None = None, residency: str | None = None) -> Advice:
    """Right-size one job of a cluster from the ledger (``job``: its name or id; default the last).

    The GPU type and $/h come from the nodes' offer; ``gpu`` and ``usd_per_hour`` (per GPU) say
    them where the cluster has no offer (your own machines)."""
    from ..errors import GpugeekError
    from ..meter import ledger

    rows = ledger.jobs_of(cluster_id)
    if job is not None:
        rows = [r for r in rows if job in (r["name"], r["job_id"])]
    if not rows:
        raise GpugeekError(f"no job {job!r} on this cluster — `%gpugeek cost --by job` lists them"
                           if job else "no job has run on this cluster yet — nothing to advise")
    row = rows[-1]
    samples = ledger.samples_frame(cluster_id, row["job_id"])
    hours = ((row["ended"] or time.time()) - row["started"]) / 3600
    if samples.empty or "gpu_util" not in samples or samples["gpu_util"].isna().all():
        return right_size(Usage(gpu="", gpus=0, peak_tflops=math.nan, mem_gib=math.nan,
                                usd_per_hour=math.nan, busy=math.nan, peak_gib=math.nan,
                                hours=hours), pd.DataFrame())
    gpus = int(samples.loc[samples["gpu_util"].notna(), "rank"].nunique())
    offer, per_gpu = _offer_of(cluster_id, catalog)
    if gpu is not None:
        from ..catalog import gpus as gpu_specs

        family = gpu_specs.family_of(gpu)
        spec = gpu_specs.spec(family)
        if spec is None:
            raise GpugeekError(f"--gpu {gpu}: no spec for that GPU — use a family like H100, A100, L4")
        offer = {"gpu": family, "bf16_tflops": spec.peak_tflops("bf16"), "gpu_mem_gib": spec.mem_gib}
    if offer is None:
        raise GpugeekError("this cluster has no catalog offer to compare against — say what its "
                           "GPUs are: --gpu H100 --usd-per-hour X (per GPU)")
    per_gpu = usd_per_hour if usd_per_hour is not None else per_gpu
    if per_gpu is None:
        raise GpugeekError("what does one GPU cost here? — give --usd-per-hour X (per GPU)")
    usage = measured_usage(samples, gpu=offer["gpu"], gpus=gpus, peak_tflops=float(offer["bf16_tflops"]),
                           mem_gib=float(offer["gpu_mem_gib"]), usd_per_hour=per_gpu * gpus, hours=hours)
    return right_size(usage, candidates(pricing, catalog, residency))


def _offer_of(cluster_id: int, catalog: str | None) -> tuple[dict | None, float | None]:
    """The catalog row of the cluster's GPU nodes, and the $/h of one of their GPUs."""
    from ..meter import ledger

    nodes = ledger.nodes_frame(cluster_id)
    nodes = nodes[(nodes["gpus"].astype(float) > 0) & nodes["offer_id"].notna()]
    if nodes.empty:
        return None, None
    node = nodes.iloc[-1]
    rows = catalog_offers.load_catalog(catalog)
    hits = rows[rows["id"] == node["offer_id"]]
    per_gpu = float(node["usd_per_hour"]) / float(node["gpus"])
    return (hits.iloc[0].to_dict() if not hits.empty else None), per_gpu
