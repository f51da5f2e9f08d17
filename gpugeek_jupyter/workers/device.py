"""What a worker's reports say of its device: the memory it holds (the GPU's peak, else the
process's resident memory) and NVML's utilisation of its GPU."""

from __future__ import annotations

import os

import torch


def memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import psutil

    return int(psutil.Process(os.getpid()).memory_info().rss)


_nvml = None


def gpu_utilisation(device: torch.device) -> float | None:
    """NVML's utilisation of this worker's GPU, in %; None without one."""
    global _nvml
    if device.type != "cuda":
        return None
    try:
        import pynvml

        if _nvml is None:
            pynvml.nvmlInit()
            _nvml = pynvml
        # NVML numbers GPUs physically, ignoring CUDA_VISIBLE_DEVICES: find ours by its UUID
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:  # noqa: BLE001 - no NVML here (or not for this GPU): the report goes without it
        return None
