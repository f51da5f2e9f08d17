"""GPT-2 124M (nanoGPT's shape) trained through the worker-side `gg` helper on one CUDA GPU.

    python benchmarks/gpu_gpt2.py [--steps 30] [--batch 16] [--no-compile]
    python benchmarks/gpu_gpt2.py --smoke        # a tiny model for 2 steps on CPU: the code runs

One GPU needs no Ray to measure MFU: this drives the same `Helper` a worker uses (`prepare`,
`autocast`, `backward`) in one process. It measures, side by side in one run:

- tokens/s and MFU of bf16 training through `gg` (MFU = model FLOPs per token × tokens/s ÷ the
  GPU's dense bf16 peak; FLOPs per token = 6·N + 12·layers·heads·head_dim·seq, as in the PaLM
  paper; the peak is the spec sheet's: H100 SXM 989 TFLOP/s, H200 989, A100 312);
- the same model trained by a bare loop (no helper): the ratio gg / bare (goal ≥ 0.98);
- bf16 vs fp32 step time;
- `--grad-ckpt`: peak activation memory saved vs step time added (goal ≥ 60 % saved for ≤ 30 %);
- the node sampler (``meter.telemetry.NodeSampler``, NVML at 1 Hz) beside the bf16 run: what it
  reads (utilisation, memory against torch's own count, power) and the step time with it on vs off.

Without CUDA it says so and exits 0 (unless --smoke). It imports the helper straight from its file
so the GPU machine needs only torch (and nvidia-ml-py for utilisation), not the notebook stack.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}


def load_helper():
    """The worker-side ``gg`` helper. The package root is lazy, so this loads torch and the
    helper only — no Ray, pandas or widgets (the GPU machine has none of them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpugeek_jupyter.workers import helper

    return helper


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50304, seq=1024, width=768, depth=12, heads=12):
        super().__init__()
        self.seq, self.depth, self.heads, self.width = seq, depth, heads, width
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        h = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln(h))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def flops_per_token(self) -> float:
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        return 6 * n + 12 * self.depth * self.heads * (self.width // self.heads) * self.seq


def run(helper_mod, *, device, amp: str, grad_ckpt: bool, use_helper: bool, steps: int, batch: int,
        config: dict, compile_model: bool, sample_s: float = 0.0) -> dict:
    torch.manual_seed(0)
    model = GPT(**config)
    flops = model.flops_per_token()
    opt_args = dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if use_helper:
        options = helper_mod.RunOptions(workers=1, amp=amp, grad_ckpt="Block" if grad_ckpt else False)
        gg = helper_mod.Helper(0, 1, device, options, report=lambda sample: None)
        model = gg.prepare(model)
        optimizer = gg.prepare(torch.optim.AdamW(model.parameters(), fused=device.type == "cuda", **opt_args))
    else:
        model = model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), fused=device.type == "cuda", **opt_args)
    if compile_model:
        model = torch.compile(model)
    x = torch.randint(0, config["vocab"], (batch, config["seq"]), device=device)
    y = torch.randint(0, config["vocab"], (batch, config["seq"]), device=device)
    dtype = torch.bfloat16 if amp == "bf16" else None

    def step():
        if use_helper:
            with gg.autocast():
                loss = model(x, y)
            gg.backward(loss)
        else:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(min(5, steps)):        # warm-up (and compilation)
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    seconds = (time.perf_counter() - start) / steps
    tokens_per_s = batch * config["seq"] / seconds
    out = {"step_s": seconds, "tokens_per_s": tokens_per_s, "flops_per_token": flops,
           "loss": float(loss.detach())}
    if device.type == "cuda":
        out["peak_activation_gib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    if sample_s:
        out["sampler"] = sampled(step, sync, sample_s, device, seconds)
    return out


def sampled(step, sync, window_s: float, device, step_s: float) -> dict:
    """Train for ``window_s`` with the node sampler on, then as long with it off: its readings,
    and the step time each way (alternating halves, so drift hits both)."""
    from gpugeek_jupyter.meter import telemetry

    sampler = telemetry.NodeSampler(interval=1.0, node_id="bench")
    times: dict = {"on": [], "off": []}
    readings: list = []
    n = max(1, int(window_s / 4 / step_s))
    for half in ("on", "off", "on", "off"):
        if half == "off" and sampler is not None:
            readings += sampler.stop()
            info, sampler = sampler.info(), None
        elif half == "on" and sampler is None:
            sampler = telemetry.NodeSampler(interval=1.0, node_id="bench")
        sync()
        began = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        times[half].append((time.perf_counter() - began) / n)
    gpus = [g for r in readings for g in r.get("gpus", [])]
    out = {"info": info, "samples": len(readings), "steps_each": n,
           "step_s_on": sum(times["on"]) / 2, "step_s_off": sum(times["off"]) / 2,
           "gpu_rows": gpus[-3:]}
    if gpus:
        out["gpu_util_median"] = sorted(g["gpu_util"] for g in gpus if "gpu_util" in g)[len(gpus) // 2]
        out["power_w_max"] = max((g.get("power_w", 0) for g in gpus), default=None)
        out["nvml_mem_used_gib"] = gpus[-1].get("gpu_mem_used", 0) / 2**30
    if device.type == "cuda":
        out["torch_reserved_gib"] = torch.cuda.memory_reserved(device) / 2**30
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny model, CPU, 2 steps")
    parser.add_argument("--sample-s", type=float, default=12.0, help="seconds of training beside the sampler")
    parser.add_argument("--out", help="also write the JSON here, after each run")
    parser.add_argument("--only", help="comma-separated runs (gg_bf16,bare_bf16,…): a partial report")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("skipped: no CUDA device here (run it on a GPU machine; --smoke checks the code on CPU)")
        return
    helper = load_helper()
    if args.smoke:
        device, config, steps, batch, compile_model = torch.device("cpu"), dict(
            vocab=256, seq=32, width=32, depth=2, heads=2), 2, 2, False
    else:
        device, config, steps, batch = torch.device("cuda"), {}, args.steps, args.batch
        config = dict(vocab=50304, seq=1024, width=768, depth=12, heads=12)
        compile_model = not args.no_compile
    common = dict(device=device, steps=steps, batch=batch, config=config, compile_model=compile_model)
    plans = {   # the most wanted first: a run that fails leaves the others' figures
        "gg_bf16": dict(amp="bf16", grad_ckpt=False, use_helper=True, sample_s=0.5 if args.smoke else args.sample_s),
        "bare_bf16": dict(amp="bf16", grad_ckpt=False, use_helper=False),
        "gg_bf16_ckpt": dict(amp="bf16", grad_ckpt=True, use_helper=True),
        "gg_fp32": dict(amp="off", grad_ckpt=False, use_helper=True),
        "gg_bf16_eager": dict(amp="bf16", grad_ckpt=False, use_helper=True, compile_model=False),
        "gg_bf16_ckpt_eager": dict(amp="bf16", grad_ckpt=True, use_helper=True, compile_model=False),
    }
    if args.only:
        plans = {k: v for k, v in plans.items() if k in args.only.split(",")}
    results, failed = {}, {}
    for key, plan in plans.items():
        try:
            results[key] = run(helper, **{**common, **plan})
        except Exception as exc:  # noqa: BLE001 - a benchmark reports every run it could make
            failed[key] = f"{type(exc).__name__}: {str(exc)[:500]}"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.out:
            Path(args.out).write_text(json.dumps({"runs": results, "failed": failed}, indent=1, default=float))
    if failed or len(results) < 6:
        print(json.dumps({"runs": results, "failed": failed}, indent=1, default=float))
        sys.exit(1 if failed else 0)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    g, bare, fp32, ckpt = (results[k] for k in ("gg_bf16", "bare_bf16", "gg_fp32", "gg_bf16_ckpt"))
    summary = {
        "device": name, "peak_bf16_tflops": peak, "batch": batch, "steps": steps,
        "tokens_per_s": g["tokens_per_s"],
        "mfu": g["tokens_per_s"] * g["flops_per_token"] / (peak * 1e12) if peak else None,
        "gg_vs_bare": g["tokens_per_s"] / bare["tokens_per_s"],
        "bf16_vs_fp32_speedup": fp32["step_s"] / g["step_s"],
        "grad_ckpt_step_time_added": ckpt["step_s"] / g["step_s"] - 1,
    }
    if "peak_activation_gib" in g:
        summary["grad_ckpt_activation_memory_saved"] = 1 - ckpt["peak_activation_gib"] / g["peak_activation_gib"]
    eager, eager_ckpt = results["gg_bf16_eager"], results["gg_bf16_ckpt_eager"]
    summary["mfu_eager"] = (eager["tokens_per_s"] * eager["flops_per_token"] / (peak * 1e12)) if peak else None
    summary["grad_ckpt_eager_step_time_added"] = eager_ckpt["step_s"] / eager["step_s"] - 1
    if "peak_activation_gib" in eager:
        summary["grad_ckpt_eager_activation_memory_saved"] = (
            1 - eager_ckpt["peak_activation_gib"] / eager["peak_activation_gib"])
    if "sampler" in g:
        summary["sampler_step_time_added"] = g["sampler"]["step_s_on"] / g["sampler"]["step_s_off"] - 1
    report = json.dumps({"summary": summary, "runs": results}, indent=1, default=float)
    if args.out:
        Path(args.out).write_text(report)
    print(report)
    assert all(math.isfinite(r["loss"]) for r in results.values())


if __name__ == "__main__":
    main()
