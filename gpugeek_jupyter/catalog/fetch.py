"""Reading one provider's price file: over HTTP(S) with bounded waits and size, or from a folder.

Every way it can fail (a 404, a timeout, a cut-short body, a file that is not text) is a
``Failed`` whose message says why in a few words; ``fresh.update`` turns it into its one line.
"""

from __future__ import annotations

import email.utils
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from ..errors import GpugeekError

DEFAULT_SOURCE = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v7"
# SkyPilot hosts Azure's prices only in the v6 layout (the same vms.csv columns)
OLDER_SCHEMA = {"azure": "v6"}
MAX_BYTES = 64 * 2**20          # SkyPilot's largest vms.csv (AWS) is a few MiB


class Failed(Exception):
    """One provider's file could not be read; the message says why, in a few words."""


def reason(exc: BaseException) -> str:
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).strip()


def download(url: str, timeout: float) -> tuple[bytes, datetime | None]:
    """The file at ``url`` and its ``Last-Modified`` time if the server says; ``timeout`` bounds
    each wait, ten times it the whole download."""
    try:
        host = urllib.parse.urlsplit(url).netloc or url
    except ValueError:
        raise Failed(f"{url} is not a valid URL") from None
    deadline = time.monotonic() + 10 * timeout
    request = urllib.request.Request(url, headers={"User-Agent": "gpugeek-jupyter"})
    chunks, size = [], 0
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            expected = response.headers.get("Content-Length", "")
            modified = http_time(response.headers.get("Last-Modified"))
            while chunk := response.read(1 << 16):
                size += len(chunk)
                if size > MAX_BYTES:
                    raise Failed(f"{url} is larger than {MAX_BYTES >> 20} MiB — not a price catalog")
                if time.monotonic() > deadline:
                    raise Failed(f"the download from {host} took longer than {10 * timeout:g} s")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise Failed(f"HTTP {exc.code} {exc.reason} for {url}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise Failed(f"no answer from {host} within {timeout:g} s") from None
        raise Failed(f"cannot reach {host} ({reason(exc.reason)})") from None
    except TimeoutError:
        raise Failed(f"no answer from {host} within {timeout:g} s") from None
    except http.client.IncompleteRead:
        raise Failed(f"the download from {host} was cut short") from None
    except (http.client.HTTPException, OSError) as exc:
        raise Failed(f"the download from {host} failed ({reason(exc)})") from None
    except ValueError as exc:          # a URL urllib cannot even send
        raise Failed(f"{url} is not a valid URL ({exc})") from None
    if expected.isdigit() and int(expected) != size:
        raise Failed(f"the download from {host} was cut short ({size} of {expected} bytes)")
    return b"".join(chunks), modified


def http_time(text: str | None) -> datetime | None:
    try:
        return email.utils.parsedate_to_datetime(text).astimezone(timezone.utc) if text else None
    except (TypeError, ValueError):
        return None


def local_file(folder: Path, provider: str) -> Path:
    nested = folder / provider / "vms.csv"
    if nested.is_file():
        return nested
    flat = sorted(folder.glob(f"{provider}-vms*.csv"))
    if len(flat) > 1:
        raise Failed(f"{len(flat)} {provider}-vms*.csv files in {folder} — keep one")
    if not flat:
        raise Failed(f"no {provider}/vms.csv or {provider}-vms*.csv in {folder}")
    return flat[0]


def fetch(base: str, local: bool, provider: str, timeout: float) -> tuple[str, str, datetime | None]:
    """(where it was read, its text, when it was last changed if that is known) for one
    provider's ``vms.csv``: a file's modification time, or the server's ``Last-Modified``."""
    if local:
        path = local_file(Path(base), provider)
        where = str(path)
        try:
            stat = path.stat()
            if stat.st_size > MAX_BYTES:
                raise Failed(f"{path} is larger than {MAX_BYTES >> 20} MiB — not a price catalog")
            data = path.read_bytes()
        except OSError as exc:
            raise Failed(f"cannot read {path} ({reason(exc)})") from None
        modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc)
    else:
        if base == DEFAULT_SOURCE and provider in OLDER_SCHEMA:
            base = base.removesuffix("/v7") + "/" + OLDER_SCHEMA[provider]
        where = f"{base}/{provider}/vms.csv"
        data, modified = download(where, timeout)
    try:
        return where, data.decode("utf-8"), modified
    except UnicodeDecodeError:
        raise Failed(f"{where} is not UTF-8 text — not a price catalog") from None


def source_of(source: str | None) -> tuple[str, bool]:
    """(base, is a local folder)."""
    text = str(source).strip() if source is not None else DEFAULT_SOURCE
    if text.startswith(("http://", "https://")):
        try:
            if not urllib.parse.urlsplit(text).hostname:
                raise ValueError("no host")
        except ValueError as exc:
            raise GpugeekError(f"catalog source {source!r} is not a valid URL ({exc}) — give an http(s) URL or "
                               "a folder") from None
        return text.rstrip("/"), False
    if text.startswith("file://"):
        text = urllib.request.url2pathname(urllib.parse.urlsplit(text).path)
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise GpugeekError(f"catalog source {source!r} is neither an http(s) URL nor a folder — give one of the two")
    return str(folder.resolve()), True
