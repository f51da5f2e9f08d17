"""A CUDA out-of-memory error, explained: how much the step held, how much more it asked for, what
the GPU has, and what to change.

The worker reads the GPU at the moment it ran out (``memory_at``), before the cell's tensors are
freed: afterwards the numbers describe an empty GPU. The kernel turns that reading and the run's
options into a few lines (``diagnosis``). Needs torch only, so the GPU benchmark can check it on a
real OOM without Ray.
"""

from __future__ import annotations

import re

from .options import RunOptions

GIB = 2**30
_ASKED = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)\b")
_SCALE = {"GiB": GIB, "MiB": 2**20, "KiB": 2**10, "B": 1}
# torch's own account of the GPU follows "Tried to allocate …": the reading says it in fewer words
_TORCH_DETAIL = re.compile(r"(?<=\.) (?=GPU \d+ has a total capacity)")


def ran_out(exc: BaseException) -> bool:
    return "OutOfMemoryError" in type(exc).__name__ or "out of memory" in str(exc)


def memory_at(exc: BaseException, device) -> dict | None:
    """What the GPU held when ``exc`` was raised: {peak, held, total, asked} in bytes (asked: the
    allocation that failed, from torch's message, when it says). None off CUDA."""
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    found = _ASKED.search(str(exc))
    return {"peak": torch.cuda.max_memory_allocated(device), "held": torch.cuda.memory_allocated(device),
            "total": torch.cuda.get_device_properties(device).total_memory,
            "asked": int(float(found.group(1)) * _SCALE[found.group(2)]) if found else None}


def release(device) -> None:
    """Give the failed cell's cached blocks back, so the next cell starts on an empty GPU."""
    import gc

    import torch

    gc.collect()
    if getattr(device, "type", None) == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def diagnosis(last_line: str, opts: RunOptions, memory: dict | None = None,
              planned_gib: float | None = None) -> str:
    """The lines shown under the traceback."""
    said = _TORCH_DETAIL.split(last_line.strip(), maxsplit=1)[0] if memory else last_line.strip()
    lines = ["", "gpugeek: out of GPU memory. " + said[:300]]
    if memory:
        need = max(memory["peak"], memory["held"] + (memory["asked"] or 0))
        said = (f"the step held {memory['held'] / GIB:.1f} GiB (peak {memory['peak'] / GIB:.1f} GiB) of the "
                f"GPU's {memory['total'] / GIB:.1f} GiB")
        if memory["asked"]:
            said += f" and asked for {memory['asked'] / GIB:.2f} GiB more"
        if need > memory["total"]:
            said += f": it needs at least {need / GIB:.1f} GiB"
        lines.append(said)
    if planned_gib is not None:
        lines.append(f"the last plan estimated {planned_gib:.1f} GiB per GPU for {opts.workers} worker(s)")
    fixes = []
    if not opts.grad_ckpt:
        fixes.append("--grad-ckpt (recompute activations in backward)")
    fixes.append("a smaller batch with --accumulate K (same effective batch)")
    if opts.amp != "bf16":
        fixes.append("--amp bf16 (half-size activations)")
    if opts.strategy != "fsdp":
        fixes.append("--strategy fsdp (shard weights, gradients and optimizer state)")
    lines.append("try: " + "; ".join(fixes))
    return "\n".join(lines)
