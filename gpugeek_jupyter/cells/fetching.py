"""``%gpugeek fetch PATH``: what a job wrote on its nodes, brought back beside the notebook.

A remote cluster's job writes in its own folder there (``up --working-dir``'s copy, or the
worker's own): a checkpoint folder, a ``snapshot.pt``. Those files never come to the notebook
by themselves, and a working folder's copy goes with the cluster. A fetch reads them through
the warm worker group, in pieces — rank 0 reads its own node's, another rank hands its pieces
to rank 0 over the group's process group — and writes them into a folder beside this one that
takes the final name only once every byte came (a fetch cut short leaves nothing half-written).
On a cluster that runs on this machine the job already ran in the notebook's folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from ..backends.interface import capable
from ..cluster import registry
from ..cluster.processes import this_kernel
from ..errors import GpugeekError
from ..kernel.session import current
from ..units import number

PIECE_BYTES = 8 << 20      # read per cell (under a cell value's 20 MiB)
SAY_EVERY_S = 2.0          # progress, at most this often
FILES = "__import__('gpugeek_jupyter.workers.files', fromlist=['to_rank0'])"


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def fetch(path: str, *, rank: int | None = None, all_ranks: bool = False, to: str | None = None,
          overwrite: bool = False) -> list[Path]:
    """Bring ``path`` (a file or a folder, relative to the job's folder on the nodes, or absolute)
    from rank 0's node, rank ``rank``'s, or every rank's (into ``rank-N/``) to ``to`` — by
    default its own name in the notebook's folder. Returns where each landed."""
    if not str(path).strip():
        raise GpugeekError("fetch: no path given — name a file or folder the job wrote (`%gpugeek fetch checkpoints`)")
    session = current()
    group = session.group
    if session.active is None or (record := registry.live(session.active)) is None:
        raise GpugeekError("fetch: no cluster is active here — `%gpugeek up` one, run the job, then fetch what "
                           "it wrote")
    if capable(record).runs_here:
        here = Path(path).expanduser()
        here = here if here.is_absolute() else Path.cwd() / here
        said = "is here" if here.exists() else "is not there either"
        print(f"cluster {record.name!r} runs on this machine: its jobs run in the notebook's folder, so {here} "
              f"{said} — nothing to fetch", flush=True)
        return [here] if here.exists() else []
    if group is None or group.broken or not group.info:
        raise GpugeekError(f"fetch {path}: no warm worker group on cluster {record.name!r} to read it through — "
                           f"a fetch reads from the job's nodes: run a cell (any) first, then fetch")
    workers = len(group.info)
    if all_ranks and rank is not None:
        raise GpugeekError("fetch: --rank and --all-ranks given together — give one of the two")
    if rank is not None:
        rank = number(rank, "--rank", whole=True, least=0)
        if rank >= workers:
            raise GpugeekError(f"--rank {rank}: the worker group has no such rank — give one of 0…{workers - 1}")
    ranks = list(range(workers)) if all_ranks else [rank or 0]
    name = Path(str(path).rstrip("/")).name or "fetched"
    base = Path(to).expanduser() if to else Path.cwd() / name
    targets = {r: (base.parent / f"rank-{r}" / base.name if all_ranks else base) for r in ranks}
    for target in targets.values():
        if target.exists() and not overwrite:
            raise GpugeekError(f"fetch {path}: {target} is here already — give --to another path, or --overwrite "
                               f"to replace it")
    reader = _Reader(group, record.name)
    plans = {r: reader.listing(r, path) for r in ranks}
    total = sum(size for plan in plans.values() for _, size in plan["files"])
    count = sum(len(plan["files"]) for plan in plans.values())
    where = ", ".join(f"rank {r} on {plan['host']}" for r, plan in plans.items())
    print(f"fetching {path} from {where}: {count} file{'s' * (count != 1)}, {_mib(total)}", flush=True)
    progress = _Progress(total)
    landed = []
    for r, plan in plans.items():
        landed.append(_land(reader, r, plan, targets[r], progress, overwrite))
    print(f"fetched {_mib(total)} in {time.monotonic() - progress.began:.1f} s → "
          f"{', '.join(str(p) for p in landed)}", flush=True)
    return landed


class _Reader:
    """Cells on the warm group that read the nodes' files (rank 0's value carries them home)."""

    def __init__(self, group, cluster: str):
        self.group, self.cluster = group, cluster
        self.options = replace(group.options, argv=None, script_dir=None, folder=None, name_writes=False,
                               checkpoint_every=None)
        self.job = {"id": uuid.uuid4().hex[:12], "name": "fetch", "kernel": this_kernel(),
                    "started": time.time(), "pull": []}

    def _ask(self, from_rank: int, what: str, *args):
        call = f"{FILES}.answer(rank, {from_rank!r}, {what!r}, *{args!r})"
        return self.group.run(call, self.options, job=self.job).shown()

    def listing(self, r: int, path: str) -> dict:
        plan = self._ask(r, "listing", str(path))
        if not isinstance(plan, dict):
            raise GpugeekError(f"fetch {path}: rank {r} did not answer with its files — run it again")
        if plan.get("missing"):
            raise GpugeekError(f"fetch {path}: nothing there on rank {r}'s node ({plan['host']}: {plan['path']}) — "
                               f"the job's folder there is {plan['folder']}; give a path relative to it, or an "
                               f"absolute one")
        return plan

    def piece(self, r: int, path: str, offset: int, size: int) -> bytes:
        data = self._ask(r, "piece", path, offset, size)
        if not isinstance(data, bytes):
            raise GpugeekError(f"fetch: rank {r} did not send {path} from byte {offset} — run the fetch again")
        return data


class _Progress:
    def __init__(self, total: int):
        self.total, self.done, self.began = total, 0, time.monotonic()
        self.said = self.began

    def add(self, size: int) -> None:
        self.done += size
        now = time.monotonic()
        if now - self.said >= SAY_EVERY_S and self.done < self.total:
            self.said = now
            rate = self.done / max(now - self.began, 1e-6)
            print(f"  {100 * self.done / max(self.total, 1):.0f} % ({_mib(self.done)} of {_mib(self.total)}, "
                  f"{_mib(int(rate))}/s)", flush=True)


def _land(reader: _Reader, r: int, plan: dict, target: Path, progress: _Progress, overwrite: bool) -> Path:
    """Rank ``r``'s files into a folder beside ``target``, renamed to it once all came."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.fetching-", dir=target.parent))
    try:
        into = scratch / target.name
        for rel, size in plan["files"]:
            source = f"{plan['path']}/{rel}" if rel else plan["path"]
            file = into / rel if rel else into
            file.parent.mkdir(parents=True, exist_ok=True)
            with open(file, "wb") as out:
                offset = 0
                while offset < size:
                    data = reader.piece(r, source, offset, min(PIECE_BYTES, size - offset))
                    if not data:
                        raise GpugeekError(f"fetch: {source} on rank {r}'s node ended at byte {offset} of {size} "
                                           f"(it changed while it was read) — fetch it again once the job is done")
                    out.write(data)
                    offset += len(data)
                    progress.add(len(data))
        if plan["dir"]:
            into.mkdir(exist_ok=True)       # an empty folder is fetched as one
        if target.exists() and overwrite:
            shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        os.replace(into, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def say_written(result) -> None:
    """A job wrote files in its copy of ``--working-dir`` on nodes that are not the notebook's:
    where they are, and how to bring them back — they come by no other way, and the copy goes
    with the cluster."""
    wrote = result.wrote or {}
    names = wrote.get("names") or []
    if not names:
        return
    from ..workers.files import NAMED_MAX

    shown = ", ".join(names[:NAMED_MAX]) + (f" and {len(names) - NAMED_MAX} more" if len(names) > NAMED_MAX else "")
    print(f"note: the job wrote {shown} in its folder on the nodes (its copy of --working-dir, gone with the "
          f"cluster at `down`) — rank 0's is {wrote.get('host')}:"
          f"{wrote.get('folder')}; `%gpugeek fetch {names[0].rstrip('/')}` brings it here", flush=True)
