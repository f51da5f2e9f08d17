"""Where state lives and the few settings a user may change.

Everything is under ``$GPUGEEK_HOME`` (default ``~/.gpugeek``, created 0700). Settings come
from ``$GPUGEEK_HOME/config.toml``, one ``[table]`` per section::

    [catalog]
    paths = ["~/my-marketplace-offers.csv"]

    [spot]
    preemptions_per_hour = {"aws/H100" = 0.02, "gcp" = 0.01}

Every key is declared once, in ``KEYS`` (its table, name, default and meaning): ``settings()``
takes its defaults from there and the documentation's reference is generated from it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import GpugeekError


@dataclass(frozen=True)
class Key:
    """One setting of ``config.toml``: ``[table] name = default``, and what it means."""

    table: str
    name: str
    default: object
    help: str


KEYS: tuple[Key, ...] = (
    Key("catalog", "paths", [], "extra offers: CSV files with the bundled catalog's columns"),
    Key("catalog", "reserved_discount", 0.40,
        "reserved = on-demand × (1 − discount), an estimate; a fraction in [0, 1)"),
    Key("spot", "preemptions_per_hour", {}, 'your own preemption rates: "provider" or "provider/GPU" → preemptions '
        "per node-hour (≥ 0)"),
    Key("cluster", "local_usd_per_hour", 0.0, "what this machine costs you, $/h (local backend; ≥ 0)"),
    Key("cluster", "meter_interval_s", 2.0, "how often the watchdog meters and checks budget and idle (0.1–600 s)"),
    Key("cluster", "unreachable_after_min", 10.0, "a remote cluster not heard from this long is \"unreachable since\", "
        "and no more dialing (0.1–1440 min)"),
    # Ray's launcher waits 15 minutes for a new machine's SSH (AUTOSCALER_NODE_START_WAIT_S), billed all along;
    # a cloud GPU machine answers in one to three
    Key("cluster", "ssh_wait_s", 240.0, "a cloud's new machine that answers no SSH this long is given up and "
        "terminated (10–3600 s)"),
    Key("hosts", "pip_index_url", None, "where your own hosts (up --backend ssh) install their runtime from: "
        "the URL of a package index"),
    Key("cluster", "images", {}, 'your machine images, by cloud and region: {aws = {"ap-southeast-3" = "ami-…"}} '
        "(an Ubuntu with NVIDIA's driver) — where Ray's launcher has no image of its own (`offers` marks those "
        "regions), or to use yours"),
)


def default(table: str, name: str) -> object:
    """The declared default of ``[table] name``."""
    return next(k.default for k in KEYS if (k.table, k.name) == (table, name))


DEFAULT_RESERVED_DISCOUNT = default("catalog", "reserved_discount")
DEFAULT_METER_INTERVAL_S = default("cluster", "meter_interval_s")
DEFAULT_UNREACHABLE_AFTER_MIN = default("cluster", "unreachable_after_min")
DEFAULT_SSH_WAIT_S = default("cluster", "ssh_wait_s")

BUDGET_WARN_AT = 0.8          # a budget warning at 80 % of the cap (watchdog, gauges, figures)


_homes: dict[str, Path] = {}     # $GPUGEEK_HOME as set → the folder, made once (read at every cell)


def home() -> Path:
    """The state directory, created private (0700) on first use."""
    raw = os.environ.get("GPUGEEK_HOME", "~/.gpugeek")
    path = _homes.get(raw)
    if path is None or not path.is_dir():
        path = Path(raw).expanduser()
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        _homes[raw] = path
    return path


@dataclass(frozen=True)
class Settings:
    catalog_paths: tuple[Path, ...] = field(default_factory=tuple)
    reserved_discount: float = DEFAULT_RESERVED_DISCOUNT
    local_usd_per_hour: float = 0.0
    meter_interval_s: float = DEFAULT_METER_INTERVAL_S
    unreachable_after_s: float = DEFAULT_UNREACHABLE_AFTER_MIN * 60
    ssh_wait_s: float = DEFAULT_SSH_WAIT_S
    spot_rates: tuple[tuple[str, float], ...] = ()     # "provider[/GPU]" → preemptions per node-hour
    pip_index_url: str | None = None
    images: tuple[tuple[str, str, str], ...] = ()      # (cloud, region, its machine image)


def read_toml(text: str) -> dict:
    """TOML's tables; a broken file raises ``ValueError`` (its ``TOMLDecodeError``). Python 3.10
    reads it with ``tomli``, the same parser before it joined the standard library, imported only
    when a file is read: a host's runtime, which has no ``tomli``, imports this module."""
    if sys.version_info >= (3, 11):
        import tomllib  # novermin - 3.11+ alone, as the line above says
    else:  # pragma: no cover - 3.10 only
        import tomli as tomllib
    return tomllib.loads(text)


def settings() -> Settings:
    """Read ``config.toml``; a missing file means defaults, a broken one is one clear error."""
    path = Path(os.environ.get("GPUGEEK_HOME", "~/.gpugeek")).expanduser() / "config.toml"
    if not path.exists():
        return Settings()
    try:
        data = read_toml(path.read_text())
    except (OSError, ValueError) as exc:
        raise GpugeekError(f"{path}: cannot read settings ({exc}) — fix or remove the file") from None
    catalog = data.get("catalog", {})
    if not isinstance(catalog, dict):
        raise GpugeekError(f"{path}: [catalog] must be a table — write it as a [catalog] section")
    paths = catalog.get("paths", [])
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise GpugeekError(f"{path}: catalog.paths must be a list of file paths — write paths = [\"a.csv\", …]")
    discount = catalog.get("reserved_discount", DEFAULT_RESERVED_DISCOUNT)
    if not isinstance(discount, (int, float)) or not 0 <= discount < 1:
        raise GpugeekError(f"{path}: catalog.reserved_discount must be a fraction in [0, 1) — set it like 0.3 for 30 %")
    cluster = data.get("cluster", {})
    if not isinstance(cluster, dict):
        raise GpugeekError(f"{path}: [cluster] must be a table — write it as a [cluster] section")
    local = cluster.get("local_usd_per_hour", default("cluster", "local_usd_per_hour"))
    interval = cluster.get("meter_interval_s", DEFAULT_METER_INTERVAL_S)
    if isinstance(local, bool) or not isinstance(local, (int, float)) or local < 0:
        raise GpugeekError(f"{path}: cluster.local_usd_per_hour must be a number ≥ 0 — set it to what this machine "
                           "costs, $/h")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.1 <= interval <= 600:
        raise GpugeekError(f"{path}: cluster.meter_interval_s must be between 0.1 and 600 seconds — correct it in "
                           "that file")
    unreachable = cluster.get("unreachable_after_min", DEFAULT_UNREACHABLE_AFTER_MIN)
    if isinstance(unreachable, bool) or not isinstance(unreachable, (int, float)) or not 0.1 <= unreachable <= 1440:
        raise GpugeekError(f"{path}: cluster.unreachable_after_min must be between 0.1 and 1440 minutes — correct it "
                           "in that file")
    ssh_wait = cluster.get("ssh_wait_s", DEFAULT_SSH_WAIT_S)
    if isinstance(ssh_wait, bool) or not isinstance(ssh_wait, (int, float)) or not 10 <= ssh_wait <= 3600:
        raise GpugeekError(f"{path}: cluster.ssh_wait_s must be between 10 and 3600 seconds — correct it in that file")
    hosts = data.get("hosts", {})
    index_url = hosts.get("pip_index_url") if isinstance(hosts, dict) else None
    if not isinstance(hosts, dict) or not (index_url is None or (isinstance(index_url, str) and "://" in index_url)):
        raise GpugeekError(f"{path}: hosts.pip_index_url must be the URL of a package index — set it like https://pypi.example.com/simple")
    return Settings(
        pip_index_url=index_url,
        images=_images(path, cluster.get("images", {})),
        spot_rates=_spot_rates(path, data.get("spot", {})),
        catalog_paths=tuple(Path(p).expanduser() for p in paths),
        reserved_discount=float(discount),
        local_usd_per_hour=float(local),
        meter_interval_s=float(interval),
        unreachable_after_s=float(unreachable) * 60,
        ssh_wait_s=float(ssh_wait),
    )


def _images(path: Path, images: object) -> tuple[tuple[str, str, str], ...]:
    def well_formed(regions: object) -> bool:
        return isinstance(regions, dict) and all(isinstance(i, str) and i.strip() for i in regions.values())

    if not isinstance(images, dict) or not all(well_formed(regions) for regions in images.values()):
        raise GpugeekError(f"{path}: cluster.images must map a cloud to its regions' machine images — write it as "
                           f'{{aws = {{"ap-southeast-3" = "ami-…"}}}}')
    return tuple(sorted((cloud, region, image.strip()) for cloud, regions in images.items()
                        for region, image in regions.items()))


def _spot_rates(path: Path, spot: object) -> tuple[tuple[str, float], ...]:
    rates = spot.get("preemptions_per_hour", {}) if isinstance(spot, dict) else None
    if not isinstance(rates, dict) or not all(
            isinstance(k, str) and k.strip() and not isinstance(v, bool) and isinstance(v, (int, float))
            and 0 <= v < float("inf") for k, v in rates.items()):
        raise GpugeekError(f'{path}: spot.preemptions_per_hour must map "provider" or "provider/GPU" to a number ≥ 0 '
                           "(preemptions per node-hour) — correct it in that file")
    return tuple(sorted((k.strip(), float(v)) for k, v in rates.items()))
