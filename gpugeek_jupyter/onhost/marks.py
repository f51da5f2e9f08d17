"""The folders a cluster makes on a host, marked as ours: the host script's (``script.py``)
first part, sent and copied with it as one text (``remote/ssh.host_script``). Standard library only.

A host's ``/tmp`` is shared with its other users and jobs (a Slurm node's with every job there), so
a folder's name proves nothing: a user's ``/tmp/gg-data-2024`` looks like one of ours. Ray's temp
folder is made here with a mark inside (``MADE_MARK``: the cluster, by its marker's digest, and the
Slurm job that made it), and a folder is removed only where that mark is found and names the
cluster or the job being tidied.
"""

import hashlib
import json
import os
import shutil

MADE_MARK = ".gpugeek-made"


def _cluster(marker):
    """The cluster as a mark names it: a digest (the marker itself proves a process ours)."""
    return hashlib.sha256(marker.encode()).hexdigest()[:16]


def mark_folder(path, marker, job=None):
    """Make ``path`` (Ray's temp folder) and mark it the cluster's, and Slurm job ``job``'s; or say
    why not: a folder of that name without our mark is someone else's, and Ray would write in it."""
    if os.path.lexists(path) and made_by(path) is None:
        return {"ok": False, "error": f"{path} is there and gpugeek-jupyter did not make it (no {MADE_MARK} in "
                                      f"it): move it away, or give the cluster another name"}
    os.makedirs(path, mode=0o700, exist_ok=True)
    with open(os.path.join(path, MADE_MARK), "w") as f:
        json.dump({"cluster": _cluster(marker), "job": job or None}, f)
    return None


def made_by(path):
    """The mark in ``path`` (``cluster``, ``job``), where folder and mark are this user's, no link."""
    mark = os.path.join(path, MADE_MARK)
    try:
        if os.path.islink(path) or not os.path.isfile(mark) or os.path.islink(mark) or \
                {os.stat(path).st_uid, os.stat(mark).st_uid} != {os.getuid()}:
            return None
        with open(mark) as f:
            made = json.load(f)
    except (OSError, ValueError):
        return None
    return made if isinstance(made, dict) and made.get("cluster") else None


def remove_ours(path, marker=None, job=None):
    """Remove ``path`` where its mark says it is the cluster's (``marker``), the job's (``job``)."""
    made = made_by(path)
    if made is None or (marker and made["cluster"] != _cluster(marker)) or \
            (job and made.get("job") != job):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True
