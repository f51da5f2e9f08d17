"""Right-sizing: from what a job measured to the cheaper offers that would do the same work.

The job's GPUs were busy ``busy`` of the time, so the work it asked of them is at most
``busy × GPUs × peak`` TFLOP/s. Another offer runs the same job — the same number of GPUs, as one
instance or several of the same offer, so ranks, batch and memory per GPU stay as they were —
when its GPUs hold the measured peak memory (plus a margin) and ``GPUs × peak × BUSY_TARGET``
covers that work. It then keeps up, and the same work costs its $/h for the same hours. Peaks
are each GPU's dense bf16 spec and busy is NVML's utilisation (time a kernel ran, not FLOPs): a
compute-bound estimate that leaves memory bandwidth and the interconnect out, and says so.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field

import pandas as pd

from ..catalog import gpus as gpu_specs
from ..catalog import offers as catalog_offers
from ..catalog.residency import residency_mask
from ..errors import GpugeekError
from ..meter import costs, ledger
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
    """The offers in ``candidates`` (priced: ``price`` $/h per instance) that run the job's GPUs,
    hold its memory and keep up with its work for less, cheapest first; one line per finding."""
    if usage.busy != usage.busy:      # NaN
        return Advice(usage, lines=["no GPU telemetry for this job (it ran on CPU, or NVML was "
                                    "not available) — nothing to advise"])
    if usage.peak_gib != usage.peak_gib:
        return Advice(usage, lines=["the job reported no peak memory, so no offer can be checked to "
                                    "hold it — nothing to advise"])
    need_gib = usage.peak_gib * (1 + MEMORY_MARGIN) + memory.CUDA_OVERHEAD_GIB
    work = usage.busy * usage.gpus * usage.peak_tflops
    of = f" of {usage.mem_gib:.0f}" if usage.mem_gib == usage.mem_gib else ""
    lines = [f"measured: {usage.gpus}× {usage.gpu} {usage.busy:.0%} busy, {usage.peak_gib:.1f}{of} GiB "
             f"peak per GPU, ${usage.usd_per_hour:,.2f}/h"]
    if of and usage.peak_gib >= MEMORY_BOUND_AT * usage.mem_gib:
        lines.append(f"memory-bound: {usage.peak_gib:.1f}{of} GiB — gradient checkpointing "
                     f"(--grad-ckpt), or FSDP over {2 * usage.gpus} GPUs of the current type")
    # the same GPUs: one instance of that many, or several instances of one offer
    counts = candidates["gpu_count"].to_numpy()
    nodes = pd.Series(usage.gpus // counts, index=candidates.index)
    same = (usage.gpus % counts == 0) & (nodes >= 1)
    price = candidates["price"] * nodes
    fits = candidates.assign(nodes=nodes, usd_per_hour=price)[
        same & (candidates["gpu_mem_gib"] >= need_gib)
        & (usage.gpus * candidates["bf16_tflops"] * BUSY_TARGET >= work) & (price < usage.usd_per_hour)]
    cheaper = (fits.sort_values(["usd_per_hour", "id"], kind="stable")
               .drop_duplicates(["gpu", "gpu_count"]).head(SHOWN).copy())
    if cheaper.empty:
        why = ("its GPUs are busy" if usage.busy >= BUSY_TARGET
               else f"none holds {need_gib:.1f} GiB per GPU and keeps up for less")
        lines.append(f"nothing cheaper delivers the same throughput ({why}) (estimate)")
        return Advice(usage, lines=lines)
    cheaper["saving"] = 1 - cheaper["usd_per_hour"] / usage.usd_per_hour
    cheaper["usd_same_work"] = cheaper["usd_per_hour"] * usage.hours
    best = cheaper.iloc[0]
    shape = f"{int(best['nodes'])}× " if best["nodes"] > 1 else ""
    lines.append(f"GPUs {usage.busy:.0%} busy, {usage.peak_gib:.0f}{of} GiB peak → {shape}{best['gpu']} "
                 f"×{int(best['gpu_count'])} would cost ~{best['saving']:.0%} less for the same steps: "
                 f"${best['usd_per_hour']:,.2f}/h ({best['id']}) (estimate: compute-bound, by peak TFLOP/s)")
    shown = cheaper[["id", "gpu", "gpu_count", "nodes", "gpu_mem_gib", "usd_per_hour", "saving",
                     "usd_same_work"]]
    return Advice(usage, offers=shown.reset_index(drop=True), lines=lines)


def candidates(pricing: str = "on-demand", catalog: str | None = None,
               residency: str | None = None) -> pd.DataFrame:
    """Every offer priced under ``pricing`` with a known peak and memory."""
    frame = catalog_offers.load_catalog(catalog)
    if residency:
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
               usd_per_gpu_hour: float | None = None, pricing: str | None = None,
               catalog: str | None = None, residency: str | None = None) -> Advice:
    """Right-size one job of a cluster from the ledger (``job``: its name or id; default the last).

    What the job pays is its GPU nodes' $/h while it ran, and what they are comes from their offer
    (bought the same way, unless ``pricing`` says otherwise); ``gpu`` and ``usd_per_gpu_hour`` say
    it where the cluster has no offer (your own machines)."""
    if usd_per_gpu_hour is not None and not (isinstance(usd_per_gpu_hour, (int, float))
                                             and 0 <= usd_per_gpu_hour < math.inf):
        raise GpugeekError(f"--usd-per-gpu-hour {usd_per_gpu_hour!r} is not a price — give what one GPU costs, $/h ≥ 0")
    rows = ledger.jobs_of(cluster_id)
    if job is not None:
        rows = [r for r in rows if job in (r["name"], r["job_id"])]
    if not rows:
        raise GpugeekError(f"no job {job!r} on this cluster — `%gpugeek cost --by job` lists them"
                           if job else "no job has run on this cluster yet — nothing to advise")
    row = rows[-1]
    samples = ledger.samples_frame(cluster_id, row["job_id"])
    ended = row["ended"] or time.time()
    hours = (ended - row["started"]) / 3600
    if samples.empty or "gpu_util" not in samples or samples["gpu_util"].isna().all():
        return right_size(Usage(gpu="", gpus=0, peak_tflops=math.nan, mem_gib=math.nan,
                                usd_per_hour=math.nan, busy=math.nan, peak_gib=math.nan,
                                hours=hours), pd.DataFrame())
    # every rank is a GPU (one whose NVML failed too); the job's row says how many there were
    gpus = max(int(row["workers"] or 0), int(samples.loc[samples["gpu_util"].notna(), "rank"].nunique()))
    offer, paid, bought = _offer_of(cluster_id, row["started"], ended, catalog)
    if gpu is not None:
        family = gpu_specs.family_of(gpu)
        spec = gpu_specs.spec(family)
        if spec is None:
            raise GpugeekError(f"--gpu {gpu}: no spec for that GPU — use a family like H100, A100, L4")
        offer = {"gpu": family, "bf16_tflops": spec.peak_tflops("bf16"), "gpu_mem_gib": spec.mem_gib}
    if offer is None:
        raise GpugeekError("this cluster has no catalog offer to compare against — say what its "
                           "GPUs are: --gpu H100 --usd-per-gpu-hour X")
    if usd_per_gpu_hour is not None:
        paid = usd_per_gpu_hour * gpus
    if paid is None:
        raise GpugeekError("what does one GPU cost here? — give --usd-per-gpu-hour X")
    usage = measured_usage(samples, gpu=offer["gpu"], gpus=gpus, peak_tflops=float(offer["bf16_tflops"]),
                           mem_gib=float(offer["gpu_mem_gib"]), usd_per_hour=paid, hours=hours)
    return right_size(usage, candidates(pricing or bought, catalog, residency))


def _offer_of(cluster_id: int, started: float, ended: float,
              catalog: str | None) -> tuple[dict | None, float | None, str]:
    """The catalog row of the GPU nodes up while the job ran, what they cost together ($/h),
    and how they were bought."""
    nodes = costs.nodes_frame(cluster_id, now=ended)
    up = nodes["ended"].fillna(ended).astype(float) > started
    nodes = nodes[up & (nodes["started"].astype(float) < ended) & (nodes["gpus"].astype(float) > 0)
                  & nodes["offer_id"].notna()]
    if nodes.empty:
        return None, None, "on-demand"
    node = nodes.iloc[-1]
    rows = catalog_offers.load_catalog(catalog)
    hits = rows[rows["id"] == node["offer_id"]]
    bought = node["pricing"] if node["pricing"] in ("on-demand", "spot", "reserved") else "on-demand"
    return (hits.iloc[0].to_dict() if not hits.empty else None), float(nodes["usd_per_hour"].sum()), bought
