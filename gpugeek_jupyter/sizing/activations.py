"""Measure what a real model saves for backward, instead of guessing.

We run the user's model forward on a few tiny batches (batch 1 and 2; short sequences), count
the bytes autograd keeps for backward with ``saved_tensors_hooks`` and the FLOPs with torch's
``FlopCounterMode``, then fit how both grow with batch (linearly) and sequence length
(quadratically, which covers attention) to reach the requested size. Models too large to run on
the CPU are traced on the meta device at full size instead.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from ..blocks import repeated_blocks
from ..errors import GpugeekError

InputMaker = Callable[[int, "int | None", torch.device], tuple]
SEQ_POINTS = (64, 128, 256)
META_ABOVE_PARAMS = 1.5e9  # run bigger CPU-resident models on the meta device


@dataclass(frozen=True)
class Sample:
    """What one forward pass at (batch, seq) saved for backward, and what it computed."""

    saved_bytes: float
    largest_block_bytes: float
    forward_flops: float


def input_maker(model: nn.Module, example: object = None) -> InputMaker:
    """How to build an input batch of any size for ``model``.

    From ``example`` (one real batch) when given; otherwise from the first layer that holds
    parameters: token ids for an ``nn.Embedding``, features for an ``nn.Linear``.
    """
    if example is not None:
        tensors = example if isinstance(example, (tuple, list)) else (example,)
        if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
            raise GpugeekError("--example is not a tensor — give a tensor (or a tuple of tensors) holding one batch")

        def from_example(batch: int, seq: int | None, device: torch.device) -> tuple:
            out = []
            for t in tensors:
                shape = list(t.shape)
                shape[0] = batch
                if seq is not None and t.dim() >= 2:
                    shape[1] = seq
                if t.is_floating_point():
                    out.append(torch.randn(shape, dtype=t.dtype, device=device))
                else:
                    high = max(int(t.max()) + 1, 1) if t.numel() else 2
                    out.append(torch.randint(0, high, shape, dtype=t.dtype, device=device))
            return tuple(out)

        return from_example

    first = next((m for m in model.modules() if not list(m.children()) and
                  any(True for _ in m.parameters(recurse=False))), None)
    if isinstance(first, nn.Embedding):
        vocab = first.num_embeddings

        def tokens(batch: int, seq: int | None, device: torch.device) -> tuple:
            if seq is None:
                raise GpugeekError(
                    f"{type(model).__name__} takes token sequences — give their length, e.g. --seq 1024")
            return (torch.randint(0, vocab, (batch, seq), device=device),)

        return tokens
    if isinstance(first, nn.Linear):
        width = first.in_features

        def features(batch: int, seq: int | None, device: torch.device) -> tuple:
            shape = (batch, seq, width) if seq else (batch, width)
            return (torch.randn(shape, device=device, dtype=first.weight.dtype),)

        return features
    kind = type(first).__name__ if first is not None else "no layer with parameters"
    raise GpugeekError(
        f"can't tell what input {type(model).__name__} takes (it starts with {kind}) "
        "— pass --example VAR holding one input batch"
    )


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


class _SavedCounter:
    """Counts bytes autograd saves, once per storage, leaving out the model's own parameters."""

    def __init__(self, params: list[torch.Tensor]):
        self._params = {self._key(p) for p in params}
        self.storages: dict[object, int] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> object:
        storage = t.untyped_storage()
        return (t.device, storage.data_ptr()) if t.device.type != "meta" else id(storage)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = self._key(t)
        if key not in self._params:
            self.storages[key] = t.untyped_storage().nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _run(model: nn.Module, inputs: tuple, precision: str, blocks: list[nn.Module],
         grad_ckpt: bool, params: dict[str, torch.Tensor] | None) -> Sample:
    """One forward pass, counting saved bytes per block; checkpointed blocks when asked."""
    device = inputs[0].device
    tensors = list(params.values()) if params is not None else list(model.parameters())
    counter = _SavedCounter(tensors)
    block_bytes: list[int] = []
    handles = []
    if not grad_ckpt:
        for block in blocks:
            start: list[int] = []
            handles.append(block.register_forward_pre_hook(
                lambda _m, _a, start=start: start.append(counter.total)))
            handles.append(block.register_forward_hook(
                lambda _m, _a, _o, start=start: block_bytes.append(counter.total - start.pop())))
    patched = []
    if grad_ckpt:
        for block in blocks:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
            patched.append(block)
    flops = FlopCounterMode(display=False)
    try:
        with torch.enable_grad(), _autocast(device, precision), flops, \
                torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            output = model(*inputs) if params is None else torch.func.functional_call(model, params, inputs)
            # The loss keeps a tensor the size of the output (e.g. log-probabilities).
            for out in _tensors(output):
                if out.requires_grad:
                    counter.storages.setdefault(("output", id(out)), out.untyped_storage().nbytes())
    finally:
        for handle in handles:
            handle.remove()
        for block in patched:
            del block.forward
    return Sample(float(counter.total), float(max(block_bytes, default=0)),
                  float(flops.get_total_flops()))


def _tensors(output: object) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict) or hasattr(output, "values"):
        return [v for v in output.values() if isinstance(v, torch.Tensor)]
    if isinstance(output, (tuple, list)):
        return [v for v in output if isinstance(v, torch.Tensor)]
    return []


@dataclass(frozen=True)
class Measurement:
    """Activations and FLOPs for one training micro-batch at the requested size."""

    activation_bytes: float
    forward_flops: float
    method: str


def measure(model: nn.Module, batch: int, seq: int | None, precision: str, grad_ckpt: bool,
            example: object = None, ckpt_class: str | None = None) -> Measurement:
    """Bytes saved for backward and forward FLOPs of one ``batch`` × ``seq`` micro-batch."""
    make = input_maker(model, example)
    blocks = repeated_blocks(model, ckpt_class)
    if grad_ckpt and not blocks:
        raise GpugeekError(
            f"--grad-ckpt found no repeated blocks in {type(model).__name__} (no nn.ModuleList) "
            "— name the block class to checkpoint with --grad-ckpt-class"
        )
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    n_params = sum(p.numel() for p in model.parameters())
    # Leave the user's model exactly as it was: mode, buffers (BatchNorm statistics), RNG.
    was_training = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            if device.type == "cpu" and n_params > META_ABOVE_PARAMS:
                return _measure_meta(model, make, blocks, batch, seq, precision, grad_ckpt)
            return _measure_scaled(model, make, blocks, batch, seq, precision, grad_ckpt, device)
    except GpugeekError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's forward failed on our synthetic batch
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise GpugeekError(
            f"running {type(model).__name__} on a test batch failed ({type(exc).__name__}: "
            f"{first_line}) — pass --example VAR with one real input batch, or use --params"
        ) from None
    finally:
        model.train(was_training)
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])


def _point(model, make, blocks, b, s, precision, grad_ckpt, device) -> Sample:
    inputs = make(b, s, device)
    plain = _run(model, inputs, precision, blocks, False, None)
    if not grad_ckpt:
        return plain
    ckpt = _run(model, inputs, precision, blocks, True, None)
    # Backward recomputes one block at a time: its activations come back on top of the rest.
    return Sample(ckpt.saved_bytes + plain.largest_block_bytes, plain.largest_block_bytes,
                  plain.forward_flops)


def _measure_scaled(model, make, blocks, batch, seq, precision, grad_ckpt, device) -> Measurement:
    """Fit ``fixed + batch × per_sample(seq)``: fixed parts (e.g. autocast's weight copies) don't
    grow with the batch, per-sample parts grow linearly in it and at most quadratically in seq.
    Batches of 2 and 4, since BatchNorm cannot train on a batch of 1."""
    s_fit = seq if seq is None or seq <= SEQ_POINTS[-1] else SEQ_POINTS[-1]
    two = _point(model, make, blocks, 2, s_fit, precision, grad_ckpt, device)
    four = _point(model, make, blocks, 4, s_fit, precision, grad_ckpt, device)
    per_sample = [(four.saved_bytes - two.saved_bytes) / 2, (four.forward_flops - two.forward_flops) / 2]
    fixed = [two.saved_bytes - 2 * per_sample[0], two.forward_flops - 2 * per_sample[1]]
    if s_fit == seq:
        return Measurement(fixed[0] + batch * per_sample[0], fixed[1] + batch * per_sample[1],
                           "measured on batches of 2 and 4, scaled to the batch")
    points = [_point(model, make, blocks, 2, s, precision, grad_ckpt, device)
              for s in SEQ_POINTS[:-1]]
    saved = [(p.saved_bytes - fixed[0]) / 2 for p in points] + [per_sample[0]]
    flops = [(p.forward_flops - fixed[1]) / 2 for p in points] + [per_sample[1]]
    act = fixed[0] + batch * _quadratic(SEQ_POINTS, saved, seq)
    fwd = fixed[1] + batch * _quadratic(SEQ_POINTS, flops, seq)
    lengths = "/".join(str(s) for s in SEQ_POINTS)
    return Measurement(act, fwd, f"measured at sequence lengths {lengths}, fitted and scaled")


def _quadratic(xs: tuple[int, ...], ys: list[float], x: float) -> float:
    """Lagrange interpolation through three points (exact for a + b·s + c·s²)."""
    total = 0.0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        term = yi
        for j, xj in enumerate(xs):
            if j != i:
                term *= (x - xj) / (xi - xj)
        total += term
    return max(total, 0.0)


def _measure_meta(model, make, blocks, batch, seq, precision, grad_ckpt) -> Measurement:
    """Full-size forward on meta tensors: shapes only, no memory, no compute."""
    meta = torch.device("meta")
    params = {name: torch.empty_like(p, device=meta).requires_grad_(p.requires_grad)
              for name, p in model.named_parameters()}
    params.update({name: torch.empty_like(b, device=meta) for name, b in model.named_buffers()})
    inputs = make(batch, seq, torch.device("cpu"))
    inputs = tuple(torch.empty_like(t, device=meta) for t in inputs)
    sample = _run(model, inputs, "fp32", blocks, False, params)
    scale = 0.5 if precision in ("bf16", "fp16") else 1.0  # meta tensors ignore autocast
    act = sample.saved_bytes * scale
    if grad_ckpt and blocks:
        # Keep each block's input plus one block's activations during recompute.
        act = act - sample.largest_block_bytes * scale * (len(blocks) - 1)
    return Measurement(max(act, 0.0), sample.forward_flops,
                       "traced on the meta device at full size (half-precision bytes halved)")
