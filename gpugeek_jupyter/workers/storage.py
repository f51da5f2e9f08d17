"""Where a job's checkpoints live, seen from its workers: a folder every host of the job reaches —
a path (a shared filesystem) or any fsspec URL (``s3://``, ``gs://``, ``az://``, …), both through
fsspec, whose S3, GCS and Azure file systems take credentials from the standard environment and
config files. ``torch.distributed.checkpoint`` picks its fsspec writer and reader for a URL.

On several hosts a checkpoint is written in parts, one per rank, and a resume on the hosts left
reads them all; a folder on each host's own disk holds one part each, and a resume after a host is
lost fails. So before the first step, rank 0 leaves a file there and every rank must see it.
"""

from __future__ import annotations

import io
import json
import socket
import uuid

import torch
import torch.distributed as dist

from ..errors import GpugeekError

PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


class Place:
    """A checkpoint folder: ``where`` as the user gave it (a path or a URL), with its files."""

    def __init__(self, where: str):
        self.url = where.rstrip("/") or "/"
        from fsspec.core import url_to_fs

        try:
            self.fs, self.path = url_to_fs(self.url)
        except ImportError:
            scheme = self.url.split("://")[0]
            package = PACKAGES.get(scheme, f"the fsspec package for {scheme}://")
            raise GpugeekError(f"checkpoint dir {where}: this host cannot open {scheme}:// (no {package}) — "
                               f"`up --storage {scheme}://…` installs it on the hosts") from None

    def __str__(self) -> str:
        return self.url

    def step(self, step: int) -> str:
        """The checkpoint of ``step``: a folder (or prefix) of its own, as ``torch.distributed.checkpoint``
        is given it."""
        return f"{self.url}/step-{step:08d}"

    def latest(self) -> str | None:
        """The newest checkpoint whose ``COMPLETE`` was written (every rank's part is in)."""
        self.fs.invalidate_cache()          # another host may have written since this one looked
        done = sorted(self.fs.glob(f"{self.path}/step-*/COMPLETE"))
        return f"{self.url}/{done[-1].rsplit('/', 2)[-2]}" if done else None

    def save_extra(self, checkpoint: str, rank: int, extra: dict) -> None:
        buffer = io.BytesIO()
        torch.save(extra, buffer)
        self._write(f"{checkpoint}/extra-rank{rank}.pt", buffer.getvalue())

    def load_extra(self, checkpoint: str, rank: int) -> dict:
        with self.fs.open(self._path(f"{checkpoint}/extra-rank{rank}.pt"), "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)

    def complete(self, checkpoint: str, step: int, said: dict | None = None) -> None:
        """Mark ``checkpoint`` whole: ``COMPLETE`` holds its step (and ``said``, as JSON)."""
        text = json.dumps({"step": step, **said}) if said else str(step)
        self._write(f"{checkpoint}/COMPLETE", text.encode())

    def put(self, local: str, url: str) -> None:
        """Copy file ``local`` to ``url`` in this folder."""
        path = self._path(url)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(local, path)

    def get(self, url: str, local: str, folder: bool) -> None:
        """Copy ``url`` (a folder of files, or one file) of this folder to ``local``."""
        self.fs.get(self._path(url), local, recursive=folder)

    def read(self, url: str) -> str:
        with self.fs.open(self._path(url), "rb") as f:
            return f.read().decode()

    def _write(self, url: str, data: bytes) -> None:
        path = self._path(url)
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def _path(self, url: str) -> str:
        return self.path + url[len(self.url):]


def check_shared(place: Place, rank: int) -> None:
    """One line, on every rank, when a host of the job cannot see what rank 0 wrote in ``place``;
    nothing to check when the ranks share one host."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) == 1:
        return
    nonce = [uuid.uuid4().hex]
    dist.broadcast_object_list(nonce, src=0)
    probe = f"{place.url}/.shared-{nonce[0]}"
    if rank == 0:
        place._write(probe, hosts[0].encode())
    dist.barrier()
    place.fs.invalidate_cache()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, place.fs.exists(place._path(probe)))
    dist.barrier()
    if rank == 0:
        place.fs.rm(place._path(probe))
    blind = sorted({host for host, saw in zip(hosts, seen, strict=True) if not saw})
    if blind:
        raise GpugeekError(f"checkpoint dir {place} is not shared by the hosts ({', '.join(blind)} cannot see it) "
                           f"— give an s3:// URL or a path on a shared filesystem as --checkpoint-dir")


def barrier() -> None:
    """Every rank here, when there are several."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
