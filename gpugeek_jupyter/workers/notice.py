"""Preemption notices: a spot node about to be taken away warns its workers, and the job
checkpoints at once and stops, so the steps it took are all kept and it resumes elsewhere.

Each worker on a node that can be preempted watches for its node's notice on a thread of its own,
once a second, where the provider documents it: a cloud's metadata service (each cloud of
``clouds/`` reads its own: AWS two minutes ahead, GCP and Azure about 30 s), or the cluster's KV
store, where the rehearsal's ``%gpugeek preempt NODE --notice S`` puts the deadline.

A checkpoint is collective, so the ranks agree at every optimizer step whether any of them has
a notice (one all-reduce of the latest deadline, only while checkpoints are on); then every rank
saves the same step and raises ``Preempted`` — the cell ends everywhere at once and the notebook
runs it again once the node is gone (``cells/jobs.py``), which does not count as a failure.
"""

from __future__ import annotations

import threading
import time

from ..raynodes import NOTICE_PREFIX

POLL_S = 1.0


class Preempted(Exception):
    """The job stopped on a preemption notice, right after a checkpoint of ``step``."""

    def __init__(self, step: int, deadline: float):
        left = max(0.0, deadline - time.time())
        super().__init__(f"a preemption notice: checkpoint written at step {step}; the node goes in {left:.0f} s, "
                         "the job resumes once it is gone")
        self.step, self.deadline = step, deadline


class NoticeWatch:
    """This node's preemption notice, looked for every ``POLL_S`` on a daemon thread:
    ``deadline`` is when the node goes (None: no notice)."""

    def __init__(self, source: str, node_id: str, poll_s: float = POLL_S):
        if source not in readers():
            raise ValueError(f"no preemption notices from {source!r}")
        self.source, self.node_id, self.poll_s = source, node_id, poll_s
        self.deadline: float | None = None
        self.error: str | None = None        # the last reading that failed, for doctor and tests
        threading.Thread(target=self._run, name="gpugeek-notice", daemon=True).start()

    def _run(self) -> None:
        read = readers()[self.source]
        while self.deadline is None:
            try:
                self.deadline = read(self.node_id)
                self.error = None
            except Exception as exc:  # noqa: BLE001 - a metadata hiccup: look again next time
                self.error = f"{type(exc).__name__}: {exc}"
            time.sleep(self.poll_s)


KV = "kv"       # a backend's ``notices`` for notices in the cluster's KV store


def readers() -> dict:
    """Where each source's notice is read: a backend's ``notices`` names one — the cluster's KV
    store, or a cloud's metadata service (``clouds/``)."""
    from ..clouds import CLOUDS

    return {KV: read_kv, **{name: provider.read_notice for name, provider in CLOUDS.items()}}


def agreed_deadline(mine: float | None, device) -> float | None:
    """The latest deadline any rank has (a collective: every rank calls it at the same step)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([mine or 0.0], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item()) or None


# -- where a notice is read ---------------------------------------------------------------------

def read_kv(node_id: str) -> float | None:
    """A notice put in the cluster's KV store (``raynodes.send_notice``: the rehearsal's
    ``%gpugeek preempt NODE --notice S``)."""
    from ..raynodes import get_from_worker

    value = get_from_worker(NOTICE_PREFIX + node_id)
    return float(value) if value else None
