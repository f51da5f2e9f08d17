"""Preemption notices: a spot node about to be taken away warns its workers, and the job
checkpoints at once and stops, so the steps it took are all kept and it resumes elsewhere.

Each worker on a node that can be preempted watches for its node's notice on a thread of its own,
once a second, where the provider documents it:

- AWS: the instance metadata's ``spot/instance-action`` (IMDSv2), two minutes ahead;
- GCP: the metadata server's ``instance/preempted``, about 30 s ahead;
- Azure: Scheduled Events, a ``Preempt`` event, at least 30 s ahead;
- the sim backend: ``%gpugeek preempt NODE --notice S`` puts the deadline in Ray's KV store.

A checkpoint is collective, so the ranks agree at every optimizer step whether any of them has
a notice (one all-reduce of the latest deadline, only while checkpoints are on); then every rank
saves the same step and raises ``Preempted`` — the cell ends everywhere at once and the notebook
runs it again once the node is gone (``cells/jobs.py``), which does not count as a failure.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime

from ..raynodes import NOTICE_PREFIX

POLL_S = 1.0
METADATA_TIMEOUT_S = 0.5


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


def readers() -> dict:
    """Where each source's notice is read: a backend's ``notices`` names one."""
    return {"sim": read_sim, "aws": read_aws, "gcp": read_gcp, "azure": read_azure}


def agreed_deadline(mine: float | None, device) -> float | None:
    """The latest deadline any rank has (a collective: every rank calls it at the same step)."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([mine or 0.0], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item()) or None


# -- where each provider says it ----------------------------------------------------------------

def read_sim(node_id: str) -> float | None:
    """The sim backend's notice, in the cluster's KV store (``raynodes.send_notice``)."""
    from ..raynodes import get_from_worker

    value = get_from_worker(NOTICE_PREFIX + node_id)
    return float(value) if value else None


def read_aws(node_id: str = "") -> float | None:
    """AWS's interruption notice: ``spot/instance-action`` answers 404 until there is one, then
    {"action": "terminate"|"stop", "time": "2026-11-23T08:22:00Z"} (IMDSv2: a session token first)."""
    token = _http("PUT", "http://169.254.169.254/latest/api/token",
                  {"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    action = _http("GET", "http://169.254.169.254/latest/meta-data/spot/instance-action",
                   {"X-aws-ec2-metadata-token": token or ""})
    if not action:
        return None
    when = json.loads(action)["time"]
    return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()


def read_gcp(node_id: str = "") -> float | None:
    """GCP's preemption flag: ``TRUE`` once the VM is being preempted (it has about 30 s)."""
    flag = _http("GET", "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
                 {"Metadata-Flavor": "Google"})
    return time.time() + 30.0 if (flag or "").strip().upper() == "TRUE" else None


def read_azure(node_id: str = "") -> float | None:
    """Azure's Scheduled Events: a ``Preempt`` event's ``NotBefore`` (an RFC 1123 date)."""
    from email.utils import parsedate_to_datetime

    body = _http("GET", "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01",
                 {"Metadata": "true"})
    events = json.loads(body or "{}").get("Events", [])
    times = [parsedate_to_datetime(e["NotBefore"]).timestamp() if e.get("NotBefore") else time.time() + 30.0
             for e in events if e.get("EventType") == "Preempt"]
    return min(times) if times else None


def _http(method: str, url: str, headers: dict) -> str | None:
    """The body, or None for a 404 (no notice yet)."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_S) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
