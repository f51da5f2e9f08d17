"""The GPU benchmark's code runs (tiny model, CPU); its figures come from a CUDA machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu_gpt2.py"


def test_gpu_gpt2_smoke_runs_on_cpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)["summary"]
    assert summary["device"] == "cpu" and summary["tokens_per_s"] > 0
    assert summary["mfu"] is None, "no MFU without a GPU's peak"


def test_gpu_gpt2_says_why_it_skips_without_cuda():
    import torch

    if torch.cuda.is_available():
        return
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("skipped: no CUDA device")


def test_gpu_checks_smoke_says_why_each_gpu_part_skips_on_cpu():
    import torch

    script = SCRIPT.parent / "gpu_checks.py"
    done = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    if not torch.cuda.is_available():
        parts = ("nvml", "nccl", "oom")
        assert {k: "skipped" in report[k] for k in parts} == dict.fromkeys(parts, True), report
