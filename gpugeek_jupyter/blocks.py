"""A model's repeated blocks — the transformer layers, say: what activation checkpointing wraps
and FSDP shards on the workers, and what the planner measures. One definition, so the plan
sizes exactly what the run checkpoints."""

from __future__ import annotations

from torch import nn


def repeated_blocks(model: nn.Module, class_name: str | None = None) -> list[nn.Module]:
    """The blocks to checkpoint: children of every ``nn.ModuleList`` (or modules of ``class_name``)."""
    if class_name:
        return [m for m in model.modules() if type(m).__name__ == class_name]
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            blocks.extend(child for child in module if any(True for _ in child.parameters()))
    return blocks
