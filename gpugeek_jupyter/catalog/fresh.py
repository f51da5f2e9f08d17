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
import http.client
import io
import json
import math
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .. import config
from ..errors import GpugeekError
from . import skypilot

DEFAULT_SOURCE = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v7"
# SkyPilot hosts Azure's prices only in the v6 layout (the same vms.csv columns)
OLDER_SCHEMA = {"azure": "v6"}
DEFAULT_TIMEOUT_S = 30.0
STALE_AFTER = timedelta(days=7)
UPDATE_HINT = "run %gpugeek catalog update (or gg.update_catalog())"
META = "catalog.json"
MAX_BYTES = 64 * 2**20          # SkyPilot's largest vms.csv (AWS) is a few MiB
OLD_FILE_S = 300                # older catalogs are removed after this, not at once: a reader may hold one


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


class _Failed(Exception):
    """One provider's file could not be read; the message says why, in a few words."""


def _reason(exc: BaseException) -> str:
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip()


def _download(url: str, timeout: float) -> bytes:
    """The file at ``url``; ``timeout`` bounds each wait, ten times it the whole download."""
    host = urllib.parse.urlsplit(url).netloc or url
    deadline = time.monotonic() + 10 * timeout
    request = urllib.request.Request(url, headers={"User-Agent": "gpugeek-jupyter"})
    chunks, size = [], 0
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            expected = response.headers.get("Content-Length", "")
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise _Failed(f"{url} is larger than {MAX_BYTES >> 20} MiB — not a price catalog")
                if time.monotonic() > deadline:
                    raise _Failed(f"the download from {host} took longer than {10 * timeout:g} s")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise _Failed(f"HTTP {exc.code} {exc.reason} for {url}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise _Failed(f"no answer from {host} within {timeout:g} s") from None
        raise _Failed(f"cannot reach {host} ({_reason(exc.reason)})") from None
    except TimeoutError:
        raise _Failed(f"no answer from {host} within {timeout:g} s") from None
    except http.client.IncompleteRead:
        raise _Failed(f"the download from {host} was cut short") from None
    except (http.client.HTTPException, OSError) as exc:
        raise _Failed(f"the download from {host} failed ({_reason(exc)})") from None
    if expected.isdigit() and int(expected) != size:
        raise _Failed(f"the download from {host} was cut short ({size} of {expected} bytes)")
    return b"".join(chunks)


def _local_file(folder: Path, provider: str) -> Path:
    nested = folder / provider / "vms.csv"
    if nested.is_file():
        return nested
    flat = sorted(folder.glob(f"{provider}-vms*.csv"))
    if len(flat) > 1:
        raise _Failed(f"{len(flat)} {provider}-vms*.csv files in {folder} — keep one")
    if not flat:
        raise _Failed(f"no {provider}/vms.csv or {provider}-vms*.csv in {folder}")
    return flat[0]


def _fetch(base: str, local: bool, provider: str, timeout: float) -> tuple[str, str]:
    """(where it was read, its text) for one provider's ``vms.csv``."""
    if local:
        path = _local_file(Path(base), provider)
        where = str(path)
        try:
            if path.stat().st_size > MAX_BYTES:
                raise _Failed(f"{path} is larger than {MAX_BYTES >> 20} MiB — not a price catalog")
            data = path.read_bytes()
        except OSError as exc:
            raise _Failed(f"cannot read {path} ({_reason(exc)})") from None
    else:
        if base == DEFAULT_SOURCE and provider in OLDER_SCHEMA:
            base = base.removesuffix("/v7") + "/" + OLDER_SCHEMA[provider]
        where = f"{base}/{provider}/vms.csv"
        data = _download(where, timeout)
    try:
        return where, data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Failed(f"{where} is not UTF-8 text — not a price catalog") from None


def _source(source: str | None) -> tuple[str, bool]:
    """(base, is a local folder)."""
    text = str(source).strip() if source is not None else DEFAULT_SOURCE
    if text.startswith(("http://", "https://")):
        return text.rstrip("/"), False
    if text.startswith("file://"):
        text = urllib.request.url2pathname(urllib.parse.urlsplit(text).path)
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise GpugeekError(f"catalog source {source!r} is neither an http(s) URL nor a folder")
    return str(folder.resolve()), True


def _providers(providers: str | list[str] | None) -> list[str] | None:
    if providers is None:
        return None
    names = providers.split(",") if isinstance(providers, str) else list(providers)
    names = [str(n).strip().lower() for n in names if n and str(n).strip()]
    for name in names:
        if name not in skypilot.PROVIDERS:
            raise GpugeekError(f"unknown provider {name!r} — known: {', '.join(skypilot.PROVIDERS)}")
    if not names:
        raise GpugeekError(f"no provider given — name one or more of {', '.join(skypilot.PROVIDERS)}")
    return list(dict.fromkeys(names))


def _found(folder: str) -> list[str]:
    """The providers a local folder has a file for."""
    found = []
    for provider in skypilot.PROVIDERS:
        with contextlib.suppress(_Failed):
            _local_file(Path(folder), provider)
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
    for old in [*folder.glob("gpu_offers-*.csv"), *folder.glob(".*.tmp")]:
        with contextlib.suppress(OSError):
            if old.name != name and time.time() - old.stat().st_mtime > OLD_FILE_S:
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
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            math.isfinite(timeout) and timeout > 0):
        raise GpugeekError(f"timeout {timeout!r} must be a positive number of seconds")
    base, local = _source(source)
    names = _providers(providers) or (_found(base) if local else list(skypilot.PROVIDERS))
    previous = current()
    fresh: dict[str, list[dict]] = {}
    entries: dict[str, dict] = {}
    failed: dict[str, str] = {}
    for provider in names:
        try:
            where, text = _fetch(base, local, provider, float(timeout))
            rows = skypilot.convert(provider, text, source_file=where)
            if not rows:
                raise _Failed(f"{where} lists no GPU offers")
        except _Failed as exc:
            failed[provider] = str(exc)
            continue
        except GpugeekError as exc:
            failed[provider] = str(exc).removeprefix(f"{provider}: ")
            continue
        fresh[provider] = rows
        entries[provider] = {"prices_as_of": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                             "source": where, "offers": len(rows)}
    if not fresh:
        why = "; ".join(f"{p}: {reason}" for p, reason in failed.items())
        raise GpugeekError(f"catalog not updated — {why} — the last good catalog from {previous.made} stays in use")
    try:
        catalog = _write(previous, fresh, entries)
    except OSError as exc:
        raise GpugeekError(f"cannot save the new catalog in {store()} ({_reason(exc)}) — the last good catalog "
                           f"from {previous.made} stays in use") from None
    return UpdateResult(catalog, {p: len(rows) for p, rows in fresh.items()}, failed)
