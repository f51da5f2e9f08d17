"""Small real models the tests train on CPU."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block (attention + MLP), as in GPT-2."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, width: int = 64, depth: int = 4, heads: int = 4,
                 max_seq: int = 1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(max_seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class MLP(nn.Module):
    def __init__(self, width: int = 128):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def logged_steps(steps: int, pause_s: float, *, shown: bool = False, log: str | None = None) -> str:
    """A ``%%gpugeek run`` cell: a DDP loop of ``steps`` steps through ``gg.steps`` (so it resumes
    from a checkpoint), rank 0 appending each step and its time to the pushed path ``log`` (or to
    ``log`` itself, when given); it ends with ``final_step``. ``shown``: each step's loss is also
    logged and rank 0 prints "step N", and the cell keeps its ``weights``."""
    show = "\n    gg.log(loss=loss.item())" if shown else ""
    say = "\n        print('step', gg.step, flush=True)" if shown else ""
    keep = "\nweights = [p.detach().clone() for p in model.parameters()]" if shown else ""
    path = repr(log) if log else "log"
    return f"""
import time, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = gg.prepare(model, optimizer)
data = [torch.randn(8, 4, generator=torch.Generator().manual_seed(i)) for i in range({steps})]
for batch in gg.steps(data):
    loss = model(batch).pow(2).mean()
    gg.backward(loss){show}
    if rank == 0:
        with open({path}, "a") as f:
            f.write(f"{{gg.step}} {{time.time()}}\\n"){say}
    time.sleep({pause_s})
final_step = gg.step{keep}
"""


# A DDP step on every rank: whether the ranks' gradients agree after all-reduce, and the addresses
# the ranks ran on (rank 0's value: ``(equal, sorted addresses)``).
DDP_ACROSS_HOSTS = """
import torch, torch.distributed as dist
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
model(torch.randn(16, 8) + rank).pow(2).mean().backward()
grads = [torch.zeros_like(model.module.weight.grad) for _ in range(world_size)]
dist.all_gather(grads, model.module.weight.grad)
ips = [None] * world_size
dist.all_gather_object(ips, __import__("ray").util.get_node_ip_address())
(all(torch.equal(g, grads[0]) for g in grads), sorted(set(ips)))
"""


def at_step(log: Path, step: int, timeout: float = 120) -> None:
    """Back once rank 0 of a ``logged_steps`` cell has logged ``step`` steps (or after ``timeout``),
    however long a busy machine takes to start the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(log.read_text().splitlines() if log.exists() else []) < step:
        time.sleep(0.02)
