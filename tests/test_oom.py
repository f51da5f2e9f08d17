"""What an out-of-memory error says: numbers read on the worker, the fixes that apply."""

from __future__ import annotations

import torch

from gpugeek_jupyter.workers import oom
from gpugeek_jupyter.workers.options import RunOptions

GIB = 2**30
MESSAGE = ("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity of 139.80 GiB "
           "of which 3.10 GiB is free.")


def test_torchs_error_is_told_from_others():
    assert oom.ran_out(torch.cuda.OutOfMemoryError(MESSAGE))
    assert oom.ran_out(RuntimeError("CUDA error: out of memory"))
    assert not oom.ran_out(ValueError("bad batch"))


def test_a_cpu_worker_has_no_reading():
    assert oom.memory_at(torch.cuda.OutOfMemoryError(MESSAGE), torch.device("cpu")) is None


def test_the_reading_becomes_how_far_off_the_step_was():
    memory = {"peak": int(131.5 * GIB), "held": int(130 * GIB), "total": int(139.8 * GIB), "asked": 12 * GIB}
    text = oom.diagnosis("torch.OutOfMemoryError: " + MESSAGE, RunOptions(workers=1, amp="bf16"), memory, 20.14)
    lines = text.splitlines()
    assert lines[1] == ("gpugeek: out of GPU memory. torch.OutOfMemoryError: CUDA out of memory. "
                        "Tried to allocate 12.00 GiB."), "the reading below says the rest"
    assert lines[2] == ("the step held 130.0 GiB (peak 131.5 GiB) of the GPU's 139.8 GiB and asked for "
                        "12.00 GiB more: it needs at least 142.0 GiB")
    assert lines[3] == "the last plan estimated 20.1 GiB per GPU for 1 worker(s)"
    assert lines[4].startswith("try: --grad-ckpt") and "--amp bf16" not in lines[4]


def test_the_fixes_already_in_use_are_not_offered():
    text = oom.diagnosis("OutOfMemoryError", RunOptions(workers=2, amp="fp16", grad_ckpt=True, strategy="fsdp"))
    assert text.splitlines()[-1] == ("try: a smaller batch with --accumulate K (same effective batch); "
                                     "--amp bf16 (half-size activations)")
