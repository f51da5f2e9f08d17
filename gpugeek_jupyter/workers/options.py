"""What ``%%gpugeek run`` asks of the workers, checked in one place, and the ``Report`` a worker
sends home. Torch-free: the kernel validates flags, and the widgets read reports, without
loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypedDict

from ..errors import GpugeekError
from ..line.codec import record
from ..units import number
from ..vocab import Amp, Strategy


@record
@dataclass(frozen=True)
class RunOptions:
    """Only ``workers``, ``gpus_per_worker`` and ``collective_timeout`` shape the group; the rest
    are read by ``gg`` at each call, so changing them keeps the namespace. One shape from the magic
    to the worker: a remote cluster's line carries it as a record (``line/messages.record``)."""

    workers: int = 2
    gpus_per_worker: float = 0.0
    amp: str = Amp.OFF
    grad_ckpt: str | bool = False     # True: nn.ModuleList children; a string: that block class
    accumulate: int = 1
    clip: float | None = None
    strategy: str = Strategy.DDP
    checkpoint_every: int | None = None
    checkpoint_dir: str | None = None
    collective_timeout: float = 300.0     # a collective waiting longer fails its cell: never a hang
    argv: tuple[str, ...] | None = None   # a script's sys.argv (``%gpugeek torchrun``): the cell is that script
    script_dir: str | None = None      # that script's own folder: first on sys.path, as under torchrun
    folder: str | None = None          # where the cell runs: the kernel's current folder, on a cluster on this machine
    name_writes: bool = False          # a remote --working-dir's copy: what a cell writes is named at its end
    keep_dir: str | None = None        # where a framework's own checkpoints are kept (``saves``): set by the job
    retry: int = 0                     # the cell run again after a lost worker or a preemption (1, 2, …)

    def source_name(self, cell_id: int) -> str:
        """What a remote traceback calls the code: the cell, or the script it is."""
        return f"<cell {cell_id}>" if self.argv is None else f"<script {self.argv[0]}>"


def options(*, workers: int = 2, gpus_per_worker: float | None = None, amp: str = "off",
            grad_ckpt: str | bool = False, accumulate: int = 1, clip: float | None = None,
            strategy: str = "ddp", checkpoint_every: int | None = None,
            checkpoint_dir: str | None = None, collective_timeout: float | None = None,
            name: str | None = None, argv: tuple[str, ...] | None = None,
            script_dir: str | None = None) -> RunOptions:
    """Check the flags in one place, one line per mistake."""
    workers = number(workers, "--workers", whole=True, least=1)
    gpus_per_worker = number(gpus_per_worker, "--gpus-per-worker", least=0, hint=" (0: CPUs)")
    if gpus_per_worker is not None and gpus_per_worker > 1:
        raise GpugeekError(f"--gpus-per-worker {gpus_per_worker!r}: a worker is one rank on at most one GPU "
                           f"(a fraction shares one) — for more GPUs use more --workers")
    amp = Amp.parse(amp, "--amp").value
    strategy = Strategy.parse(strategy, "--strategy").value
    accumulate = number(accumulate, "--accumulate", whole=True, least=1)
    clip = number(clip, "--clip", above=0, hint=" (a gradient norm)")
    checkpoint_every = number(checkpoint_every, "--checkpoint-every", whole=True, least=1, hint=" (steps)")
    collective_timeout = number(collective_timeout, "--collective-timeout", least=5, hint=" (seconds)")
    if amp == Amp.FP16 and strategy == Strategy.FSDP:
        raise GpugeekError("--amp fp16 with --strategy fsdp needs a sharded gradient scaler — use --amp bf16")
    return RunOptions(workers=workers, gpus_per_worker=float(gpus_per_worker or 0.0), amp=amp,
                      grad_ckpt=grad_ckpt, accumulate=accumulate, clip=clip, strategy=strategy,
                      checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir,
                      collective_timeout=float(collective_timeout or RunOptions.collective_timeout),
                      argv=tuple(str(a) for a in argv) if argv is not None else None, script_dir=script_dir)


def gg_only(opts: RunOptions) -> list[str]:
    """The flags given that only the ``gg`` helper applies (``gg.prepare``, ``gg.autocast``,
    ``gg.backward``, ``gg.steps``): a cell that never calls ``gg`` is told they do nothing."""
    given = {"--amp": opts.amp != Amp.OFF, "--grad-ckpt": bool(opts.grad_ckpt), "--accumulate": opts.accumulate > 1,
             "--clip": opts.clip is not None, "--strategy": opts.strategy != Strategy.DDP,
             "--checkpoint-every": opts.checkpoint_every is not None}
    return [flag for flag, on in given.items() if on]


@dataclass(frozen=True)
class CellCall:
    """One cell as a rank gets it, pickled whole (Ray serialises each argument on its own): rank
    0's with the variables it pulls, its value wanted and its job; the other ranks' without."""

    source: str
    filename: str
    options: RunOptions
    cell_id: int
    pull: list[str] = field(default_factory=list)
    want_value: bool = False
    job: dict | None = None

    @classmethod
    def for_rank0(cls, source: str, options: RunOptions, cell_id: int, pull: list[str], job: dict | None) -> CellCall:
        """Rank 0's call, as a kernel's group and a keeper's both send it: named after the cell,
        its value wanted."""
        return cls(source, options.source_name(cell_id), options, cell_id, pull=pull, want_value=True, job=job)

    def for_peers(self) -> CellCall:
        """The call as the other ranks get it: no value back, nothing pulled, no journal."""
        return replace(self, pull=[], want_value=False, job=None)


class Report(TypedDict, total=False):
    """One worker's report, at most once a second (``gg.log``): what the ledger stores as a
    sample and the job monitor draws. Keys beyond these are the user's own metrics."""

    rank: int
    t: float
    step: int | None
    loss: float
    samples_per_s: float
    tokens_per_s: float
    memory_bytes: int
    gpu_util: float
    total_steps: int
    loop_start: float
    logged: dict       # every gg.log since the last report, as columns: {"step": [...], "loss": [...]}

