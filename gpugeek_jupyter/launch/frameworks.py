"""Training code people already write, seen by the live monitor and the ledger: when a cell
imports the Hugging Face ``Trainer``, Accelerate or Lightning, the worker plugs a reporter into it
— a ``TrainerCallback``, a Lightning ``Callback``, a watch on ``Accelerator.backward``/``log`` and
its data loaders — that hands steps, samples and metrics to ``gg``'s reports, as a ``gg`` loop's
are. The user's code is not changed: the frameworks are patched as their modules load (an import
hook), only in the worker processes.

Per-step losses stay tensors until a report is due (at most once a second), so watching adds no
GPU sync to a step. Lightning's ``Trainer`` left at ``devices="auto", num_nodes=1`` is given the
group's shape, as ``torchrun``'s flags would give it.

Checkpoints: each one a framework writes (the Trainer's ``checkpoint-N``, Lightning's
``save_checkpoint``, Accelerate's ``save_state``) is kept in the job's storage by ``gg.saves``;
``Trainer.train()`` and Lightning's ``fit()`` given no checkpoint resume from the newest kept one
(``gg.resume_from``, which Accelerate's ``load_state`` takes by hand).
"""

from __future__ import annotations

import importlib
import importlib.abc
import inspect
import os
import sys
from collections.abc import Mapping

from ..errors import GpugeekError

_helper = None          # this worker's ``gg``
_trainer_running = False     # a Trainer counts its samples itself: its data loaders are not counted


def watch(helper) -> None:
    """Report the frameworks' progress through ``helper`` from now on (modules loaded already
    are patched at once, the others as they load)."""
    global _helper
    _helper = helper
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, _Hooks) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Hooks())


def loaded() -> bool:
    """Whether a framework this module watches was imported here (its teardown may have changed
    the ``torchrun`` variables: they are set again before the next cell, ~12 µs, else not)."""
    return any(name in sys.modules for name in PATCHES)


class _Hooks(importlib.abc.MetaPathFinder):
    """Finds the frameworks' modules as the other finders would, and patches each once loaded."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, PATCHES[fullname])
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):        # get_data, is_package, …: the real loader's
        return getattr(self._loader, name)


def _once(cls, name: str, make) -> None:
    real = getattr(cls, name)
    if not getattr(real, "_gpugeek", False):
        wrapped = make(real)
        wrapped._gpugeek = True
        wrapped.__wrapped__ = real
        setattr(cls, name, wrapped)


def _report(**kwargs) -> None:
    if _helper is not None:
        _helper.seen(**kwargs)


# -- Hugging Face transformers ------------------------------------------------------------------

def _patch_transformers(module) -> None:
    from transformers import TrainerCallback

    class Reports(TrainerCallback):
        """Steps, samples and the Trainer's own logs (loss, learning rate, grad norm)."""

        def on_train_begin(self, args, state, control, **kwargs):
            if _helper is not None:
                _helper.begin(total_steps=state.max_steps)

        def on_step_end(self, args, state, control, **kwargs):
            _report(step=state.global_step,
                    samples=args.per_device_train_batch_size * args.gradient_accumulation_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {k: v for k, v in (logs or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "epoch"}
            if "loss" in numbers:       # a training log (evaluation's say eval_loss)
                _report(step=state.global_step, **numbers)

        def on_save(self, args, state, control, **kwargs):
            if _helper is not None:     # every rank: its own files (rng_state_R) are part of it
                _helper.saves.keep(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"), state.global_step)

    def make(real):
        def __init__(self, *args, **kwargs):
            real(self, *args, **kwargs)
            self.add_callback(Reports())
            accelerator = getattr(self, "accelerator", None)
            if accelerator is not None:      # its backward is the Trainer's: counted by the callback
                accelerator._gpugeek_quiet = True
        return __init__

    def train(real):
        def wrapped(self, resume_from_checkpoint=None, *args, **kwargs):
            global _trainer_running
            if resume_from_checkpoint is None:
                resume_from_checkpoint = _resume_point("Trainer.train")
            _trainer_running = True
            try:
                return real(self, resume_from_checkpoint, *args, **kwargs)
            finally:
                _trainer_running = False
        return wrapped

    _once(module.Trainer, "__init__", make)
    _once(module.Trainer, "train", train)


def _resume_point(who: str) -> str | None:
    """For a framework given no checkpoint, in a cell run again after a lost worker: the job's
    newest kept checkpoint (said on rank 0). A first run starts afresh unless told
    (``gg.resume_from``)."""
    if _helper is None or not _helper.options.retry:
        return None
    found = _helper.resume_from
    if os.environ.get("RANK", "0") == "0":
        print(f"{who}: run {_helper.options.retry + 1} of this cell — " + (
            f"resuming from {found} (the job's newest checkpoint, kept in {_helper.options.keep_dir})" if found else
            "no checkpoint kept (`up --storage` or --checkpoint-dir keeps them): starting afresh"), flush=True)
    return found


# -- Accelerate ---------------------------------------------------------------------------------

def _patch_accelerate(module) -> None:
    from accelerate import data_loader

    def backward(real):
        def wrapped(self, loss, **kwargs):
            out = real(self, loss, **kwargs)
            if not getattr(self, "_gpugeek_quiet", False) and self.sync_gradients:
                self._gpugeek_steps = getattr(self, "_gpugeek_steps", 0) + 1
                _report(step=self._gpugeek_steps, loss=loss.detach())
            return out
        return wrapped

    def log(real):
        def wrapped(self, values, step=None, *args, **kwargs):
            numbers = {k: v for k, v in dict(values).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if numbers and not getattr(self, "_gpugeek_quiet", False):
                _report(step=step, **numbers)
            return real(self, values, step, *args, **kwargs)
        return wrapped

    def iterate(real):
        def __iter__(self):
            for batch in real(self):
                if not _trainer_running and _helper is not None:
                    _helper.seen(batch=batch)
                yield batch
        return __iter__

    def save_state(real):
        def wrapped(self, *args, **kwargs):
            where = real(self, *args, **kwargs)
            if not getattr(self, "_gpugeek_quiet", False) and _helper is not None and where:
                _helper.saves.keep(where, getattr(self, "_gpugeek_steps", self.step))
            return where
        return wrapped

    _once(module.Accelerator, "backward", backward)
    _once(module.Accelerator, "save_state", save_state)
    _once(module.Accelerator, "log", log)
    for loader in (data_loader.DataLoaderShard, data_loader.DataLoaderDispatcher):
        _once(loader, "__iter__", iterate)


# -- Lightning ----------------------------------------------------------------------------------

def _patch_lightning(module) -> None:
    package = module.__name__.split(".")[0]       # lightning, or the older pytorch_lightning
    Callback = (sys.modules.get(f"{package}.pytorch.callbacks") or sys.modules.get(f"{package}.callbacks"))
    if Callback is None:
        Callback = importlib.import_module(f"{package}.pytorch.callbacks" if package == "lightning"
                                           else f"{package}.callbacks")
    Callback = Callback.Callback

    class Reports(Callback):
        """Steps, samples and each step's loss (a tensor until a report is due)."""

        def on_train_start(self, trainer, pl_module):
            if _helper is not None:
                steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
                try:
                    steps = steps or int(trainer.estimated_stepping_batches)
                except (TypeError, ValueError, OverflowError):      # an endless loader: no total
                    steps = None
                _helper.begin(total_steps=steps)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            metrics = {"loss": loss.detach()} if hasattr(loss, "detach") else {}
            _report(step=trainer.global_step, batch=batch, **metrics)

    def make(real):
        def __init__(self, *args, **kwargs):
            callbacks = kwargs.get("callbacks")
            if callbacks is None or not isinstance(callbacks, (list, tuple)):
                callbacks = [] if callbacks is None else [callbacks]
            kwargs["callbacks"] = [*callbacks, Reports()]
            kwargs.update(_lightning_shape(kwargs))
            real(self, *args, **kwargs)
        return __init__

    def save_checkpoint(real):
        def wrapped(self, filepath, *args, **kwargs):
            real(self, filepath, *args, **kwargs)      # every rank comes here; rank 0 writes
            if _helper is not None:
                _helper.saves.keep(filepath, self.global_step)
        return wrapped

    def fit(real):
        signature = inspect.signature(real)

        def wrapped(self, *args, **kwargs):
            given = signature.bind(self, *args, **kwargs)     # ckpt_path by its name, wherever it was passed
            if given.arguments.get("ckpt_path") is None:
                given.arguments["ckpt_path"] = _resume_point("Trainer.fit")
            return real(*given.args, **given.kwargs)
        return wrapped

    _once(module.Trainer, "__init__", make)
    _once(module.Trainer, "save_checkpoint", save_checkpoint)
    _once(module.Trainer, "fit", fit)


def _lightning_shape(kwargs: dict) -> dict:
    """``devices`` and ``num_nodes`` for a Trainer that left them at their defaults, from the
    group (Lightning requires devices × nodes = the world size): on GPUs a node's workers and
    the nodes, as ``torchrun --nproc-per-node`` would say; on CPUs every worker as one node's.
    A Trainer given a shape the group does not have is told which one fits, in one line (Lightning
    itself fails on rank 1 with an ``IndexError``)."""
    if "LOCAL_WORLD_SIZE" not in os.environ:
        return {}
    import torch

    world, nodes = int(os.environ["WORLD_SIZE"]), int(os.environ["GROUP_WORLD_SIZE"])
    if kwargs.get("accelerator", "auto") == "cpu" or not torch.cuda.is_available():
        fits = {"devices": world, "num_nodes": 1}
    else:
        fits = {"devices": int(os.environ["LOCAL_WORLD_SIZE"]), "num_nodes": nodes}
    devices, num_nodes = kwargs.get("devices", "auto"), kwargs.get("num_nodes", 1)
    if devices == "auto" and num_nodes == 1:
        return fits
    counted = _device_count(devices)
    if num_nodes != fits["num_nodes"] or counted not in (None, fits["devices"]):
        raise GpugeekError(
            f"Trainer(devices={devices!r}, num_nodes={num_nodes!r}) does not fit this group of {world} "
            f"worker(s) on {nodes} node(s): give devices={fits['devices']}, num_nodes={fits['num_nodes']} "
            f"— or leave both out, and they are set from the group")
    return {}


def _device_count(devices) -> int | None:
    """How many devices a Trainer's ``devices`` names (None: Lightning decides, "auto" or -1)."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    try:
        count = int(devices)
    except (TypeError, ValueError):
        return None
    return None if count == -1 else count


PATCHES = {
    "transformers.trainer": _patch_transformers,
    "accelerate.accelerator": _patch_accelerate,
    "lightning.pytorch.trainer.trainer": _patch_lightning,
    "pytorch_lightning.trainer.trainer": _patch_lightning,
}
