"""The files a job leaves on its nodes, seen from a worker: what a cell wrote in its folder (said
at its end, on a cluster whose nodes are not the notebook's), and a file or folder read back in
pieces for ``%gpugeek fetch``. Standard library only, but for the one send of a piece from
another rank to rank 0 (``torch.distributed``, the group's own).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

SCAN_MAX = 5000         # entries looked at for what a cell wrote: a folder larger than this is not walked whole
NAMED_MAX = 6           # top-level names said at a cell's end


def written(folder: str, since: float) -> list[str]:
    """The top-level names in ``folder`` under which some file changed at or after ``since``
    (``checkpoints/``, ``snapshot.pt``), walking at most ``SCAN_MAX`` entries."""
    root = Path(folder)
    names: list[str] = []
    seen = 0
    stack = [(root, None)]
    while stack and seen < SCAN_MAX:
        where, top = stack.pop()
        try:
            entries = list(os.scandir(where))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            name = top or (entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name)
            if name in names or entry.name in ("__pycache__", ".ipynb_checkpoints"):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), name))
                elif entry.stat(follow_symlinks=False).st_mtime >= since - 1:
                    names.append(name)
            except OSError:
                continue
    return sorted(names)


def report(since: float, host: str | None) -> dict:
    """What a cell wrote in this worker's folder since ``since``, and where that folder is."""
    return {"names": written(os.getcwd(), since), "folder": os.getcwd(), "host": host}


def listing(path: str) -> dict:
    """What ``path`` (relative to this worker's folder, or absolute) holds: its files and sizes,
    and where it is, for the notebook to plan a fetch. ``missing`` when there is nothing there."""
    where = Path(path).expanduser()
    where = where if where.is_absolute() else Path.cwd() / where
    out = {"path": str(where), "host": socket.gethostname(), "folder": os.getcwd()}
    if where.is_file():
        return {**out, "dir": False, "files": [["", where.stat().st_size]]}
    if not where.is_dir():
        return {**out, "missing": True}
    files = []
    for file in sorted(p for p in where.rglob("*") if p.is_file() and not p.is_symlink()):
        files.append([str(file.relative_to(where)), file.stat().st_size])
    return {**out, "dir": True, "files": files}


def piece(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of the file at ``path`` from ``offset``."""
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read(size)


def to_rank0(rank: int, from_rank: int, read):
    """What ``read()`` gives on rank ``from_rank``, handed to rank 0 over the group's own process
    group (the notebook hears rank 0's value only); None on every other rank."""
    if from_rank == 0:
        return read() if rank == 0 else None
    import torch.distributed as dist

    if rank == from_rank:
        dist.send_object_list([read()], dst=0)
    elif rank == 0:
        got = [None]
        dist.recv_object_list(got, src=from_rank)
        return got[0]
    return None


def enter(folder: str) -> None:
    """This worker into ``folder`` (the notebook's current one) for the cell, if it is here."""
    try:
        here = os.getcwd()
    except OSError:             # the folder it was in is gone
        here = None
    if here != folder and os.path.isdir(folder):
        os.chdir(folder)


ANSWERS = {"listing": listing, "piece": piece}


def answer(rank: int, from_rank: int, what: str, *args):
    """A fetch's question (``cells/fetching.py``), answered on rank ``from_rank`` and handed to rank 0."""
    return to_rank0(rank, from_rank, lambda: ANSWERS[what](*args))
