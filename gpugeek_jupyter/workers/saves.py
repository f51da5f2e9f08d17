"""A framework's own checkpoints, kept where the job's hosts all reach them: each one the Trainer,
Lightning or Accelerate writes on the workers' disks (``output_dir/checkpoint-N``, a ``.ckpt``,
a ``save_state`` folder) is copied, as written, into the job's storage (``up --storage``, or
``--checkpoint-dir``: ``s3://…`` or a shared path) — as Ray Train's report callbacks upload a
framework's checkpoint. A host's disk dies with the host; the storage does not.

``resume_from()`` is the newest complete one, fetched onto this host: what the re-run of a cell
after a lost worker (``--max-failures``) resumes from. Layout, beside ``gg``'s own checkpoints:
``<storage>/checkpoints/<job>/framework/step-N/<what the framework wrote>`` and a ``COMPLETE``
naming it, written once every rank's files are in.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch.distributed as dist

from .storage import Place, barrier

FOLDER = "framework"      # under the job's checkpoint folder, beside gg's own step-N


class Saves:
    """The framework checkpoints of the job whose cell runs now (``where``: its storage, or None
    when the cluster has none — then nothing is copied, and nothing resumed but by the user)."""

    def __init__(self, where: str | None):
        self.where = where
        self.place = Place(f"{where.rstrip('/')}/{FOLDER}") if where else None

    def keep(self, local: str | os.PathLike, step: int) -> None:
        """Copy checkpoint ``local`` (a folder or a file), just written for ``step``, into the
        storage. Every rank calls it: the files are in once every rank is here, each is copied by
        the lowest rank that sees it (one copy on a shared disk; each host its own part when the
        disks are its own), and ``COMPLETE`` is written last."""
        if self.place is None:
            return
        local = Path(local)
        barrier()
        mine = _files(local)
        everyone = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
        rank = dist.get_rank() if dist.is_initialized() else 0
        taken = {f for earlier in everyone[:rank] for f in earlier}
        target = self.place.step(step)
        for name in mine:
            if name not in taken:
                source = local / name if local.is_dir() else local
                self.place.put(str(source), f"{target}/{local.name}/{name}" if local.is_dir() else f"{target}/{name}")
        barrier()
        if rank == 0:
            self.place.complete(target, step, {"name": local.name, "folder": local.is_dir()})
        barrier()

    def resume_from(self) -> str | None:
        """The newest complete checkpoint as the framework wrote it, on this host's disk (fetched
        once per host: the workers of one node share it), or None. No collective: any rank may ask."""
        if self.place is None:
            return None
        latest = self.place.latest()
        if latest is None:
            return None
        told = json.loads(self.place.read(f"{latest}/COMPLETE"))
        step = latest.rsplit("-", 1)[-1]
        here = Path(tempfile.gettempdir()) / "gpugeek-resume" / _slug(self.place.url) / step
        fetched = here / told["name"]
        here.mkdir(parents=True, exist_ok=True)
        with open(here / ".lock", "w") as lock:      # one worker of this node fetches; the others wait
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (here / ".fetched").exists():
                shutil.rmtree(fetched, ignore_errors=True)      # what a fetch cut short left
                self.place.get(f"{latest}/{told['name']}", str(fetched), folder=told["folder"])
                (here / ".fetched").write_text(latest)
        return str(fetched)


def _files(local: Path) -> list[str]:
    """What this host sees of checkpoint ``local``: its files, relative to it."""
    if local.is_file():
        return [local.name]
    if not local.is_dir():
        return []
    return sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())


def _slug(url: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in url)[-120:]
