"""What a spot run is expected to cost once preemptions are priced in.

A spot price is not a spot cost: each preemption throws away the work since the last checkpoint
and pays a restart. With preemptions arriving as a Poisson process at rate λ per hour while the
run is up, work split into segments of ``τ`` hours each followed by a checkpoint of ``C`` hours,
and a restart of ``R`` hours after each preemption (no preemption during a restart), one segment
of length ``s = τ + C`` takes on average

    E[s] = (e^{λs} − 1) · (1/λ + R)

hours of wall time (a geometric number of failed tries, each lasting the time to the preemption
plus ``R``). A run of ``W`` hours of work is ``⌊W/τ⌋`` full segments and one shorter one. The
interval that minimises this solves ``(1 − λτ) e^{λ(τ+C)} = 1``; to first order that is
Young's ``√(2 · C · MTBP)`` (mean time between preemptions, ``1/λ``; ``young_daly``), which the
root refines where preemptions are frequent.

Every figure here is an estimate: the rates are published buckets or a user's own figure.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

DEFAULT_RESTART_MINUTES = 10.0     # re-provision a node and reload the checkpoint (assumed)
CHECKPOINT_GIB_PER_S = 1.0         # checkpoint write speed when none is given (assumed)
DEFAULT_CHECKPOINT_SECONDS = 60.0  # when the checkpoint's size is not known either (assumed)


@dataclass(frozen=True)
class Rate:
    """Preemptions per hour of one node, and where that figure comes from."""

    per_hour: float
    basis: str
    rank: int = 0      # which wins: the user's over the shipped, a GPU family's over a provider's


def _rate_from_fraction(fraction: float, window_hours: float) -> float:
    """A fraction of instances interrupted within a window → a Poisson rate per hour."""
    return -math.log1p(-fraction) / window_hours


@lru_cache(maxsize=1)
def bundled_rates() -> dict[tuple[str, str], Rate]:
    """``(provider, gpu family or '*') → Rate`` from the table shipped with its sources."""
    path = resources.files(__package__).joinpath("data", "preemption.csv")
    if not path.is_file():
        return {}
    rates = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            per_hour = _rate_from_fraction(float(row["interrupted_fraction"]), float(row["window_hours"]))
            gpu = row["gpu"].strip()
            rates[(row["provider"].strip().lower(), gpu)] = Rate(
                per_hour, f"{row['basis'].strip()} ({row['source'].strip()})", int(gpu != "*"))
    return rates


def rate_table(overrides: dict[str, float] | None = None) -> dict[tuple[str, str], Rate]:
    """The shipped rates with the user's ``[spot] preemptions_per_hour`` laid over them
    (keys ``"aws/H100"`` for one GPU family, ``"aws"`` for the whole provider)."""
    table = dict(bundled_rates())
    for key, per_hour in (overrides or {}).items():
        provider, _, gpu = key.partition("/")
        gpu = gpu.strip() or "*"
        table[(provider.strip().lower(), gpu)] = Rate(float(per_hour), "config.toml", 2 + (gpu != "*"))
    return table


def gpu_key(family: str, variant: str) -> str:
    """How the rate table names a GPU: the family (``H100``, the SXM part) or family-variant
    (``A100-80GB``, ``H100-PCIe``), as ``%gpugeek offers`` spells it."""
    return f"{family}-{variant}" if variant else family


def node_rates(providers: np.ndarray, gpus: np.ndarray, table: dict[tuple[str, str], Rate]) -> np.ndarray:
    """Per-node preemptions per hour for each offer (its GPU's row — ``gpus`` as ``gpu_key``
    spells them — else its provider's ``*`` row, else NaN: unknown, never guessed)."""
    out = np.full(len(providers), np.nan)
    for (provider, gpu), rate in sorted(table.items(), key=lambda item: item[1].rank):
        match = providers == provider
        if gpu != "*":
            match &= gpus == gpu
        out[match] = rate.per_hour
    return out


def unmatched(table: dict[tuple[str, str], Rate], providers: np.ndarray, gpus: np.ndarray) -> list[str]:
    """The user's keys (``config.toml``) that name no offer: a typo must not pass in silence."""
    known = set(zip(providers, gpus, strict=True))
    names = {provider for provider, _gpu in known}
    return [f"{p}/{g}" if g != "*" else p for (p, g), rate in table.items() if rate.rank >= 2
            and (p not in names if g == "*" else (p, g) not in known)]


def _segment_hours(rate, length, restart):
    """Expected wall hours to get one segment of ``length`` hours done (``length`` when λ = 0)."""
    safe = np.where(rate > 0, rate, 1.0)
    tries = np.expm1(rate * length)
    return np.where(rate > 0, tries * (1 / safe + restart), length)


def expected_hours(work, rate, interval, checkpoint, restart):
    """Expected wall hours for ``work`` hours of training (all arguments in hours; numpy-broadcast).

    ``rate`` is the whole run's preemptions per hour: any node lost stops every rank, so a
    cluster's rate is its nodes' rates summed.
    """
    work, rate, interval = np.asarray(work, float), np.asarray(rate, float), np.asarray(interval, float)
    full = np.floor(work / interval)
    rest = work - full * interval
    last = np.where(rest > 1e-12, _segment_hours(rate, rest + checkpoint, restart), 0.0)
    hours = full * _segment_hours(rate, interval + checkpoint, restart) + last
    return np.where(np.isnan(rate), np.nan, hours)     # an unknown rate stays unknown


def best_interval(rate, checkpoint):
    """Hours of work between checkpoints that minimise the expected wall time per hour of work:
    the root of ``(1 − x) e^x = e^{−λC}`` with ``x = λτ`` (Newton from Young's first-order value).
    Infinite where ``rate`` is 0: nothing to insure against."""
    rate, checkpoint = np.asarray(rate, float), np.asarray(checkpoint, float)
    safe = np.where(rate > 0, rate, 1.0)
    target = np.exp(-safe * checkpoint)
    x = np.clip(np.sqrt(2 * safe * checkpoint), 1e-9, 0.999)
    for _ in range(30):
        g = (1 - x) * np.exp(x) - target
        x = np.clip(x + g / (x * np.exp(x)), 1e-12, 1 - 1e-12)
    return np.where(np.isnan(rate), np.nan, np.where(rate > 0, x / safe, np.inf))


def young_daly(rate, checkpoint):
    """Young's first-order optimum, √(2 · C · MTBP), the rule of thumb the exact root refines."""
    rate = np.asarray(rate, float)
    with np.errstate(divide="ignore"):
        return np.sqrt(2 * np.asarray(checkpoint, float) / rate)


def checkpoint_hours(state_gib: float, seconds: float | None = None) -> tuple[float, str]:
    """How long one checkpoint takes, and the assumption behind it."""
    if seconds is not None:
        return seconds / 3600, f"a checkpoint takes {seconds:g} s (given)"
    if state_gib and math.isfinite(state_gib):
        seconds = max(state_gib / CHECKPOINT_GIB_PER_S, 1.0)
        return seconds / 3600, (f"a checkpoint writes the {state_gib:.1f} GiB of weights and "
                                f"optimizer state at {CHECKPOINT_GIB_PER_S:g} GiB/s, ~{seconds:.0f} s "
                                "(assumed; set --checkpoint-seconds)")
    return DEFAULT_CHECKPOINT_SECONDS / 3600, (
        f"a checkpoint takes {DEFAULT_CHECKPOINT_SECONDS:g} s (assumed; set --checkpoint-seconds)")
