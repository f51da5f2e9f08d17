"""``gg`` on the workers: the few calls that turn a single-process training loop into DDP/FSDP
with mixed precision, gradient checkpointing, accumulation, clipping and checkpoint/resume::

    model, optimizer, loader = gg.prepare(model, optimizer, loader)
    for batch in gg.steps(loader, epochs=2):
        with gg.autocast():
            loss = model(batch).loss
        gg.backward(loss)                 # scale, accumulate, no_sync, clip, step, zero_grad
        gg.log(loss=loss.item())

Every switch comes from ``%%gpugeek run`` flags, so the cell stays the same in bf16 or fp32, on
one worker or eight. The library does the work: DDP / FSDP2 (``fully_shard``), ``torch.amp``,
torch's checkpoint wrapper, ``DistributedSampler``, ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from . import checkpoints, notice, storage
from .device import gpu_utilisation, memory_bytes
from .options import RunOptions
from .saves import Saves

# what a cell calls on ``gg`` (the reference page is made from these names and their docstrings;
# ``begin``, ``seen`` and ``flush`` are the framework reporters' and the worker's)
IN_CELL = ("prepare", "steps", "autocast", "backward", "log", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "resume_from", "saves")
REPORT_EVERY_S = 1.0
LOGGED_MAX = 2000        # values of one metric a report carries by step, at most (the rest: its latest)


class Helper:
    """One per worker; lives in the worker's namespace as ``gg`` for the life of the group."""

    def __init__(self, rank: int, world_size: int, device: torch.device, options: RunOptions,
                 report: Callable[[dict], None]):
        self.rank, self.world_size, self.device, self.options = rank, world_size, device, options
        self._report = report
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler = None
        self.step = 0                  # optimizer steps taken (what checkpoints count)
        self.micro = 0                 # micro-batches seen since the last optimizer step
        self.resumed_at: int | None = None
        self.shared_checked: str | None = None     # the checkpoint dir every host was seen to share
        self.checkpoint_place: storage.Place | None = None
        self._last_report, self._metrics = 0.0, {}
        self._logged: dict[str, list] = {}    # every gg.log since the last report, as columns by step
        self._window = (time.perf_counter(), 0, 0)   # (t0, samples, tokens) since the last report
        self._sharded = False          # the model was just sharded: the optimizer must follow
        self.total_steps: int | None = None   # what the notebook's progress bar counts to
        self.loop_start = 0
        self.notice: notice.NoticeWatch | None = None    # on a node that can be preempted
        self._pending: dict | None = None     # a framework's latest metrics, not yet numbers (``seen``)
        self._saves: Saves | None = None
        self.configure(options)

    def configure(self, options: RunOptions) -> None:
        """This cell's flags (the group keeps its namespace across flag changes); its reports
        start afresh — a metric, a total or a rate of the cell before is not this one's."""
        self.options = options
        self._metrics, self._logged, self._pending = {}, {}, None
        self.total_steps, self.loop_start = None, 0
        self._window = (time.perf_counter(), 0, 0)
        if options.amp == "fp16" and self.scaler is None:
            self.scaler = torch.amp.GradScaler(self.device.type)
        elif options.amp != "fp16":
            self.scaler = None

    # -- prepare --------------------------------------------------------------------------------

    def prepare(self, *objects):
        """Return ``objects`` in order, each made ready for this worker and the group: a model moved
        to this worker's device and wrapped (DDP, or FSDP2 with ``--strategy fsdp``; its repeated
        blocks checkpointed with ``--grad-ckpt``), an optimizer for it, a ``DataLoader`` given a
        ``DistributedSampler`` so that each rank sees its share::

            model, optimizer, loader = gg.prepare(model, optimizer, loader)
        """
        out = []
        for obj in objects:
            if isinstance(obj, nn.Module):
                obj = self._prepare_model(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                obj = self._prepare_optimizer(obj)
            elif isinstance(obj, torch.utils.data.DataLoader):
                obj = self._prepare_loader(obj)
            out.append(obj)
        if self._sharded and self.optimizer is not None:
            self.optimizer = self._rebuild_optimizer(self.optimizer)
            self._sharded = False
            out = [self.optimizer if isinstance(o, torch.optim.Optimizer) else o for o in out]
        return out[0] if len(out) == 1 else tuple(out)

    def _prepare_model(self, model: nn.Module) -> nn.Module:
        self.step, self.micro, self.resumed_at = 0, 0, None     # a new model starts counting
        model = model.to(self.device)
        if self.options.grad_ckpt:
            self._checkpoint_blocks(model)
        if self.options.strategy == "fsdp":
            from torch.distributed.fsdp import fully_shard

            from ..blocks import repeated_blocks

            for block in repeated_blocks(model):
                fully_shard(block)
            fully_shard(model)
            self._sharded = True
        elif self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        self.model = model
        return model

    def _checkpoint_blocks(self, model: nn.Module) -> None:
        """Recompute the repeated blocks' activations in backward instead of keeping them."""
        if hasattr(model, "gradient_checkpointing_enable") and self.options.grad_ckpt is True:
            # a Hugging Face model's own switch; the non-reentrant variant works under DDP's no_sync
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        from ..blocks import repeated_blocks

        name = self.options.grad_ckpt if isinstance(self.options.grad_ckpt, str) else None
        blocks = set(map(id, repeated_blocks(model, name)))
        if not blocks:
            what = f"no module of class {name}" if name else "no nn.ModuleList of blocks"
            raise ValueError(f"--grad-ckpt: {what} in {type(model).__name__} — name the block class: "
                             f"--grad-ckpt BlockClass")
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda module: id(module) in blocks)

    def _prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self.optimizer = optimizer
        return optimizer

    def _rebuild_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """FSDP2 replaces parameters with sharded ones: the optimizer must hold the new ones
        (same class and settings; per-group settings are not carried over)."""
        import inspect

        accepted = inspect.signature(type(optimizer).__init__).parameters
        settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return type(optimizer)(self.model.parameters(), **settings)

    def _prepare_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

        if isinstance(loader.sampler, DistributedSampler) or self.world_size == 1:
            return loader
        if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None or not isinstance(
                loader.sampler, (RandomSampler, SequentialSampler)):
            raise ValueError("gg.prepare shards a DataLoader built with batch_size and shuffle; for an "
                             "iterable dataset or a custom sampler, shard by rank/world_size yourself")
        sampler = DistributedSampler(loader.dataset, num_replicas=self.world_size, rank=self.rank,
                                     shuffle=isinstance(loader.sampler, RandomSampler), seed=0)
        extra = {}
        if loader.num_workers:
            extra = dict(persistent_workers=loader.persistent_workers, prefetch_factor=loader.prefetch_factor)
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                          collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                          drop_last=loader.drop_last, pin_memory=loader.pin_memory,
                          worker_init_fn=loader.worker_init_fn, generator=loader.generator, **extra)

    # -- the step -------------------------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass in ``--amp``'s precision (``torch.autocast`` in bf16 or fp16; nothing
        with ``--amp off``)::

            with gg.autocast():
                loss = model(batch).loss
        """
        if self.options.amp == "off":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.options.amp == "bf16" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> bool:
        """Backward for one micro-batch; on the K-th (``--accumulate K``) the gradients are
        all-reduced, clipped (``--clip``), the optimizer steps and they are zeroed (fp16's loss
        scaling included). True when a step was taken; every ``--checkpoint-every`` steps it
        checkpoints."""
        k = self.options.accumulate
        self.micro += 1
        last = self.micro >= k
        scaled = loss / k
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        with self._sync(last):
            scaled.backward()
        if not last:
            return False
        self.micro = 0
        optimizer = self._optimizer()
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if self.options.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.options.clip)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.options.checkpoint_every and self.step % self.options.checkpoint_every == 0:
            self.save_checkpoint()
        return True

    def _heed_notice(self) -> None:
        """Between two steps: if any rank's node has a preemption notice (they agree: a collective),
        checkpoint this step and stop the cell everywhere (``workers/notice.py``)."""
        deadline = notice.agreed_deadline(self.notice.deadline, self.device)
        if deadline is not None:
            if self.latest_checkpoint() != checkpoints.root(self).step(self.step):
                self.save_checkpoint()
            raise notice.Preempted(self.step, deadline)

    def _sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients are all-reduced on the last micro-batch only (DDP ``no_sync``; FSDP2 flag)."""
        model = self.model
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        if not last and isinstance(model, nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError("gg.backward needs the optimizer: pass it to gg.prepare(model, optimizer, …)")
        return self.optimizer

    def steps(self, loader, epochs: int = 1, max_steps: int | None = None) -> Iterator:
        """Batches for ``epochs`` (or up to ``max_steps`` optimizer steps), resuming after the
        last checkpoint: batches of steps already taken are skipped, not trained twice. The job
        monitor's progress bar counts them; where the job keeps checkpoints, a preemption notice
        checkpoints and ends the cell between two steps::

            for batch in gg.steps(loader, epochs=2):
                ...
        """
        resumed = self.load_checkpoint()
        skip = (resumed or 0) * self.options.accumulate     # batches of steps a checkpoint holds
        # the bar counts this loop's steps; after a resume it starts where the checkpoint was
        self.loop_start = 0 if resumed else self.step
        self._window = (time.perf_counter(), 0, 0)      # throughput counts from the loop's start
        self.total_steps = _last_step(loader, epochs, self.options.accumulate, max_steps, self.loop_start)
        seen = 0
        for epoch in range(epochs):
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            for batch in loader:
                seen += 1
                if seen <= skip:
                    continue
                if max_steps is not None and self.step >= max_steps:
                    return
                if self.notice is not None and self.micro == 0 and checkpoints.root(self) is not None:
                    self._heed_notice()
                yield batch
                self._count(batch)
        if self.micro and self.optimizer is not None:   # a partial accumulation is not carried over
            self.optimizer.zero_grad(set_to_none=True)
            self.micro = 0
        self.flush()

    # -- reports --------------------------------------------------------------------------------

    def _count(self, batch, report: bool = True) -> None:
        t0, samples, tokens = self._window
        if isinstance(batch, dict):
            batch = next((v for v in batch.values() if isinstance(v, torch.Tensor)), batch)
        first = batch[0] if isinstance(batch, (tuple, list)) else batch
        n = len(first) if hasattr(first, "__len__") else 1
        tok = first.numel() if isinstance(first, torch.Tensor) and first.dtype in (torch.int64, torch.int32) else 0
        self._window = (t0, samples + n, tokens + tok)
        if report:
            self._maybe_report()

    def log(self, **metrics) -> None:
        """Record metrics (``gg.log(loss=loss.item())``): the job monitor draws them, the ledger
        keeps them; reported at most once a second, with every value since by step. (In the
        notebook, ``gg.log`` is the clusters' event log: another function.)"""
        values = {k: float(v) for k, v in metrics.items()}
        self._metrics.update(values)
        done, logged = len(self._logged.get("step", ())), self._logged
        if done < LOGGED_MAX:
            for key in {"step"} | values.keys() | logged.keys():
                logged.setdefault(key, [None] * done).append(self.step if key == "step" else values.get(key))
        self._maybe_report()

    def begin(self, total_steps: int | None = None) -> None:
        """A framework's training loop starts (``frameworks``): what the bar counts to, and the
        throughput from now."""
        self.loop_start, self.total_steps = 0, total_steps or None
        self._window = (time.perf_counter(), 0, 0)

    def seen(self, *, step: int | None = None, batch=None, samples: int = 0, **metrics) -> None:
        """A framework's progress (``frameworks``): its step, the batch (or samples) it took, its
        metrics. A tensor becomes a number only when a report is due: no GPU sync per step."""
        if step is not None:
            self.step = int(step)
        if batch is not None:
            self._count(batch, report=False)
        elif samples:
            t0, seen, tokens = self._window
            self._window = (t0, seen + samples, tokens)
        due = time.perf_counter() - self._last_report >= REPORT_EVERY_S
        if metrics and not due and any(isinstance(v, torch.Tensor) for v in metrics.values()):
            self._pending = metrics       # the latest, logged when a report is due or at the end
            return
        metrics = metrics or (self._pending if due else None) or {}
        if metrics:
            self._pending = None
            self.log(**metrics)           # and the report, when due
        elif due:
            self._maybe_report()

    def _maybe_report(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_report < REPORT_EVERY_S:
            return
        t0, samples, tokens = self._window
        elapsed = max(now - t0, 1e-9)
        sample = {"t": time.time(), "rank": self.rank, "step": self.step, **self._metrics,
                  "memory_bytes": memory_bytes(self.device)}
        if self._logged:
            sample["logged"], self._logged = self._logged, {}
        if samples:      # a window without batches (before the first, after a pause) has no rate
            sample["samples_per_s"] = samples / elapsed
        if tokens:
            sample["tokens_per_s"] = tokens / elapsed
        if self.total_steps:
            sample["total_steps"], sample["loop_start"] = self.total_steps, self.loop_start
        util = gpu_utilisation(self.device)
        if util is not None:
            sample["gpu_util"] = util
        self._report(sample)
        self._last_report = now
        self._window = (now, 0, 0)

    def flush(self) -> None:
        """Send what was logged since the last report (the end of a loop)."""
        if self._pending:
            pending, self._pending = self._pending, None
            self.log(**pending)
        if self._metrics or self._window[1]:
            self._maybe_report(force=True)

    # -- checkpoints (``checkpoints.py``: gg's own; ``saves.py``: a framework's) ----------------

    def save_checkpoint(self) -> str | None:
        """Model, optimizer (sharded with FSDP), scaler, step and RNG, into the job's checkpoints."""
        return checkpoints.save(self)

    def latest_checkpoint(self) -> str | None:
        """Where the newest complete checkpoint of this job is, or None."""
        return checkpoints.latest(self)

    def load_checkpoint(self) -> int | None:
        """Resume from the newest complete checkpoint, once per group; returns its step."""
        return checkpoints.load(self)

    @property
    def resume_from(self) -> str | None:
        """The job's newest checkpoint as its framework wrote it, on this host, or None — for
        ``trainer.train(resume_from_checkpoint=gg.resume_from)`` and the like."""
        return self.saves.resume_from()

    @property
    def saves(self) -> Saves:
        """Where this job keeps a framework's own checkpoints (``--storage``, ``--checkpoint-dir``)."""
        if self._saves is None or self._saves.where != self.options.keep_dir:
            self._saves = Saves(self.options.keep_dir)
        return self._saves


def _last_step(loader, epochs: int, accumulate: int, max_steps: int | None, start: int) -> int | None:
    """The step count the loop will end at, if the loader knows its length (accumulation runs
    on across epochs; a partial one at the very end is dropped; ``max_steps`` is absolute)."""
    try:
        end = start + len(loader) * epochs // accumulate
    except TypeError:
        return max_steps
    return min(end, max_steps) if max_steps is not None else end
