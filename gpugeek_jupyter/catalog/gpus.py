"""GPU names and public spec facts.

Clouds spell one GPU many ways (``H100-SXM``, ``H100-MEGA``, ``gpu_1x_h100_pcie``). We reduce each
to a *family* (what a user filters by: ``H100``) and a *variant* (``SXM``, ``PCIe``, ``80GB``) that
selects the row of ``gpu_specs.csv``: memory per GPU and peak dense TFLOP/s from vendor datasheets.
"""

from __future__ import annotations

import csv
import difflib
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

# Raw catalog names whose family is not simply the text before the first '-'.
_ALIASES = {
    "RADEON MI25": "MI25",
    "RADEON PRO V520": "V520",
    "T4G": "T4",
    "RTX6000-ADA": "RTX6000-Ada",
    "RTX4000-ADA": "RTX4000-Ada",
    "RTXA6000": "A6000",
}


@dataclass(frozen=True)
class GpuSpec:
    family: str
    variant: str
    mem_gib: float
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float

    def peak_tflops(self, precision: str) -> float:
        """Peak dense TFLOP/s for a training precision; bf16 falls back to fp16 where unsupported."""
        if precision == "bf16" and not math.isnan(self.bf16_tflops):
            return self.bf16_tflops
        if precision in ("bf16", "fp16") and not math.isnan(self.fp16_tflops):
            return self.fp16_tflops
        return self.fp32_tflops


def _num(text: str) -> float:
    return float(text) if text.strip() else math.nan


@lru_cache(maxsize=1)
def spec_table() -> dict[tuple[str, str], GpuSpec]:
    """``(family, variant) → GpuSpec`` from the bundled table."""
    table = {}
    with resources.files(__package__).joinpath("gpu_specs.csv").open() as f:
        for row in csv.DictReader(f):
            spec = GpuSpec(
                family=row["family"],
                variant=row["variant"],
                mem_gib=_num(row["mem_gib"]),
                bf16_tflops=_num(row["bf16_tflops"]),
                fp16_tflops=_num(row["fp16_tflops"]),
                fp32_tflops=_num(row["fp32_tflops"]),
            )
            table[(spec.family, spec.variant)] = spec
    return table


def families() -> list[str]:
    return sorted({family for family, _ in spec_table()})


def family_of(name: str) -> str:
    """``'H100-SXM'`` → ``'H100'``, ``'Radeon MI25'`` → ``'MI25'``, ``'a100'`` → ``'A100'``."""
    key = name.strip().upper()
    if key in _ALIASES:
        return _ALIASES[key]
    known = {f.upper(): f for f in families()}
    if key in known:
        return known[key]
    head = key.split("-")[0]
    return known.get(head, name.strip())


def variant_of(name: str, instance_type: str = "", mem_gib: float = math.nan) -> str:
    """The spec-table variant of one catalog row, from its GPU name, instance type and memory."""
    family = family_of(name)
    text = f"{name} {instance_type}".lower()
    if family == "H100":
        if "pcie" in text:
            return "PCIe"
        if "nvl" in text or (not math.isnan(mem_gib) and mem_gib > 90):
            return "NVL"
        return ""
    if family == "A100" and ("80gb" in text or mem_gib >= 70):
        return "80GB"
    if family == "V100" and ("32gb" in text or mem_gib >= 30):
        return "32GB"
    return ""


# What people append to a family name, mapped to the spec table's variant ("" = the default row).
_VARIANT_WORDS = {"SXM": "", "SXM4": "", "SXM5": "", "40GB": "", "16GB": ""}


def variant_named(family: str, suffix: str) -> str | None:
    """``('H100', 'pcie')`` → ``'PCIe'``; ``('A100', '40GB')`` → ``''``; unknown → ``None``."""
    variants = {v.upper(): v for f, v in spec_table() if f == family and v}
    key = suffix.upper()
    if key in variants:
        return variants[key]
    if key in _VARIANT_WORDS and (family, "") in spec_table():
        return _VARIANT_WORDS[key]
    return None


def spec(family: str, variant: str = "") -> GpuSpec | None:
    table = spec_table()
    return table.get((family, variant)) or table.get((family, ""))


def suggest(name: str, candidates: list[str] | None = None, n: int = 3) -> list[str]:
    """Nearest known names, for 'did you mean …' lines."""
    pool = candidates if candidates is not None else families()
    upper = {c.upper(): c for c in pool}
    close = difflib.get_close_matches(name.upper(), list(upper), n=n, cutoff=0.5)
    return [upper[c] for c in close]
