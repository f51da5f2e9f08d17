"""What of the frameworks' insides ``launch/frameworks.py`` leans on (the methods it wraps, the
arguments it reads, the hooks its callbacks answer), held against the releases installed: one that
moves any of them fails here by name, rather than turning the live monitor off in a cell."""

from __future__ import annotations

import inspect
import re

import pytest

from gpugeek_jupyter.launch import frameworks


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_every_module_patched_is_one_the_framework_still_has():
    import importlib

    for name in frameworks.PATCHES:
        if name.startswith("pytorch_lightning"):
            continue           # the older package's name, patched where it is installed
        assert importlib.import_module(name), name


def test_transformers_trainer():
    from transformers import Trainer, TrainerCallback, TrainerState, TrainingArguments

    assert _params(Trainer.train)[:2] == ["self", "resume_from_checkpoint"], \
        "transformers.Trainer.train: resume_from_checkpoint is no longer its first argument"
    assert callable(getattr(Trainer, "add_callback", None)), "transformers.Trainer.add_callback moved"
    for hook in ("on_train_begin", "on_step_end", "on_log", "on_save"):
        assert callable(getattr(TrainerCallback, hook, None)), f"transformers.TrainerCallback.{hook} moved"
    state, read = set(TrainerState.__dataclass_fields__), {"max_steps", "global_step"}
    assert read <= state, f"transformers.TrainerState lost {read - state}"
    args = set(TrainingArguments.__dataclass_fields__)
    wanted = {"per_device_train_batch_size", "gradient_accumulation_steps", "output_dir"}
    assert wanted <= args, f"transformers.TrainingArguments lost {wanted - args}"
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    assert PREFIX_CHECKPOINT_DIR == "checkpoint", "transformers names its checkpoints other than checkpoint-N"


def test_accelerate():
    from accelerate import Accelerator, data_loader

    assert _params(Accelerator.backward)[:2] == ["self", "loss"], "accelerate.Accelerator.backward(loss) moved"
    # log is wrapped by accelerate's own on_main_process (a signature of *args): its module's source says
    import accelerate.accelerator

    assert re.search(r"def log\(\s*self,\s*values\b[^,]*,\s*step\b", inspect.getsource(accelerate.accelerator)), \
        "accelerate.Accelerator.log(values, step) moved"
    assert callable(getattr(Accelerator, "save_state", None)), "accelerate.Accelerator.save_state moved"
    for prop in ("sync_gradients", "step"):
        assert hasattr(Accelerator, prop) or prop in inspect.getsource(Accelerator.__init__), \
            f"accelerate.Accelerator.{prop} moved"
    for loader in ("DataLoaderShard", "DataLoaderDispatcher"):
        assert "__iter__" in vars(getattr(data_loader, loader)), f"accelerate.data_loader.{loader}.__iter__ moved"


def test_lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    init = set(_params(lightning.Trainer.__init__))
    wanted = {"callbacks", "devices", "num_nodes", "accelerator"}
    assert wanted <= init, f"lightning.Trainer(...) no longer takes {wanted - init}"
    assert "ckpt_path" in _params(lightning.Trainer.fit), "lightning.Trainer.fit(ckpt_path=) moved"
    assert _params(lightning.Trainer.save_checkpoint)[:2] == ["self", "filepath"], \
        "lightning.Trainer.save_checkpoint(filepath) moved"
    for hook in ("on_train_start", "on_train_batch_end"):
        assert callable(getattr(lightning.Callback, hook, None)), f"lightning.Callback.{hook} moved"
    for prop in ("max_steps", "estimated_stepping_batches", "global_step"):
        assert isinstance(getattr(lightning.Trainer, prop, None), property), f"lightning.Trainer.{prop} moved"
