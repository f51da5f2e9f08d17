"""``gg``'s own checkpoints: model, optimizer (sharded with FSDP), scaler, step and RNG, written
with ``torch.distributed.checkpoint`` (its fsspec writer for a URL) into the job's checkpoint
folder (``storage.Place``), and read back once per group by ``gg.steps`` — which then skips the
batches of the steps a checkpoint holds. A framework's own checkpoints are ``saves.py``'s.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import storage


def root(gg) -> storage.Place | None:
    """The job's checkpoint folder (``--checkpoint-dir``, else set by the job), or None."""
    if not gg.options.checkpoint_dir:
        return None
    if gg.checkpoint_place is None or gg.checkpoint_place.url != gg.options.checkpoint_dir.rstrip("/"):
        gg.checkpoint_place = storage.Place(gg.options.checkpoint_dir)
    return gg.checkpoint_place


def save(gg) -> str | None:
    """Model, optimizer (sharded with FSDP), scaler, step and RNG, with ``torch.distributed.checkpoint``
    (its fsspec writer for a URL)."""
    place = root(gg)
    if place is None or gg.model is None:
        return None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = place.step(gg.step)
    model_sd, optim_sd = get_state_dict(gg.model, gg.optimizer) if gg.optimizer else (
        get_state_dict(gg.model, [])[0], {})
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    extra = {"step": gg.step, "rng": torch.get_rng_state(),
             "scaler": gg.scaler.state_dict() if gg.scaler else None}
    if gg.device.type == "cuda":
        extra["cuda_rng"] = torch.cuda.get_rng_state(gg.device)
    place.save_extra(path, gg.rank, extra)
    storage.barrier()
    if gg.rank == 0:
        place.complete(path, gg.step)
    storage.barrier()
    return path


def latest(gg) -> str | None:
    place = root(gg)
    return place.latest() if place is not None else None


def load(gg) -> int | None:
    """Resume from the newest complete checkpoint, once per group; returns its step."""
    if gg.resumed_at is not None or gg.model is None:
        return None
    place = root(gg)
    if place is not None and gg.shared_checked != place.url:
        storage.check_shared(place, gg.rank)
        gg.shared_checked = place.url
    path = latest(gg)
    if dist.is_initialized() and dist.get_world_size() > 1:   # rank 0 decides for everyone
        chosen = [path]
        dist.broadcast_object_list(chosen, src=0)
        path = chosen[0]
    gg.resumed_at = 0
    if path is None:
        return None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(gg.model, gg.optimizer) if gg.optimizer else (
        get_state_dict(gg.model, [])[0], {})
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(gg.model, gg.optimizer or [], model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    extra = place.load_extra(path, gg.rank)
    gg.step = int(extra["step"])
    torch.set_rng_state(extra["rng"])
    if gg.scaler is not None and extra.get("scaler"):
        gg.scaler.load_state_dict(extra["scaler"])
    if "cuda_rng" in extra and gg.device.type == "cuda":
        torch.cuda.set_rng_state(extra["cuda_rng"], gg.device)
    gg.resumed_at = gg.step
    if gg.rank == 0:
        print(f"resumed from {path.rsplit('/', 1)[-1]} (step {gg.step})", flush=True)
    return gg.step
