"""Reading a catalog CSV (the bundled one, a stored update, a user's own) into checked rows.

One set of rules for every reader: ``offers`` loads with them, and ``fresh`` keeps out of a new
catalog any row they would refuse, so a refused row can never stop every command.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from ..errors import GpugeekError

REQUIRED_COLUMNS = ("provider", "instance_type", "gpu", "gpu_count", "region", "price_hour")


def read_rows(path: Path, bundled: bool) -> list[dict]:
    """Read one CSV; a user catalog's bad row names the file and line."""
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise GpugeekError(f"cannot read catalog {path}: {exc.strerror} — check the path in [catalog] paths of "
                           "config.toml") from None
    with handle:
        try:
            return parse_rows(csv.DictReader(handle), path, bundled)
        except UnicodeDecodeError:
            raise GpugeekError(f"{path}: not UTF-8 text — save the catalog as UTF-8 CSV") from None


def parse_rows(reader: csv.DictReader, path: Path, bundled: bool) -> list[dict]:
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise GpugeekError(
            f"{path}:1: catalog is missing column(s) {', '.join(missing)} "
            f"— it needs {', '.join(REQUIRED_COLUMNS)}"
        )
    return [parse_row(row, path, reader.line_num, bundled) for row in reader]


def parse_row(row: dict, path: Path, line: int, bundled: bool) -> dict:
    def number(column: str, *, required: bool, integer: bool = False) -> float:
        text = (row.get(column) or "").strip()
        if not text:
            if required:
                raise GpugeekError(f"{path}:{line}: {column} is empty — every offer needs one")
            return math.nan
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise GpugeekError(f"{path}:{line}: {column} {text!r} is not {kind} — correct that cell of the "
                               "file") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and column != "spot_price_hour"
                                                     and column.endswith("_hour")) or (
                integer and value == 0):
            raise GpugeekError(f"{path}:{line}: {column} {text!r} is not a positive number — correct that cell of the "
                               "file")
        return value

    for column in ("provider", "instance_type", "gpu", "region"):
        if not (row.get(column) or "").strip():
            raise GpugeekError(f"{path}:{line}: {column} is empty — every offer needs one")
    return {
        "provider": row["provider"].strip().lower(),
        "instance_type": row["instance_type"].strip(),
        "gpu_name": row["gpu"].strip(),
        "gpu_count": number("gpu_count", required=True, integer=True),
        "gpu_mem_gib": number("gpu_mem_gib", required=False),
        "vcpus": number("vcpus", required=False),
        "mem_gib": number("mem_gib", required=False),
        "region": row["region"].strip(),
        "zone": (row.get("zone") or "").strip(),
        "price_hour": number("price_hour", required=True),
        "spot_price_hour": number("spot_price_hour", required=False),
        "source": "bundled" if bundled else str(path),
    }
