"""Offers: read the bundled catalog (plus the user's own), normalise it, filter it.

This module only reads and filters; deciding what to rent is ``plan/``'s job.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from .. import config
from ..errors import GpugeekError, NoMatchingOffers
from ..units import positive_number, whole_number
from ..vocab import Pricing
from . import fresh, gpus
from .residency import residency_mask
from .rows import read_rows

SHOWN_COLUMNS = [
    "id", "provider", "instance_type", "gpu", "variant", "gpu_count", "gpu_mem_gib", "vcpus",
    "mem_gib", "region", "zone", "price", "price_per_gpu_hour", "on_demand_price", "spot_price",
    "reserved_price", "peak_tflops",
]


def bundled_catalog_path() -> Path:
    return fresh.bundled_path()     # the one shipped; fresh.current() is the one in use


def _normalise(frame: pd.DataFrame, reserved_discount: float) -> pd.DataFrame:
    """Add family/variant, fill memory from the spec table, give each offer a stable id."""
    frame = frame.copy()
    frame["gpu"] = [gpus.family_of(n) for n in frame["gpu_name"]]
    frame["variant"] = [
        gpus.variant_of(n, t, m)
        for n, t, m in zip(frame["gpu_name"], frame["instance_type"], frame["gpu_mem_gib"], strict=True)
    ]
    specs = [gpus.spec(f, v) for f, v in zip(frame["gpu"], frame["variant"], strict=True)]
    spec_mem = pd.Series([s.mem_gib if s else math.nan for s in specs], index=frame.index)
    frame["gpu_mem_from_spec"] = frame["gpu_mem_gib"].isna() & spec_mem.notna()
    frame["gpu_mem_gib"] = frame["gpu_mem_gib"].fillna(spec_mem)
    for precision in ("bf16", "fp16", "fp32"):
        frame[f"{precision}_tflops"] = [s.peak_tflops(precision) if s else math.nan for s in specs]
    frame["peak_tflops"] = frame["bf16_tflops"]

    # id = provider/instance_type/region[/zone]. Where a host VM carries different accelerators
    # (GCP n1-standard-8 + T4 or V100), the accelerator joins the instance part to stay unique.
    place = ["provider", "instance_type", "region", "zone"]
    kinds = frame.groupby(place, dropna=False)[["gpu_name", "gpu_count"]].transform("nunique")
    shared_host = (kinds["gpu_name"] > 1) | (kinds["gpu_count"] > 1)
    instance = frame["instance_type"].where(
        ~shared_host,
        frame["instance_type"] + "+" + frame["gpu_count"].astype(int).astype(str) + "x"
        + frame["gpu_name"],
    )
    # An id is typed after `--offer`, so it is one shell-safe word: Vast's "Slovenia, SI, EU"
    # becomes "Slovenia-SI-EU" (the region column keeps the source's text).
    place = frame["region"] + ("/" + frame["zone"]).where(frame["zone"] != "", "")
    frame["id"] = frame["provider"] + "/" + instance + "/" + place.map(_id_word)

    # A user's row overrides a bundled row with the same id; repeated rows of one source merge,
    # keeping a spot price where any copy has one (AWS p4de appears twice in some zones).
    frame["_user"] = frame["source"] != "bundled"
    frame = frame.sort_values(["_user", "spot_price_hour"], na_position="first", kind="stable")
    frame = frame.drop_duplicates("id", keep="last").drop(columns="_user")

    frame["on_demand_price"] = frame["price_hour"]
    frame["spot_price"] = frame["spot_price_hour"]
    frame["reserved_price"] = frame["price_hour"] * (1 - reserved_discount)
    return frame.sort_values(["price_hour", "id"], kind="stable").reset_index(drop=True)


def _id_word(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-")


_UNSAFE = re.compile(r"[^A-Za-z0-9._/+-]+")


@lru_cache(maxsize=8)
def _load(base: tuple[str, float], paths: tuple[tuple[str, float], ...], reserved_discount: float) -> pd.DataFrame:
    rows = read_rows(Path(base[0]), bundled=True)       # the catalog in use: stored, else bundled
    for path, _mtime in paths:
        rows.extend(read_rows(Path(path), bundled=False))
    frame = pd.DataFrame(rows)
    frame["gpu_count"] = frame["gpu_count"].astype(int)
    return _normalise(frame, reserved_discount)


def load_catalog(
    extra: str | Path | Sequence[str | Path] | None = None,
    reserved_discount: float | None = None,
) -> pd.DataFrame:
    """Every offer, normalised: the catalog in use (updated, else bundled), ``catalog.paths``, ``extra``.

    Cached per set of files (and their mtimes); ``attrs`` has prices_as_of and stale_warning.
    """
    settings = config.settings()
    extras = [] if extra is None else [extra] if isinstance(extra, (str, Path)) else list(extra)
    keyed = []
    for path in (*settings.catalog_paths, *(Path(p).expanduser() for p in extras)):
        if not path.is_file():
            raise GpugeekError(f"catalog file {path} does not exist — check the path")
        keyed.append((str(path.resolve()), path.stat().st_mtime))
    discount = settings.reserved_discount if reserved_discount is None else reserved_discount
    if not 0 <= discount < 1:
        raise GpugeekError(f"reserved discount {discount} is not a fraction in [0, 1) — give one, like 0.3 for 30 %")
    base = fresh.current()      # the newest updated catalog, else the bundled one
    return base.stamp(_load(base.key(), tuple(keyed), float(discount)))


PRICE_COLUMNS = {Pricing.ON_DEMAND: "on_demand_price", Pricing.SPOT: "spot_price",
                 Pricing.RESERVED: "reserved_price"}


def price_column(pricing: str) -> str:
    """The catalog column holding $/h under ``pricing`` (one line if it is not a pricing)."""
    return PRICE_COLUMNS[Pricing.parse(pricing, "--pricing")]


def _split(names: str | Iterable[str] | None) -> list[str]:
    if names is None:
        return []
    if isinstance(names, str):
        names = names.split(",")
    return [n.strip() for n in names if n and n.strip()]


def gpu_mask(catalog: pd.DataFrame, names: str | Iterable[str] | None) -> pd.Series:
    """Rows whose GPU is one of ``names``: a family (``H100``) or a provider's spelling (``H100-SXM``)."""
    wanted = _split(names)
    if not wanted:
        return pd.Series(True, index=catalog.index)
    families = {f.upper(): f for f in catalog["gpu"].unique()}
    raw = {n.upper() for n in catalog["gpu_name"].unique()}
    mask = pd.Series(False, index=catalog.index)
    for name in wanted:
        key, family = name.upper(), gpus.family_of(name)
        suffix = key[len(family):].lstrip("-_ ") if key.startswith(family.upper()) else None
        variant = gpus.variant_named(family, suffix) if suffix else None
        if key in families:
            mask |= catalog["gpu"] == families[key]
        elif variant is not None:  # H100-PCIe, A100-80GB, V100-32GB: one variant of a family
            mask |= (catalog["gpu"] == family) & (catalog["variant"] == variant)
        elif key in raw:
            mask |= catalog["gpu_name"].str.upper() == key
        else:
            near = gpus.suggest(name, sorted(set(catalog["gpu"]) | set(catalog["gpu_name"])))
            hint = f" — did you mean {', '.join(near)}?" if near else " — `%gpugeek offers` lists the GPUs"
            raise GpugeekError(f"unknown GPU {name!r}{hint}")
    return mask


def parse_count_filter(count: int | str | None) -> tuple[int, bool] | None:
    """``8`` → exactly 8 GPUs; ``'8+'`` → at least 8."""
    if count is None or count == "":
        return None
    text = str(count).strip()
    at_least = text.endswith("+")
    digits = text[:-1] if at_least else text
    try:
        if not digits.isdigit():
            raise ValueError
        value = int(digits)
    except ValueError:
        raise GpugeekError(f"--count {text!r} is not a whole number — give 8, or 8+ for at least 8") from None
    if value < 1:
        raise GpugeekError(f"--count {text!r} is below 1 — give 8, or 8+ for at least 8")
    return value, at_least


def with_pricing(catalog: pd.DataFrame, pricing: str) -> pd.DataFrame:
    """Add ``price`` (effective $/h under ``pricing``) and ``price_per_gpu_hour``; drop unpriced rows."""
    column = price_column(pricing)
    frame = catalog[catalog[column].notna()].copy()
    frame["pricing"] = str(pricing)
    frame["price"] = frame[column]
    frame["price_per_gpu_hour"] = frame["price"] / frame["gpu_count"]
    return frame


def find_offers(
    gpu: str | Iterable[str] | None = None,
    count: int | str | None = None,
    min_gpu_mem: float | None = None,
    provider: str | Iterable[str] | None = None,
    region: str | None = None,
    max_price: float | None = None,
    pricing: str = "on-demand",
    top: int | None = None,
    catalog: str | Path | Sequence[str | Path] | None = None,
    residency: str | None = None,
) -> pd.DataFrame:
    """Offers that meet every filter, cheapest first by ``price`` (the $/h under ``pricing``).

    ``gpu`` takes families (``H100``) or providers' spellings (``H100-SXM``), comma-separated;
    ``count`` is exact (``8``) or a minimum (``'8+'``); ``region`` is a glob (``us-*``);
    ``residency`` (``EU``, ``US``, ``DE`` …) keeps offers whose region is known to be there.
    Nothing matching raises :class:`NoMatchingOffers`, whose one line names the nearest offers.
    """
    top = whole_number(top, "--top")
    max_price = positive_number(max_price, "--max-price")
    min_gpu_mem = positive_number(min_gpu_mem, "--min-gpu-mem")
    pricing = Pricing.parse(pricing, "--pricing").value   # early, and a plain string from here
    everything = load_catalog(catalog)

    masks = {
        "gpu": gpu_mask(everything, gpu),
        "count": _count_mask(everything, count),
        "min_gpu_mem": everything["gpu_mem_gib"] >= min_gpu_mem if min_gpu_mem else None,
        "provider": provider_mask(everything, provider),
        "region": region_mask(everything, region),
        "residency": None,
    }
    unknown: list[str] = []
    if residency:
        masks["residency"], unknown = residency_mask(everything, residency)
    masks = {k: v for k, v in masks.items() if v is not None}
    keep = pd.Series(True, index=everything.index)
    for mask in masks.values():
        keep &= mask
    frame = with_pricing(everything[keep], pricing)
    if max_price is not None:
        frame = frame[frame["price"] <= max_price]
    if frame.empty:
        raise _no_match(everything, masks, pricing, max_price, locals_for_message={
            "gpu": gpu, "count": count, "min_gpu_mem": min_gpu_mem, "provider": provider,
            "region": region, "max_price": max_price, "pricing": pricing, "residency": residency,
        })
    frame = frame.sort_values(["price", "price_per_gpu_hour", "id"], kind="stable")
    if top is not None:
        frame = frame.head(top)
    shown = frame[[*SHOWN_COLUMNS, "pricing"]].reset_index(drop=True)
    shown.attrs.update(pricing=str(pricing), **fresh.current().attrs(set(shown["provider"])))  # + prices' date
    if unknown:
        shown.attrs["unknown_regions"] = unknown
        shown.attrs["residency_note"] = unknown_regions_note(residency, unknown)
    if pricing == "reserved":
        discount = 1 - (frame["reserved_price"] / frame["on_demand_price"]).iloc[0]
        shown.attrs["note"] = (
            f"reserved prices are estimates: on-demand × (1 − {discount:.0%}); "
            "set catalog.reserved_discount in config.toml"
        )
    return shown


def unknown_regions_note(residency: str, unknown: list[str]) -> str:
    """One line: which regions a residency filter left out because nobody knows where they are."""
    shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    return f"--residency {residency}: left out {len(unknown)} region(s) of unknown location ({shown})"


def _count_mask(catalog: pd.DataFrame, count: int | str | None) -> pd.Series | None:
    parsed = parse_count_filter(count)
    if parsed is None:
        return None
    value, at_least = parsed
    return catalog["gpu_count"] >= value if at_least else catalog["gpu_count"] == value


def provider_mask(catalog: pd.DataFrame, provider: str | Iterable[str] | None) -> pd.Series | None:
    names = [n.lower() for n in _split(provider)]
    if not names:
        return None
    known = sorted(catalog["provider"].unique())
    for name in names:
        if name not in known:
            near = gpus.suggest(name, known)
            hint = f" — did you mean {', '.join(near)}?" if near else f" — name one of {', '.join(known)}"
            raise GpugeekError(f"unknown provider {name!r}{hint}")
    return catalog["provider"].isin(names)


def region_mask(catalog: pd.DataFrame, pattern: str | None) -> pd.Series | None:
    if not pattern:
        return None
    pattern = pattern.lower()
    if not any(ch in pattern for ch in "*?["):
        pattern = f"*{pattern}*"
    regions = catalog["region"].str.lower()
    zones = catalog["zone"].str.lower()
    return pd.Series(
        [fnmatch.fnmatchcase(r, pattern) or fnmatch.fnmatchcase(z, pattern)
         for r, z in zip(regions, zones, strict=True)],
        index=catalog.index,
    )


def _describe(filters: dict) -> str:
    parts = []
    for key, value in filters.items():
        if value is None or value == "" or (key == "pricing" and value == "on-demand"):
            continue
        flag = "--" + key.replace("_", "-")
        parts.append(f"{flag} {value}")
    return " ".join(parts) or "(no filters)"


def _no_match(
    catalog: pd.DataFrame,
    masks: dict[str, pd.Series],
    pricing: str,
    max_price: float | None,
    locals_for_message: dict,
) -> NoMatchingOffers:
    """One line: what matched nothing, and the nearest offers when one filter is relaxed."""
    hints: list[str] = []

    def without(*names: str) -> pd.DataFrame:
        keep = pd.Series(True, index=catalog.index)
        for key, mask in masks.items():
            if key not in names:
                keep &= mask
        return catalog[keep]

    if "count" in masks:
        rest = with_pricing(without("count"), pricing)
        counts = sorted(rest["gpu_count"].unique())
        if counts:
            hints.append("other counts: " + ", ".join(f"×{c}" for c in counts))
    if "gpu" in masks:
        rest = with_pricing(without("gpu"), pricing)
        if max_price is not None:
            rest = rest[rest["price"] <= max_price]
        wanted = catalog.loc[masks["gpu"], ["bf16_tflops", "gpu_mem_gib"]].median()
        if not rest.empty and wanted.notna().all():
            # "Similar" = closest in peak TFLOP/s and memory (log scale), then cheapest.
            distance = (np.log(rest["bf16_tflops"] / wanted["bf16_tflops"]).abs()
                        + np.log(rest["gpu_mem_gib"] / wanted["gpu_mem_gib"]).abs())
            rest = rest.assign(_d=distance.round(1)).sort_values(["_d", "price"])
            best = rest.drop_duplicates("gpu").head(3)
            hints.append(
                "similar GPUs: "
                + ", ".join(f"{g}×{c} ${p:.2f}/h" for g, c, p in
                            zip(best["gpu"], best["gpu_count"], best["price"], strict=True))
            )
    if max_price is not None:
        rest = with_pricing(without(), pricing)
        if not rest.empty:
            cheapest = rest.sort_values("price").iloc[0]
            hints.append(f"cheapest without --max-price: {cheapest['id']} ${cheapest['price']:.2f}/h")
    if pricing == "spot":
        on_demand = without()
        if not on_demand.empty and on_demand["spot_price"].isna().all():
            hints.append(f"{len(on_demand)} on-demand offer(s) match but none has a spot price")
    message = f"no offers match {_describe(locals_for_message)}"
    message += " — " + ("; ".join(hints) if hints else "loosen the filters: `%gpugeek offers` with fewer of them "
                                                       "lists more")
    return NoMatchingOffers(message, hints)
