"""Where a job's checkpoints live, seen from its workers: a place every host of the job reaches.

On several hosts a checkpoint is written in parts, one per rank, and a resume on the hosts left
reads them all; a folder on each host's own disk holds one part each, and a resume after a host is
lost fails. So before the first step, rank 0 leaves a file there and every rank must see it.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import torch.distributed as dist

from ..errors import GpugeekError


def check_shared(root: Path, rank: int) -> None:
    """One line, on every rank, when a host of the job cannot see what rank 0 wrote in ``root``;
    nothing to check when the ranks share one host."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    if len(set(hosts)) == 1:
        return
    nonce = [uuid.uuid4().hex]
    dist.broadcast_object_list(nonce, src=0)
    probe = root / f".shared-{nonce[0]}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_text(hosts[0])
    dist.barrier()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, probe.exists())
    dist.barrier()
    if rank == 0:
        probe.unlink(missing_ok=True)
    blind = sorted({host for host, saw in zip(hosts, seen, strict=True) if not saw})
    if blind:
        raise GpugeekError(f"checkpoint dir {root} is not shared by the hosts ({', '.join(blind)} cannot see it) "
                           f"— give an s3:// URL or a path on a shared filesystem as --checkpoint-dir")
