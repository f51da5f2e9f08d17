"""GPU memory for one training run, per GPU: weights, gradients, optimizer state, activations.

Mixed precision here means ``torch.amp`` autocast, which is what ``%%gpugeek run --amp`` does:
weights, gradients and optimizer state stay fp32 (Adam: 4 + 4 + 8 = 16 bytes per parameter) and
only activations are half precision. FSDP shards weights, gradients and optimizer state over the
GPUs; activation checkpointing keeps each block's input and recomputes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads when a model is planned, not when the package is imported
    from torch import nn

from ..errors import GpugeekError

GIB = 1024**3
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}  # tensors of param size: m, v / momentum
STEP_TENSOR_BYTES = 4  # Adam keeps a float32 'step' scalar per parameter tensor
CUDA_OVERHEAD_GIB = 1.0  # CUDA context, cuBLAS workspace, NCCL buffers (an estimate)
FRAGMENTATION = 0.05  # allocator slack on top of what tensors hold (an estimate)

# Formula path (a parameter count, no model): a GPT-style decoder whose hidden size is 128 × its
# depth (as Llama's are), with activations per layer per token of 34·h bytes in 16 bits when
# attention is fused (Korthikanti et al., 2022, "Reducing Activation Recomputation").
ASSUMED_VOCAB = 32_000
ACT_BYTES_PER_H = 34


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    vocab: int = ASSUMED_VOCAB

    @staticmethod
    def for_params(n_params: float) -> Shape:
        """Depth and width of a decoder with about ``n_params`` parameters (12·L·h² + V·h)."""
        best = Shape(1, 128)
        for layers in range(1, 161):
            hidden = 128 * layers
            if 12 * layers * hidden**2 + ASSUMED_VOCAB * hidden > n_params:
                break
            best = Shape(layers, hidden)
        if best.layers == 1:  # tiny models: one layer, width from the count
            hidden = max(64, int((n_params / 12) ** 0.5) // 64 * 64)
            best = Shape(1, hidden)
        return best


@dataclass
class MemoryEstimate:
    """GiB per GPU. ``static_gib`` (weights+grads+optimizer) is before any FSDP sharding."""

    n_params: float
    trainable_params: float
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    strategy: str
    gpus: int | None
    activations_method: str
    forward_flops_per_step: float
    notes: list[str] = field(default_factory=list)

    @property
    def static_gib(self) -> float:
        return self.weights_gib + self.gradients_gib + self.optimizer_gib

    def per_gpu(self, world_size: int) -> dict[str, float]:
        """The breakdown on each of ``world_size`` GPUs (FSDP shards the static part)."""
        shard = world_size if self.strategy == "fsdp" else 1
        parts = {
            "weights": self.weights_gib / shard,
            "gradients": self.gradients_gib / shard,
            "optimizer": self.optimizer_gib / shard,
            "activations": self.activations_gib,
        }
        parts["overhead"] = total_with_overhead(sum(parts.values())) - sum(parts.values())
        parts["total"] = sum(parts.values())
        return parts


def total_with_overhead(tensor_gib: float) -> float:
    return tensor_gib * (1 + FRAGMENTATION) + CUDA_OVERHEAD_GIB


def from_params(n_params: float, precision: str = "bf16", optimizer: str = "adam",
                batch: int = 1, seq: int = 2048, grad_ckpt: bool = False,
                strategy: str = "ddp", gpus: int | None = None) -> MemoryEstimate:
    """Estimate from a parameter count alone, for a GPT-style decoder of that size."""
    shape = Shape.for_params(n_params)
    state_tensors = OPTIMIZER_STATES[optimizer]
    act_scale = 1 if precision in ("bf16", "fp16") else 2
    tokens = batch * seq
    per_layer = ACT_BYTES_PER_H * shape.hidden * tokens * act_scale
    if grad_ckpt:
        layers_bytes = shape.layers * 2 * shape.hidden * tokens * act_scale + per_layer
    else:
        layers_bytes = shape.layers * per_layer
    logits_bytes = 2 * tokens * shape.vocab * 4  # fp32 logits and log-probabilities for the loss
    return MemoryEstimate(
        n_params=n_params,
        trainable_params=n_params,
        weights_gib=4 * n_params / GIB,
        gradients_gib=4 * n_params / GIB,
        optimizer_gib=4 * state_tensors * n_params / GIB,
        activations_gib=(layers_bytes + logits_bytes) / GIB,
        strategy=strategy,
        gpus=gpus,
        activations_method=(
            f"formula for an assumed decoder shape ({shape.layers} layers × {shape.hidden} hidden, "
            f"vocab {shape.vocab}, fused attention)"
        ),
        forward_flops_per_step=2 * n_params * tokens,
    )


def from_model(model: nn.Module, precision: str = "bf16", optimizer: str = "adam",
               batch: int = 1, seq: int | None = None, grad_ckpt: bool = False,
               strategy: str = "ddp", gpus: int | None = None, example: object = None,
               ckpt_class: str | None = None) -> MemoryEstimate:
    """Exact weight/gradient/optimizer bytes from the model's tensors; activations measured."""
    from torch import nn

    from . import activations

    if not isinstance(model, nn.Module):
        raise GpugeekError(f"--model names a {type(model).__name__}, not a torch.nn.Module — name the model's variable")
    params = list(model.parameters())
    name = type(model).__name__
    if any(isinstance(p, nn.parameter.UninitializedParameter) for p in params):
        raise GpugeekError(f"{name} has lazy layers not yet sized — run one batch through it first")
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise GpugeekError(f"{name} has no trainable parameters — nothing to plan")
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    weight_bytes += sum(b.numel() * b.element_size() for b in model.buffers())
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)
    optimizer_bytes = OPTIMIZER_STATES[optimizer] * grad_bytes
    if optimizer in ("adam", "adamw"):
        optimizer_bytes += STEP_TENSOR_BYTES * len(trainable)
    measured = activations.measure(model, batch, seq, precision, grad_ckpt, example, ckpt_class)
    if measured.forward_flops <= 0:
        raise GpugeekError(f"counted no FLOPs in {name}'s forward pass (no matmul or convolution "
                           "torch can count) — plan it with --params instead")
    notes = []
    if any(p.dtype != params[0].dtype for p in params):
        notes.append("the model mixes parameter dtypes; bytes are counted per tensor")
    return MemoryEstimate(
        n_params=float(sum(p.numel() for p in params)),
        trainable_params=float(sum(p.numel() for p in trainable)),
        weights_gib=weight_bytes / GIB,
        gradients_gib=grad_bytes / GIB,
        optimizer_gib=optimizer_bytes / GIB,
        activations_gib=measured.activation_bytes / GIB,
        strategy=strategy,
        gpus=gpus,
        activations_method=measured.method,
        forward_flops_per_step=measured.forward_flops,
        notes=notes,
    )
