"""``catalog update``: SkyPilot's real vms.csv files, served from 127.0.0.1, become the catalog in use.

The sample files (tests/data/skypilot-catalog-sample, provenance in its README) come from the same
upstream commits as the bundled catalog, so every converted row must carry the bundled price exactly.
A bad download (cut short, 404, no answer, no network) must leave the last good catalog in use.
"""

from __future__ import annotations

import csv
import json
import socket
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpugeek_jupyter.catalog import find_offers, fresh, load_catalog, skypilot
from gpugeek_jupyter.catalog.offers import bundled_catalog_path
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.views.pricing import price_performance

SAMPLE = Path(__file__).parent / "data" / "skypilot-catalog-sample"
SAMPLED = ("lambda", "vast", "runpod", "aws", "gcp")
# rows of the sample that are bundled offers: lambda and vast are whole files (their CPU rows drop
# out); runpod's first 60 rows; the AWS and GCP excerpts (GCP: host VM + accelerator, summed)
MATCHED = {"lambda": 306, "vast": 61, "runpod": 60, "aws": 22, "gcp": 50}
KEY = ("provider", "instance_type", "gpu", "gpu_count", "region", "zone")


def sample_file(provider: str) -> Path:
    (path,) = SAMPLE.glob(f"{provider}-vms*.csv")
    return path


class Catalogs(BaseHTTPRequestHandler):
    """``/<mode>/<provider>/vms.csv`` from the sample folder; the mode says how to misbehave."""

    stop = threading.Event()

    def do_GET(self) -> None:
        mode, provider, name = [*self.path.strip("/").split("/"), "", "", ""][:3]
        found = list(SAMPLE.glob(f"{provider}-vms*.csv")) if name == "vms.csv" else []
        if mode not in {"v7", "cut", "short", "slow", "html", "dated"} or not found:
            self.send_error(404)
            return
        body = found[0].read_bytes()
        if mode == "slow" and self.stop.wait(10):   # no answer before the client gives up
            return
        if mode == "html":
            body = b"<!DOCTYPE html><html><body>rate limited</body></html>\n"
        sent = body[: len(body) // 2] if mode in {"cut", "short"} else body
        self.send_response(200)
        self.send_header("Content-Type", "text/csv")
        self.send_header("Content-Length", str(len(body) if mode == "short" else len(sent)))
        if mode == "dated":          # a server that says when the file last changed: 20 days ago
            self.send_header("Last-Modified", "Tue, 04 Nov 2025 06:00:00 GMT")
        self.end_headers()
        self.wfile.write(sent)                      # "short": the connection ends before the body

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    """The sample folder over HTTP on 127.0.0.1; stopped (and any slow answer released) at the end."""
    Catalogs.stop.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Catalogs)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    Catalogs.stop.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def bundled_rows() -> dict[tuple, list[dict]]:
    rows: dict[tuple, list[dict]] = {}
    with bundled_catalog_path().open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(tuple(row[k] for k in KEY), []).append(row)
    return rows


def snapshot() -> tuple[bytes, bytes]:
    folder = fresh.store()
    return (folder / fresh.META).read_bytes(), fresh.current().path.read_bytes()


def set_date(provider: str, when: datetime) -> None:
    """Pretend the stored catalog fetched ``provider``'s prices at ``when``."""
    meta_path = fresh.store() / fresh.META
    meta = json.loads(meta_path.read_text())
    meta["providers"][provider]["prices_as_of"] = when.isoformat(timespec="seconds")
    meta_path.write_text(json.dumps(meta))


def test_sample_files_give_the_bundled_prices_exactly(server, capsys):
    result = fresh.update(f"{server}/v7", providers=list(SAMPLED), timeout=10)
    assert result.updated == {p: MATCHED[p] for p in SAMPLED} and not result.failed
    bundled = bundled_rows()
    with fresh.current().path.open(newline="", encoding="utf-8") as handle:
        stored = [row for row in csv.DictReader(handle) if row["provider"] in SAMPLED]
    matched, unmatched = Counter(), []
    for row in stored:
        same = bundled.get(tuple(row[k] for k in KEY))
        if not same:
            unmatched.append(row)
            continue
        matched[row["provider"]] += 1
        # AWS p4de appears twice in some zones: the row must equal one of them
        assert any(float(row["price_hour"]) == float(b["price_hour"])
                   and row["spot_price_hour"] == b["spot_price_hour"]
                   and row["gpu_mem_gib"] == b["gpu_mem_gib"] and row["vcpus"] == b["vcpus"]
                   and row["mem_gib"] == b["mem_gib"] for b in same), (row, same)
    with capsys.disabled():
        print("\nrows matching the bundled catalog:", dict(sorted(matched.items())))
    assert not unmatched, unmatched[:3]
    assert dict(matched) == MATCHED, "every sample offer matches a bundled one"
    # GCP: host VM + accelerator of the same zone, as the bundled catalog adds them up
    gcp = {(r["instance_type"], r["gpu"], r["gpu_count"], r["zone"]): r for r in stored if r["provider"] == "gcp"}
    assert gcp["a2-highgpu-1g", "A100", "1", "us-central1-a"]["price_hour"] == "3.67339"   # 0.73948 + 2.93391
    assert gcp["n1-standard-8", "T4", "4", "us-central1-a"]["price_hour"] == "1.78"        # 0.38 + 1.4
    assert gcp["n1-standard-8", "T4", "4", "us-central1-a"]["spot_price_hour"] == "0.6563"  # 0.0963 + 0.56
    # whole files: every bundled lambda and vast offer came back
    for provider in ("lambda", "vast"):
        assert sum(len(v) for k, v in bundled.items() if k[0] == provider) == MATCHED[provider]


def test_converter_keeps_the_bundled_rules():
    vast = skypilot.convert("vast", sample_file("vast").read_text(encoding="utf-8"))
    assert all(row["spot_price_hour"] == "" for row in vast), "Vast's 0.00 spot means none"
    four = next(r for r in vast if r["instance_type"].startswith("4x-RTX_A6000"))
    assert four["gpu_mem_gib"] == "48.0", "Vast's SizeInMiB is the total over GPUs"
    lam = skypilot.convert("lambda", sample_file("lambda").read_text(encoding="utf-8"))
    assert not [r for r in lam if r["instance_type"].startswith("cpu_")], "no CPU-only rows"
    assert {r["zone"] for r in lam} == {""}
    gcp = skypilot.convert("gcp", sample_file("gcp").read_text(encoding="utf-8"))
    assert {r["instance_type"] for r in gcp if r["gpu"] == "T4"} == {"n1-standard-8"}
    assert all(r["instance_type"] for r in gcp), "accelerator rows never stand alone"


@pytest.mark.parametrize("text, says", [
    ("\x89PNG\r\n\x1a\n\x00\x00binary\n", "not a SkyPilot vms.csv"),
    ("<!DOCTYPE html>\n<html><body>Not Found</body></html>\n", "not a SkyPilot vms.csv"),
    ("InstanceType,Price,Region\ngpu_1x_a10,0.75,us-east-1\n", "lacks AcceleratorName"),
    ("", "empty"),
    (None, "cut short"),                       # the lambda file, cut mid-row
    ('InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,Region\n"gpu_1x,A10,1,4,16,0.7,r\n',
     "cut short"),
])
def test_bad_input_is_one_line(text, says):
    if text is None:
        data = sample_file("lambda").read_text(encoding="utf-8")
        text = data[: len(data) // 2]
    with pytest.raises(GpugeekError, match=says) as info:
        skypilot.convert("lambda", text)
    assert "\n" not in str(info.value) and str(info.value).startswith("lambda: ")


def test_an_update_is_the_catalog_in_use(server):
    before = load_catalog()
    assert before.attrs["prices_as_of"] == "2026-11-21", "the bundled date comes from data/gpu_offers.json"
    assert fresh.current().bundled and fresh.current().prices_as_of == "2026-11-21"
    assert str(fresh.current()).startswith("bundled catalog, prices as of 2026-11-21: ")
    bundled_runpod = (before["provider"] == "runpod").sum()

    result = fresh.update(f"{server}/v7", providers="runpod", timeout=10)
    assert "\n" not in str(result) and "runpod (60 offers)" in str(result)
    assert "runpod" in result._repr_html_() and "updated" in result._repr_html_()
    info = fresh.current()
    assert not info.bundled and info.path.parent == fresh.store()
    fetched = info.providers["runpod"]["prices_as_of"]
    assert datetime.fromisoformat(fetched) > datetime.now(timezone.utc) - timedelta(minutes=5)
    assert info.providers["runpod"]["source"] == f"{server}/v7/runpod/vms.csv"
    assert info.providers["aws"]["prices_as_of"] == "2026-11-21", "providers not updated keep their date"

    after = load_catalog()                      # the cache noticed: new rows, the others kept
    assert bundled_runpod == 1393 and (after["provider"] == "runpod").sum() == 60
    assert (after["provider"] != "runpod").sum() == (before["provider"] != "runpod").sum()
    offers = find_offers(provider="runpod")
    assert len(offers) == 60 and set(offers["instance_type"]) == {f"{n}x_A100-80GB_SECURE" for n in (1, 2, 4)}
    assert offers.attrs["prices_as_of"] == fetched[:10] and offers.attrs["stale_warning"] is None
    assert find_offers(provider="aws").attrs["prices_as_of"] == "2026-11-21"
    assert not list(fresh.store().glob(".*.tmp")), "no temp file left behind"


@pytest.mark.parametrize("mode, says", [
    ("cut", "lambda: the catalog file ends in the middle of a row — it was cut short"),
    ("short", "lambda: the download from 127.0.0.1:\\d+ was cut short"),
    ("gone", "lambda: HTTP 404 Not Found for http://127.0.0.1:\\d+/gone/lambda/vms.csv"),
    ("slow", "lambda: no answer from 127.0.0.1:\\d+ within 0.3 s"),
    ("html", "lambda: not a SkyPilot vms.csv — its header lacks"),
    ("offline", "lambda: cannot reach 127.0.0.1:\\d+ \\(Connection refused\\)"),
], ids=["truncated", "cut-short", "404", "timeout", "not-csv", "offline"])
def test_a_bad_download_keeps_the_last_good_catalog(server, mode, says):
    fresh.update(f"{server}/v7", providers=["lambda", "runpod"], timeout=10)
    made = fresh.current().made
    kept, rows = snapshot(), len(load_catalog())
    if mode == "offline":                       # a port nobody listens on
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = f"http://127.0.0.1:{probe.getsockname()[1]}"
    else:
        base = f"{server}/{mode}"
    started = time.monotonic()
    with pytest.raises(GpugeekError, match=says) as info:
        fresh.update(base, providers=["lambda"], timeout=0.3)
    assert time.monotonic() - started < 5
    line = str(info.value)
    assert "\n" not in line and len(info.value._render_traceback_()) == 1, "one line, no traceback"
    assert line.startswith("catalog not updated — lambda: ")
    assert line.endswith(f"the last good catalog from {made} stays in use")
    assert snapshot() == kept and len(load_catalog()) == rows
    assert not list(fresh.store().glob(".*.tmp"))


def test_a_partial_update_keeps_the_failed_providers_prices(server):
    result = fresh.update(f"{server}/v7", providers=["vast", "azure"], timeout=10)
    assert result.updated == {"vast": 61} and list(result.failed) == ["azure"]
    line = str(result)
    assert "\n" not in line and "azure: HTTP 404" in line and "its prices from 2026-11-21 stay in use" in line
    assert (load_catalog()["provider"] == "azure").sum() == 182, "azure's last good rows stay"


def test_a_local_folder_is_a_source_too():
    result = fresh.update(str(SAMPLE))             # <provider>-vms*.csv files: the providers found
    assert result.updated == MATCHED and not result.failed
    with pytest.raises(GpugeekError, match=r"no azure/vms.csv or azure-vms\*.csv"):
        fresh.update(str(SAMPLE), providers=["azure"])
    with pytest.raises(GpugeekError, match="unknown provider 'lamda'"):
        fresh.update(str(SAMPLE), providers=["lamda"])
    with pytest.raises(GpugeekError, match="neither an http"):
        fresh.update(str(SAMPLE / "nowhere"))


def test_week_old_prices_warn_with_the_update_command(server):
    week_later = datetime(2026, 11, 29, tzinfo=timezone.utc)
    assert "days old" in fresh.bundled().stale_warning(now=week_later)
    assert fresh.bundled().stale_warning(now=datetime(2026, 11, 27, tzinfo=timezone.utc)) is None

    fresh.update(f"{server}/v7", providers=["lambda"], timeout=10)
    assert find_offers(provider="lambda").attrs["stale_warning"] is None
    set_date("lambda", datetime.now(timezone.utc) - timedelta(days=8))
    for frame in (load_catalog(), find_offers(provider="lambda")):
        warning = frame.attrs["stale_warning"]
        assert "days old" in warning and "%gpugeek catalog update" in warning
        assert "gg.update_catalog()" in warning and "\n" not in warning
    assert "catalog prices for lambda are 8 days old" in find_offers(provider="lambda").attrs["stale_warning"]
    title = price_performance(find_offers(provider="lambda")).layout.title.text    # the chart says so too
    assert "prices as of" in title and "8 days old" in title
    assert find_offers(provider="lambda").attrs["prices_as_of"] == (
        datetime.now(timezone.utc) - timedelta(days=8)).date().isoformat()


def test_the_price_date_is_the_files_own_time_where_it_is_known(gpugeek_home, tmp_path, server):
    """A mirror weeks old is not fresh because it was fetched today: a folder's file time and a
    server's Last-Modified date the prices, and the stale warning follows."""
    import os
    import shutil

    folder = tmp_path / "mirror"
    (folder / "vast").mkdir(parents=True)
    shutil.copy(sample_file("vast"), folder / "vast" / "vms.csv")
    month_ago = time.time() - 30 * 86400
    os.utime(folder / "vast" / "vms.csv", (month_ago, month_ago))
    fresh.update(str(folder))
    entry = fresh.current().providers["vast"]
    assert entry["prices_as_of"][:10] == datetime.fromtimestamp(month_ago, timezone.utc).date().isoformat()
    assert entry["dated_by"] == "file time"
    assert "vast are 30 days old" in find_offers(provider="vast").attrs["stale_warning"]

    fresh.update(f"{server}/dated", providers=["lambda"])
    entry = fresh.current().providers["lambda"]
    assert entry["prices_as_of"].startswith("2025-11-04") and entry["dated_by"] == "Last-Modified"


@pytest.mark.parametrize("source", ["http://[bad", "https://"])
def test_a_source_that_is_no_url_is_one_line(gpugeek_home, source):
    with pytest.raises(GpugeekError, match="is not a valid URL") as info:
        fresh.update(source)
    assert "\n" not in str(info.value)
