"""Right-sizing from telemetry: synthetic jobs whose answers are worked out by hand."""

from __future__ import annotations

import math
import time

import pytest

from gpugeek_jupyter.catalog import load_catalog, with_pricing
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.sizing.advise import Usage, advise_job, candidates, right_size
from gpugeek_jupyter.vocab import NodePrice

P4D = "aws/p4d.24xlarge/us-east-1/use1-az1"          # 8× A100 40 GB
G6 = "aws/g6.48xlarge/us-east-1/use1-az1"            # 8× L4 (AWS says 22.4 GiB)
G6E = "aws/g6e.12xlarge/us-east-1/use1-az1"          # 4× L40S (AWS says 44.7 GiB)
P5 = "aws/p5.48xlarge/us-east-1/use1-az1"            # 8× H100


def offers(*ids):
    catalog = with_pricing(load_catalog(), "on-demand")
    rows = catalog[catalog["id"].isin(ids)]
    assert len(rows) == len(ids), set(ids) - set(rows["id"])
    return rows


def p4d_node(cluster_id: int, usd_per_hour: float, started: float) -> None:
    """One live 8-GPU node of the p4d offer in the ledger, as the metering records it."""
    from test_views import node

    ledger.sync_nodes(cluster_id, [node("n1", "gpu", started)],
                      {"gpu": NodePrice(P4D, "on-demand", usd_per_hour, on_demand_usd_per_hour=usd_per_hour)})


def test_a_third_busy_a100_job_moves_to_l4_and_the_saving_is_the_hand_computed_one():
    rows = offers(P4D, G6, G6E, P5).set_index("id")
    p4d, g6 = rows.loc[P4D], rows.loc[G6]
    usage = Usage(gpu="A100", gpus=8, peak_tflops=312, mem_gib=40, usd_per_hour=p4d["price"],
                  busy=0.30, peak_gib=16.0, hours=10.0)
    advice = right_size(usage, rows.reset_index())
    # by hand: the job asks 0.30 × 8 × 312 = 748.8 TFLOP/s of its 8 A100s ($32.7726/h); the same
    # 8 GPUs elsewhere: L4 ×8 (one g6.48xlarge) gives 8 × 121 × 0.9 = 871.2 and holds 16 × 1.2 + 1
    # = 20.2 GiB in its 22.4, for $13.3504/h; L40S ×4 twice gives 8 × 362.05 × 0.9 = 2607 and 44.7
    # GiB, for 2 × $10.49264; H100 ×8 costs more than the A100s.
    assert 8 * 121 * 0.9 >= 748.8 and 16 * 1.2 + 1 <= 22.4
    assert list(advice.offers["id"]) == [G6, G6E] and list(advice.offers["nodes"]) == [1, 2]
    assert advice.offers.iloc[1]["usd_per_hour"] == pytest.approx(2 * 10.49264)
    saving = 1 - g6["price"] / p4d["price"]
    assert g6["price"] == 13.3504 and p4d["price"] == 32.7726 and saving == pytest.approx(0.5926, abs=1e-4)
    assert advice.offers.iloc[0]["saving"] == pytest.approx(saving)
    assert advice.offers.iloc[0]["usd_same_work"] == pytest.approx(13.3504 * 10)
    assert "L4 ×8 would cost ~59% less for the same steps" in str(advice)


def test_busy_gpus_or_too_much_memory_get_no_cheaper_pick():
    rows = offers(P4D, G6, P5)
    p4d = rows.set_index("id").loc[P4D]
    # 0.95 × 8 × 312 = 2371 TFLOP/s: L4 ×8 gives 871; H100 ×8 keeps up but costs more
    busy = right_size(Usage(gpu="A100", gpus=8, peak_tflops=312, mem_gib=40, usd_per_hour=p4d["price"],
                            busy=0.95, peak_gib=16.0, hours=1.0), rows)
    assert busy.offers.empty and "its GPUs are busy" in str(busy)
    full = right_size(Usage(gpu="A100", gpus=8, peak_tflops=312, mem_gib=40, usd_per_hour=p4d["price"],
                            busy=0.30, peak_gib=36.0, hours=1.0), offers(P4D, G6, G6E, P5))
    assert list(full.offers["id"]) == [G6E]          # 36 × 1.2 + 1 = 44.2 GiB: only the L40S's 44.7
    assert any(line.startswith("memory-bound: 36.0 of 40 GiB") and "FSDP over 16 GPUs" in line
               for line in full.lines)
    # a job on 2 of a node's 8 GPUs pays for 8: two GPUs elsewhere are the cheaper same job
    two = right_size(Usage(gpu="A100", gpus=2, peak_tflops=312, mem_gib=40, usd_per_hour=p4d["price"],
                           busy=0.30, peak_gib=16.0, hours=1.0), candidates())
    assert not two.offers.empty and (two.offers["gpu_count"] * two.offers["nodes"] == 2).all()


def test_no_gpu_telemetry_advises_nothing_and_says_why():
    advice = right_size(Usage(gpu="", gpus=0, peak_tflops=math.nan, mem_gib=math.nan,
                              usd_per_hour=math.nan, busy=math.nan, peak_gib=math.nan, hours=1.0),
                        candidates())
    assert advice.offers.empty and "no GPU telemetry" in str(advice)


def test_a_jobs_ledger_telemetry_is_read_for_its_offer(gpugeek_home):
    record = registry.create("advised", "sim", {}, simulated=True, budget_usd=None, idle_minutes=None)
    catalog = load_catalog().set_index("id")
    p4d = catalog.loc[P4D]
    now = time.time()
    p4d_node(record.id, float(p4d["on_demand_price"]), now - 7200)
    ledger.job_started(record.id, "j1", "train", at=now - 3600)
    ledger.record_samples(record.id, "j1", [
        {"rank": r, "t": now - 3600 + i, "step": i, "gpu_util": util, "memory_bytes": int(gib * 2**30),
         "samples_per_s": 100.0}
        for r in range(8) for i, (util, gib) in enumerate([(20, 10.0), (40, 16.0)])])
    ledger.job_ended(record.id, "j1", at=now)
    advice = advise_job(record.id, "train")
    assert advice.usage.busy == pytest.approx(0.30) and advice.usage.peak_gib == pytest.approx(16.0)
    assert advice.usage.gpus == 8 and advice.usage.hours == pytest.approx(1.0)
    assert advice.usage.usd_per_hour == pytest.approx(p4d["on_demand_price"])
    # the rule in plain Python over every offer: 8 GPUs in whole instances, holds 20.2 GiB, keeps up
    # with 748.8 TFLOP/s, cheapest
    fits = [(r["price"] * (8 // r["gpu_count"]), r["id"]) for r in candidates().to_dict("records")
            if 8 % r["gpu_count"] == 0 and r["gpu_mem_gib"] >= 16 * 1.2 + 1
            and 8 * r["bf16_tflops"] * 0.9 >= 748.8 and r["price"] * (8 // r["gpu_count"]) < p4d["on_demand_price"]]
    assert advice.offers.iloc[0]["id"] == min(fits)[1]
    with pytest.raises(GpugeekError, match="no job 'nope'"):
        advise_job(record.id, "nope")


def test_a_gpu_jobs_final_summary_carries_the_advice_and_a_cpu_jobs_does_not(gpugeek_home):
    from gpugeek_jupyter.widgets.job import JobReport, advice_line

    record = registry.create("summary", "sim", {}, simulated=True, budget_usd=None, idle_minutes=None)
    now = time.time()
    p4d_node(record.id, 32.7726, now)
    ledger.job_started(record.id, "gpu", "gpu", at=now)
    ledger.record_samples(record.id, "gpu", [{"rank": r, "t": now + 1, "step": 1, "gpu_util": 30,
                                               "memory_bytes": 16 * 2**30} for r in range(8)])
    ledger.job_started(record.id, "cpu", "cpu", at=now)
    ledger.record_samples(record.id, "cpu", [{"rank": 0, "t": now + 1, "step": 1, "memory_bytes": 2**20}])
    line = advice_line(record.id, "gpu", ledger.samples_frame(record.id, "gpu"))
    assert line == str(advise_job(record.id, "gpu")).split("\n", 1)[1].replace("\n", " · ")
    assert "would cost ~" in line and "less for the same steps" in line
    assert advice_line(record.id, "cpu", ledger.samples_frame(record.id, "cpu")) is None
    report = JobReport(name="gpu", status="finished", samples=ledger.samples_frame(record.id, "gpu"), usd=1.0,
                       simulated=True, seconds=60, advice=line)
    bundle = report.summary_bundle()
    assert bundle["text/plain"].endswith(line) and "gpugeek-job-advice" in bundle["text/html"]
