"""What a kernel asks of the cluster beside its own cells: the worker groups on it and the jobs
they keep, and its nodes and room. Two drivers answer the same questions:

- ``RayDriver`` (``group/driver.py``) asks Ray from this process — the kernel of a local, sim or
  attached cluster (a Ray driver there), and a remote cluster's keeper on its head (``keeper/``);
- ``LineDriver`` asks the keeper over the line (``line/``): the kernel of a remote cluster.

``driver()`` is the one this kernel's connection takes. The policies above them (``group/orphans``,
``attach``, ``jobs``) are written once, against either.
"""

from __future__ import annotations

import time

from ..errors import GpugeekError
from ..group.driver import NODE_DEATH_S, RayDriver
from ..kernel.session import current
from ..line import messages as m
from ..line.wire import LinkDown

ASK_TIMEOUT_S = 60.0


class LineDriver:
    """The kernel of a remote cluster: the same questions, asked of its keeper over the line."""

    def __init__(self, line, cluster: str = "the cluster"):
        self.line, self.cluster = line, cluster

    def ask(self, request, timeout: float = ASK_TIMEOUT_S):
        """The keeper's reply (of the type the request declares); one line when the line is down."""
        try:
            return self.line.call(request, timeout, said=_say)
        except LinkDown as exc:
            raise GpugeekError(f"{self.cluster} does not answer from here ({exc}) — try again once the network "
                               f"is back: the cluster goes on meanwhile") from None

    def groups(self) -> dict[str, list[str]]:
        return self.ask(m.ListGroups()).groups

    def lead_state(self, group_id: str) -> dict | None:
        return self.ask(m.LeadState(group_id=group_id)).state

    def remove_group(self, group_id: str) -> None:
        self.ask(m.RemoveGroup(group_id=group_id))

    def kept_jobs(self) -> list[tuple[str, dict]]:
        return [(group_id, job) for group_id, job in self.ask(m.KeptJobs()).kept]

    def journal(self, group_id: str, number: int, cursor: int, wait_s: float) -> dict | None:
        """Raises ``LinkDown`` while the line is down: a reader rides that out (``attach``)."""
        asked = m.ReadJournal(group_id=group_id, number=number, cursor=cursor, wait_s=wait_s)
        return self.line.call(asked, wait_s + ASK_TIMEOUT_S, said=_say).news

    def interrupt_job(self, group_id: str, number: int) -> None:
        self.ask(m.InterruptJob(group_id=group_id, number=number))

    def node_answers(self, node_id: str) -> bool:
        return self.ask(m.NodeAnswers(node_id=node_id), timeout=NODE_DEATH_S + ASK_TIMEOUT_S).yes

    def wait_gone(self, node_ids: list[str], until: float) -> None:
        self.ask(m.WaitGone(node_ids=list(node_ids), until=until),
                 timeout=max(0.0, until - time.time()) + ASK_TIMEOUT_S)

    def room(self, kind: str, each: float) -> int:
        return self.ask(m.Room(kind=kind, each=each)).workers

    def never_fits(self, workers: int, gpus_per_worker: float, grows: bool) -> None:
        self.ask(m.NeverFits(workers=workers, gpus_per_worker=gpus_per_worker, grows=grows))


def _say(text: str) -> None:
    """What the keeper printed for this request, into the cell as it comes."""
    print(text, end="", flush=True)


def driver() -> RayDriver | LineDriver:
    """What this kernel asks its cluster through: its keeper's line, or Ray itself."""
    session = current()
    if session.line is not None:
        return LineDriver(session.line, f"cluster {session.active!r}" if session.active else "the cluster")
    return RayDriver()
