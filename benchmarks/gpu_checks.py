"""What only a real GPU can show, checked on one in one process (no Ray: the GPU machine has none).

    python benchmarks/gpu_checks.py [--out FILE]
    python benchmarks/gpu_checks.py --smoke      # the code runs on CPU; the GPU parts say why not

- **NVML**: what one ``telemetry.gpu_samples()`` costs (the node sampler takes one a second), and
  that its memory reading agrees with torch's own count plus the CUDA context;
- **NCCL**: a process group of one rank formed as the workers form theirs (``init_process_group``
  over TCP), an all_reduce of 1 GiB timed; one GPU cannot measure a link between GPUs;
- **a real out-of-memory error**: GPT-2 124M at a batch that cannot fit, trained through the ``gg``
  helper, read by ``workers.oom`` as a worker reads it, the diagnosis the notebook would show, and
  then a step at a batch that fits in the same process (the GPU was given back).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_gpt2 import GPT

from gpugeek_jupyter.meter import telemetry
from gpugeek_jupyter.ports import free_port
from gpugeek_jupyter.workers import helper as helper_mod
from gpugeek_jupyter.workers import oom
from gpugeek_jupyter.workers.options import RunOptions

GIB = 2**30


def nvml() -> dict:
    if not telemetry.nvml_available():
        return {"skipped": telemetry.nvml_unavailable_reason()}
    telemetry.gpu_samples()
    costs = []
    for _ in range(50):
        began = time.perf_counter()
        rows = telemetry.gpu_samples()
        costs.append(time.perf_counter() - began)
    held = torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")      # 8 GiB more, seen by both
    torch.cuda.synchronize()
    after = telemetry.gpu_samples()[0]
    del held
    torch.cuda.empty_cache()
    return {"sample_ms_median": statistics.median(costs) * 1e3, "sample_ms_max": max(costs) * 1e3,
            "row": rows[0], "nvml_used_before_gib": rows[0]["gpu_mem_used"] / GIB,
            "nvml_used_with_8gib_gib": after["gpu_mem_used"] / GIB,
            "nvml_saw_gib": (after["gpu_mem_used"] - rows[0]["gpu_mem_used"]) / GIB}


def nccl() -> dict:
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    began = time.perf_counter()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    tensor = torch.ones(GIB // 2, dtype=torch.bfloat16, device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    formed = time.perf_counter() - began
    times = []
    for _ in range(5):
        began = time.perf_counter()
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    ok = bool(tensor[0].item() == 1.0)
    dist.destroy_process_group()
    return {"nccl": ".".join(map(str, torch.cuda.nccl.version())), "formed_and_first_s": formed,
            "all_reduce_1gib_ms": min(times) * 1e3, "sum_right": ok}


def out_of_memory(batch: int) -> dict:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: a CPU cannot run out of GPU memory"}
    device = torch.device("cuda", 0)
    options = RunOptions(workers=1, amp="bf16")
    gg = helper_mod.Helper(0, 1, device, options, report=lambda sample: None)
    model = gg.prepare(GPT())
    gg.prepare(torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True))     # gg.backward steps it

    def step(rows: int):
        x = torch.randint(0, 50304, (rows, 1024), device=device)
        with gg.autocast():
            loss = model(x, x)
        gg.backward(loss)

    out: dict = {"batch": batch}
    try:
        step(batch)
        out["ran_out"] = False
        return out
    except Exception as exc:  # noqa: BLE001 - the error under test
        out["ran_out"] = oom.ran_out(exc)
        out["type"] = type(exc).__name__
        out["memory"] = oom.memory_at(exc, device)
        last = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    out["diagnosis"] = oom.diagnosis(last, options, out["memory"])
    oom.release(device)
    out["reserved_after_release_gib"] = torch.cuda.memory_reserved(device) / GIB
    began = time.perf_counter()
    step(8)
    torch.cuda.synchronize()
    out["next_step_at_batch_8_s"] = time.perf_counter() - began
    out["next_step_peak_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--oom-batch", type=int, default=512)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    report: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__}
    for name, check in (("nvml", nvml), ("nccl", nccl), ("oom", lambda: out_of_memory(args.oom_batch))):
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - each check reports, whatever the others do
            report[name] = {"failed": f"{type(exc).__name__}: {str(exc)[:800]}"}
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1, default=float))
    print(json.dumps(report, indent=1, default=float))
    if not args.smoke and any("failed" in v for v in report.values() if isinstance(v, dict)):
        sys.exit(1)


if __name__ == "__main__":
    main()
