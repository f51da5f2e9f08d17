"""SkyPilot's hosted price catalogs (schema v7 ``<provider>/vms.csv``) → rows of our catalog.

The rules are the ones ``data/gpu_offers.csv`` was made with (``data/README.md``), so a fresh file
gives the bundled prices for the same offers: prices are copied as written, GCP's GPU add-on rows
are summed with their host VM's row (same region and zone), zero spot prices mean "none", and
rows without a GPU or a price are left out. Nothing here estimates a price.
"""

from __future__ import annotations

import ast
import csv
import io
import re
from decimal import Decimal, InvalidOperation

from ..errors import GpugeekError

PROVIDERS = ("aws", "gcp", "azure", "lambda", "runpod", "nebius", "vast")
COLUMNS = ("provider", "instance_type", "gpu", "gpu_count", "gpu_mem_gib", "vcpus", "mem_gib", "region",
           "zone", "price_hour", "spot_price_hour", "source_file", "source_commit")
NEEDED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price", "Region")

# Accelerators that are not GPUs: AWS Gaudi (dl1), Qualcomm (dl2q), FPGAs (f1, f2), Inferentia,
# Trainium, video transcoders (vt1); GCP TPUs.
NOT_GPU_FAMILIES = re.compile(r"^(dl\d|dl2q|f\d|inf\d|trn\d|vt\d)[a-z]*\.", re.IGNORECASE)
NOT_GPU_NAMES = re.compile(r"inferentia|trainium|gaudi|qualcomm|fpga|xilinx|\bu30\b|^tpu", re.IGNORECASE)

# GCP: which accelerator (and how many) each GPU host VM carries. The host row's price has no GPU;
# the accelerator row's price is added. T4 and V100 attach to N1 VMs, priced on n1-standard-8.
GCP_HOST_FAMILIES = {"a2-highgpu": "A100", "a2-megagpu": "A100", "a2-ultragpu": "A100-80GB",
                     "a3-highgpu": "H100", "a3-megagpu": "H100-MEGA", "a3-ultragpu": "H200",
                     "a4-highgpu": "B200"}
GCP_HOST = re.compile(r"^(?P<family>[a-z0-9]+-[a-z]+gpu)-(?P<count>\d+)g$")
GCP_G2_L4 = {"g2-standard-4": 1, "g2-standard-8": 1, "g2-standard-12": 1, "g2-standard-16": 1,
             "g2-standard-32": 1, "g2-standard-24": 2, "g2-standard-48": 4, "g2-standard-96": 8}
GCP_N1_HOST = "n1-standard-8"
GCP_N1_GPUS = ("T4", "V100")


def convert(provider: str, text: str, source_file: str = "", source_commit: str = "") -> list[dict[str, str]]:
    """Our catalog's rows (every value a string, as in ``gpu_offers.csv``) from one ``vms.csv``.

    Bad input — not CSV, missing columns, a file cut short — raises :class:`GpugeekError`.
    """
    if provider not in PROVIDERS:
        raise GpugeekError(f"unknown provider {provider!r} — name one of {', '.join(PROVIDERS)}")
    rows = _read(provider, text)
    extra = {"source_file": source_file, "source_commit": source_commit}
    if provider == "gcp":
        return [{**row, **extra} for row in _gcp(rows)]
    out = []
    for line, row in rows:
        offer = _offer(provider, line, row)
        if offer is not None:
            out.append({**offer, **extra})
    return out


def _read(provider: str, text: str) -> list[tuple[int, dict[str, str]]]:
    """The data rows with their line numbers; a file that is not a whole v7 vms.csv is one error."""
    text = text.lstrip("\ufeff")
    if not text.strip():
        raise GpugeekError(f"{provider}: the catalog file is empty — `%gpugeek catalog --refresh` fetches it again")
    if not text.endswith(("\n", "\r")):
        raise GpugeekError(f"{provider}: the catalog file ends in the middle of a row — it was cut short")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
        missing = [c for c in NEEDED if c not in header]
        if missing:
            raise GpugeekError(f"{provider}: not a SkyPilot vms.csv — its header lacks {', '.join(missing)}")
        rows = []
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(header):
                raise GpugeekError(f"{provider}: line {reader.line_num} has {len(fields)} fields where the "
                                   f"header has {len(header)} — the file is cut short or not a SkyPilot vms.csv")
            rows.append((reader.line_num, dict(zip(header, (f.strip() for f in fields), strict=True))))
    except csv.Error as exc:
        raise GpugeekError(f"{provider}: not valid CSV (line {reader.line_num}: {exc}) — `%gpugeek catalog --refresh` "
                           "fetches it again") from None
    return rows


def _number(provider: str, line: int, row: dict, column: str) -> Decimal | None:
    text = row.get(column, "")
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise GpugeekError(f"{provider}: line {line}: {column} {text!r} is not a number — `%gpugeek catalog "
                           "--refresh` fetches the file again") from None
    if not value.is_finite() or value < 0:
        raise GpugeekError(f"{provider}: line {line}: {column} {text!r} is not a price or size — `%gpugeek catalog "
                           "--refresh` fetches the file again")
    return value


def _plain(value: Decimal | None) -> str:
    """``92.0`` → ``92``, ``437.50`` → ``437.5``: sizes as the bundled catalog writes them."""
    if value is None:
        return ""
    return format(value.normalize(), "f") if value != value.to_integral_value() else str(int(value))


def _gpu_count(provider: str, line: int, row: dict) -> int | None:
    count = _number(provider, line, row, "AcceleratorCount")
    if count is None or count <= 0 or count != count.to_integral_value():
        return None            # no GPU, or a fraction of one: not an offer we can size
    return int(count)


def _mib(gpu_info: str) -> Decimal | None:
    """``SizeInMiB`` of the first GPU in GpuInfo (a Python dict literal); None when it has none."""
    try:
        info = ast.literal_eval(gpu_info) if gpu_info.startswith("{") else None
        size = info["Gpus"][0]["MemoryInfo"]["SizeInMiB"]
    except (ValueError, SyntaxError, TypeError, KeyError, IndexError, MemoryError, RecursionError):
        return None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
        return None
    return Decimal(str(size))


def _gib(mib: Decimal | None, per: int = 1) -> str:
    return "" if mib is None else f"{float(mib) / per / 1024:.1f}"


def _spot(provider: str, line: int, row: dict) -> Decimal | None:
    spot = _number(provider, line, row, "SpotPrice")
    return spot if spot else None          # 0.00 (Vast, everywhere) means there is no spot price


def _offer(provider: str, line: int, row: dict) -> dict[str, str] | None:
    name, instance = row["AcceleratorName"], row["InstanceType"]
    if not name or not instance or NOT_GPU_NAMES.search(name) or NOT_GPU_FAMILIES.match(instance):
        return None
    count = _gpu_count(provider, line, row)
    price = _number(provider, line, row, "Price")
    if count is None or not price or not row["Region"]:
        return None
    if provider == "nebius":
        mem = ""                               # Nebius's SizeInMiB is the host's RAM
    elif provider == "vast":
        mem = _gib(_mib(row.get("GpuInfo", "")), per=count)    # Vast's is the total over GPUs
    else:
        mem = _gib(_mib(row.get("GpuInfo", "")))
    spot = _spot(provider, line, row)
    return {
        "provider": provider, "instance_type": instance, "gpu": name, "gpu_count": str(count),
        "gpu_mem_gib": mem, "vcpus": _plain(_number(provider, line, row, "vCPUs")),
        "mem_gib": _plain(_number(provider, line, row, "MemoryGiB")), "region": row["Region"],
        "zone": row.get("AvailabilityZone", ""), "price_hour": row["Price"],
        "spot_price_hour": row["SpotPrice"] if spot is not None else "",
    }


def _gcp_accelerator(instance: str) -> tuple[str, int] | None:
    """The GPUs a GCP host VM type carries (``a2-highgpu-8g`` → A100 ×8); None for other VMs."""
    if instance in GCP_G2_L4:
        return "L4", GCP_G2_L4[instance]
    match = GCP_HOST.match(instance)
    if match and match["family"] in GCP_HOST_FAMILIES:
        return GCP_HOST_FAMILIES[match["family"]], int(match["count"])
    return None


def _sum(a: Decimal | None, b: Decimal | None) -> str:
    return "" if a is None or b is None else format((a + b).normalize(), "f")


def _gcp(rows: list[tuple[int, dict[str, str]]]) -> list[dict[str, str]]:
    """Host VM + accelerator rows of one region and zone → one offer priced at their sum."""
    hosts: dict[tuple, list[tuple[int, dict]]] = {}     # (region, zone, gpu, count) → host rows
    accelerators = []
    for line, row in rows:
        place = (row["Region"], row.get("AvailabilityZone", ""))
        if row["InstanceType"] and not row["AcceleratorName"]:
            if row["InstanceType"] == GCP_N1_HOST:
                for name in GCP_N1_GPUS:
                    hosts.setdefault((*place, name, None), []).append((line, row))
            elif carries := _gcp_accelerator(row["InstanceType"]):
                hosts.setdefault((*place, *carries), []).append((line, row))
        elif not row["InstanceType"] and row["AcceleratorName"] and not NOT_GPU_NAMES.search(row["AcceleratorName"]):
            accelerators.append((line, row))
    out = []
    for line, acc in accelerators:
        name, count = acc["AcceleratorName"], _gpu_count("gcp", line, acc)
        acc_price = _number("gcp", line, acc, "Price")
        if count is None or not acc_price:
            continue
        place = (acc["Region"], acc.get("AvailabilityZone", ""))
        for host_line, host in hosts.get((*place, name, count), []) + hosts.get((*place, name, None), []):
            host_price = _number("gcp", host_line, host, "Price")
            if not host_price:
                continue
            out.append({
                "provider": "gcp", "instance_type": host["InstanceType"], "gpu": name, "gpu_count": str(count),
                "gpu_mem_gib": _gib(_mib(acc.get("GpuInfo", ""))),
                "vcpus": _plain(_number("gcp", host_line, host, "vCPUs")),
                "mem_gib": _plain(_number("gcp", host_line, host, "MemoryGiB")),
                "region": place[0], "zone": place[1], "price_hour": _sum(host_price, acc_price),
                "spot_price_hour": _sum(_spot("gcp", host_line, host), _spot("gcp", line, acc)),
            })
    return out
