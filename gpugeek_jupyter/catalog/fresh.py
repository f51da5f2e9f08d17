"""Fresh prices: fetch SkyPilot's hosted price catalogs and keep the last good catalog.

``update()`` converts each provider's ``vms.csv`` (``skypilot.convert``) and writes a new catalog
under ``$GPUGEEK_HOME/catalog/``: the updated providers' rows plus every other provider's rows from
the catalog in use (the stored one, else the bundled one). Each file is written atomically (a temp
file in the same folder, fsync, ``os.replace``) and ``catalog.json`` — replaced last — names the CSV
in use with each provider's price date (UTC) and source. A download cut short, a 404, a timeout or
no network never touch the catalog in use: the update says so in one line and changes nothing.

``source`` is SkyPilot's hosted folder by default, or another base URL laid out the same way
(``<base>/<provider>/vms.csv``), or a local folder holding ``<provider>/vms.csv`` or one
``<provider>-vms*.csv`` per provider (like SkyPilot's sample files).
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .. import config
from ..errors import GpugeekError
from ..units import number
from . import fetch, skypilot
from .rows import parse_row

DEFAULT_TIMEOUT_S = 30.0
STALE_AFTER = timedelta(days=7)
UPDATE_HINT = "run %gpugeek catalog update (or gg.update_catalog())"
META = "catalog.json"


@dataclass(frozen=True)
class CatalogInfo:
    """The catalog in use: its CSV, when it was made, and each provider's price date and source."""

    path: Path
    made: str                   # ISO date the catalog was written (the bundled one: its price date)
    providers: dict[str, dict]  # provider → {"prices_as_of": ISO date or UTC time, "source": …}
    bundled: bool

    def dates(self, providers: Iterable[str] | None = None) -> dict[str, datetime]:
        """Each provider's price date (of ``providers`` only, when given)."""
        wanted = None if providers is None else set(providers)
        return {p: _when(entry["prices_as_of"]) for p, entry in self.providers.items()
                if wanted is None or p in wanted}

    @property
    def prices_as_of(self) -> str:
        """The oldest provider's price date: the catalog is as fresh as its oldest part."""
        return self.as_of() or self.made

    def as_of(self, providers: Iterable[str] | None = None) -> str | None:
        """The oldest price date (ISO) among ``providers``; None when none of them is dated here."""
        dates = self.dates(providers)
        return min(dates.values()).date().isoformat() if dates else None

    def stale_warning(self, providers: Iterable[str] | None = None, now: datetime | None = None) -> str | None:
        """One line when prices (of ``providers``) are over 7 days old, naming the update command."""
        now = now or datetime.now(timezone.utc)
        old = {p: d for p, d in self.dates(providers).items() if now - d > STALE_AFTER}
        if not old:
            return None
        oldest = min(old.values())
        which = "" if set(old) == set(self.providers) else f" for {', '.join(sorted(old))}"
        return (f"catalog prices{which} are {(now - oldest).days} days old (from {oldest.date().isoformat()})"
                f" — {UPDATE_HINT}")

    def attrs(self, providers: Iterable[str] | None = None) -> dict[str, str | None]:
        """What a frame of offers (from ``providers``) carries: ``prices_as_of`` and
        ``stale_warning`` (None when fresh)."""
        return {"prices_as_of": self.as_of(providers), "stale_warning": self.stale_warning(providers)}

    def __str__(self) -> str:
        kind = "bundled catalog" if self.bundled else f"catalog updated {self.made}"
        line = f"{kind}, prices as of {self.prices_as_of}: {self.path}"
        return f"{line} — {warning}" if (warning := self.stale_warning()) else line

    def key(self) -> tuple[str, float]:
        """(path, mtime): what a cache of this catalog is keyed on, so an update is noticed."""
        return str(self.path), self.path.stat().st_mtime

    def stamp(self, frame):
        """``frame`` (anything with ``attrs``, like a DataFrame) with this catalog's date set."""
        frame.attrs.update(self.attrs())
        return frame


def _when(text: str) -> datetime:
    """An ISO date (midnight UTC) or an ISO time (UTC unless it says otherwise)."""
    if not isinstance(text, str):
        raise ValueError(f"not a date: {text!r}")
    moment = datetime.fromisoformat(text) if "T" in text else datetime.fromisoformat(text + "T00:00:00")
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def store() -> Path:
    """Where updated catalogs are kept: ``$GPUGEEK_HOME/catalog/``."""
    return config.home() / "catalog"


def bundled_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("data", "gpu_offers.csv")))


def _info(folder: Path, meta: dict, bundled: bool) -> CatalogInfo:
    name = meta["file"]
    if not isinstance(name, str) or Path(name).name != name or not (folder / name).is_file():
        raise ValueError(f"catalog file {name!r} is missing")
    providers = meta["providers"]
    if not isinstance(providers, dict) or not providers:
        raise ValueError("no providers")
    info = CatalogInfo(folder / name, _when(meta.get("written") or meta["prices_as_of"]).date().isoformat(),
                       {p: dict(e) for p, e in providers.items()}, bundled)
    info.dates()                  # every date must read
    return info


@lru_cache(maxsize=1)
def bundled() -> CatalogInfo:
    """The catalog shipped with the package; its dates come from ``data/gpu_offers.json``."""
    path = bundled_path()
    return _info(path.parent, json.loads(path.with_suffix(".json").read_text(encoding="utf-8")), bundled=True)


def current() -> CatalogInfo:
    """The catalog in use: the newest stored one when it is whole, else the bundled one."""
    folder = store()
    try:
        return _info(folder, json.loads((folder / META).read_text(encoding="utf-8")), bundled=False)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return bundled()


def _providers(providers: str | list[str] | None) -> list[str] | None:
    if providers is None:
        return None
    names = providers.split(",") if isinstance(providers, str) else list(providers)
    names = [str(n).strip().lower() for n in names if n and str(n).strip()]
    for name in names:
        if name not in skypilot.PROVIDERS:
            raise GpugeekError(f"unknown provider {name!r} — name one of {', '.join(skypilot.PROVIDERS)}")
    if not names:
        raise GpugeekError(f"no provider given — name one or more of {', '.join(skypilot.PROVIDERS)}")
    return list(dict.fromkeys(names))


def _found(folder: str) -> list[str]:
    """The providers a local folder has a file for."""
    found = []
    for provider in skypilot.PROVIDERS:
        with contextlib.suppress(fetch.Failed):
            fetch.local_file(Path(folder), provider)
            found.append(provider)
    if not found:
        raise GpugeekError(f"no <provider>/vms.csv or <provider>-vms*.csv in {folder} — "
                           f"providers are {', '.join(skypilot.PROVIDERS)}")
    return found


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: temp file in the same folder, fsync, rename."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):     # make the rename itself durable (POSIX)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _loadable(row: dict) -> bool:
    """Whether the catalog's loader accepts the row: one it would refuse must never reach the
    catalog in use, where it would stop every command."""
    try:
        parse_row(row, Path(META), 0, bundled=True)
    except (GpugeekError, KeyError, TypeError, AttributeError):
        return False
    return True


def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


def _write(previous: CatalogInfo, fresh: dict[str, list[dict]], entries: dict[str, dict]) -> CatalogInfo:
    """The new catalog: fresh providers' rows, every other provider's rows as they were."""
    folder = store()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept = [row for row in _rows(previous.path) if (row.get("provider") or "").strip().lower() not in fresh]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=skypilot.COLUMNS, restval="", extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows(kept + [row for rows in fresh.values() for row in rows])
    now = datetime.now(timezone.utc)
    name = f"gpu_offers-{now:%Y%m%dT%H%M%S%fZ}.csv"
    _atomic_write(folder / name, text.getvalue().encode("utf-8"))
    meta = {"file": name, "written": now.isoformat(timespec="seconds"),
            "providers": {**previous.providers, **entries}}
    _atomic_write(folder / META, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    # the catalog current a moment ago stays until the next update (a reader may hold it open)
    for old in {*folder.glob("gpu_offers-*.csv"), *folder.glob(".*.tmp")} - {folder / name, previous.path}:
        with contextlib.suppress(OSError):
            old.unlink()
    return current()


@dataclass(frozen=True)
class UpdateResult:
    """What ``update()`` did: the catalog now in use, the providers updated (offers each) and
    those that were not (why; their last good prices stay)."""

    catalog: CatalogInfo
    updated: dict[str, int]
    failed: dict[str, str]

    def __str__(self) -> str:
        done = ", ".join(f"{p} ({n} offers)" for p, n in self.updated.items())
        line = f"prices updated for {done} — catalog of {self.catalog.made} in use: {self.catalog.path}"
        if self.failed:
            old = self.catalog.providers
            line += "; not updated: " + "; ".join(
                f"{p}: {why} — its prices from {_when(old[p]['prices_as_of']).date().isoformat()} stay in use"
                if p in old else f"{p}: {why}" for p, why in self.failed.items())
        return line

    __repr__ = __str__

    def _repr_html_(self) -> str:
        cells = []
        for provider, entry in self.catalog.providers.items():
            state = ("updated" if provider in self.updated
                     else f"not updated: {self.failed[provider]}" if provider in self.failed else "kept")
            cells.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
                provider, _when(entry["prices_as_of"]).strftime("%Y-%m-%d %H:%M UTC"), entry.get("source", ""),
                state)) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("provider", "prices as of", "source", ""))
        return (f"<div class='gpugeek-catalog-update'><p>{html.escape(str(self))}</p>"
                f"<table><tr>{head}</tr>{''.join(cells)}</table></div>")


def update(source: str | None = None, providers: str | list[str] | None = None,
           timeout: float = DEFAULT_TIMEOUT_S) -> UpdateResult:
    """Fetch fresh prices and make them the catalog in use; providers not updated keep theirs.

    ``source``: SkyPilot's hosted catalogs by default, another base URL, or a local folder (see the
    module's docstring). ``providers``: all seven by default (for a folder: those it has files for).
    ``timeout``: seconds to wait for each answer. When no provider could be updated this raises
    :class:`GpugeekError` in one line and the last good catalog stays in use.
    """
    number(timeout, "timeout", above=0, hint=" (seconds)")
    base, local = fetch.source_of(source)
    names = _providers(providers) or (_found(base) if local else list(skypilot.PROVIDERS))
    previous = current()
    fresh: dict[str, list[dict]] = {}
    entries: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for provider in names:
        try:
            where, text, modified = fetch.fetch(base, local, provider, float(timeout))
            rows = [row for row in skypilot.convert(provider, text, source_file=where) if _loadable(row)]
            if not rows:
                raise fetch.Failed(f"{where} lists no GPU offers")
        except fetch.Failed as exc:
            failed[provider] = str(exc)
            continue
        except GpugeekError as exc:
            failed[provider] = str(exc).removeprefix(f"{provider}: ")
            continue
        fresh[provider] = rows
        # the prices are as old as the file: its own time where known (a mirror may be weeks old),
        # else the fetch (SkyPilot's hosted files are rebuilt from the price APIs every few hours)
        now = datetime.now(timezone.utc)
        entries[provider] = {"prices_as_of": min(modified or now, now).isoformat(timespec="seconds"),
                             "fetched": now.isoformat(timespec="seconds"),
                             "dated_by": "fetch time" if modified is None else
                             "file time" if local else "Last-Modified",
                             "source": where, "offers": len(rows)}
    if not fresh:
        why = "; ".join(f"{p}: {reason}" for p, reason in failed.items())
        raise GpugeekError(f"catalog not updated — {why} — the last good catalog from {previous.made} stays in use")
    try:
        catalog = _write(previous, fresh, entries)
    except OSError as exc:
        raise GpugeekError(f"cannot save the new catalog in {store()} ({fetch.reason(exc)}) — the last good catalog "
                           f"from {previous.made} stays in use") from None
    return UpdateResult(catalog, {p: len(rows) for p, rows in fresh.items()}, failed)
