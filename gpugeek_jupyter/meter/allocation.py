"""A Slurm cluster's bill from Slurm's own record of its job: every node of the allocation, from
the moment the job started to the moment it ended, as the scheduler recorded them.

An allocation is billed (or charged to an account) from its start, while Ray is still starting on
its nodes, to its end, while Ray is already gone: minutes Ray's node table never sees. So a Slurm
cluster's node rows are the job's nodes, one row each, started at the job's ``StartTime`` and
ended at its ``EndTime`` — read with ``SLURM_TIME_FORMAT=%s`` (seconds since the epoch: the
laptop's and the cluster's clocks may be in other zones). While the controller remembers the job
``scontrol show job`` says it; later ``sacct`` (where accounting runs), else ``sacct -c`` (the job
completion record). A job requeued runs again under the same id from a new start: each run is a
row of its own (``job:node@start``), the earlier ones read from sacct or the job completion record,
which keep a line per run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..clouds.base import Instance

# one shell run on the login node (or the head's node): the first of Slurm's records that knows the
# job — and, for a job requeued (``Restarts`` above 0), its earlier runs, each a line of sacct's or of
# the job completion record
_RUNS = "-X -n -P -j {job} -o JobID,State,Start,End,NodeList 2>/dev/null"
READ = ("export SLURM_TIME_FORMAT=%s; "
        "r=$(scontrol -o show job {job} 2>/dev/null); if [ -n \"$r\" ]; then echo \"scontrol|$r\"; "
        "case \"$r\" in *' Restarts=0 '*) exit 0;; esac; fi; "
        f"r=$(sacct -D {_RUNS}) && [ -n \"$r\" ] && {{{{ echo \"$r\" | sed 's/^/sacct|/'; exit 0; }}}}; "
        f"r=$(sacct -c {_RUNS}) && [ -n \"$r\" ] && {{{{ echo \"$r\" | sed 's/^/jobcomp|/'; exit 0; }}}}; "
        "echo none")
# Slurm's job states once a job no longer runs (COMPLETING: ending, its EndTime set)
OVER = ("COMPLETING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
        "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT")
NOTICE_S = 120     # the walltime's notice (sbatch --signal=B:USR2@NOTICE_S), unless the user's --sbatch names one
SOURCES = {"scontrol": "scontrol show job", "sacct": "sacct", "jobcomp": "the job completion record (sacct -c)"}


@dataclass(frozen=True)
class Run:
    """An earlier run of a job that was requeued: its allocation, start to end."""

    started: float
    ended: float
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class JobRecord:
    """A Slurm job as the scheduler recorded it: its run now (or its last), and any before it."""

    job: str
    state: str                    # Slurm's word: PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, …
    started: float | None         # None while it has not started
    ended: float | None           # None while it runs
    walltime_end: float | None    # a running job's end at its time limit (its countdown; once preempted,
    #                               the end of its grace time)
    nodes: tuple[str, ...]
    head: str | None              # the node the batch script runs on (Ray's head)
    source: str                   # which record said it (``SOURCES``)
    restarts: int = 0             # how often it was requeued (scontrol's ``Restarts``)
    earlier: tuple[Run, ...] = ()  # its runs before this one, each an allocation of its own
    preempted: float | None = None  # when the scheduler preempted the running job (``PreemptTime``): its
    #                                 ``walltime_end`` is then the end of its grace time

    @property
    def over(self) -> bool:
        """The run is over (its end recorded): COMPLETING too, which a requeue passes through."""
        return self.state.split()[0] in OVER

    @property
    def done(self) -> bool:
        """The job is over for good: a state Slurm leaves it in (a job requeued is COMPLETING, then
        pending again)."""
        return self.over and self.state.split()[0] != "COMPLETING"

    def elapsed(self, now: float) -> float:
        """Seconds the allocation has been held: start to end (or now), as Slurm records them,
        its earlier runs' included."""
        held = sum(run.ended - run.started for run in self.earlier)
        if self.started is None:
            return held
        return held + max(0.0, (self.ended if self.ended is not None else now) - self.started)

    def instances(self, head_type: str = "head", node_type: str = "host") -> list[Instance]:
        """The job's nodes as ``meter.instances`` bills machines: each from its run's start, the
        earlier runs' ended."""
        rows = [Instance(id=f"{self.job}:{node}@{run.started:.0f}", node_type=head_type if i == 0 else node_type,
                         launched=run.started, ended=run.ended, state="requeued", address="", spot=False,
                         gone=True, head=i == 0)
                for run in self.earlier for i, node in enumerate(run.nodes)]
        if self.started is None:
            return rows
        return rows + [Instance(id=f"{self.job}:{node}@{self.started:.0f}", node_type=head_type if node == self.head
                                else node_type, launched=self.started, ended=self.ended if self.over else None,
                                state=self.state.lower(), address="", spot=False, gone=self.over,
                                head=node == self.head)
                       for node in self.nodes]


def parse(answer: str) -> JobRecord | None:
    """What ``READ`` printed; None when no record knows the job."""
    current, runs = None, []
    for line in answer.strip().splitlines():
        source, _, text = line.strip().partition("|")
        if source == "scontrol":
            current = _scontrol(text)
        elif source in ("sacct", "jobcomp") and (run := _run(source, text)) is not None:
            runs.append(run)
    if current is None:           # the controller forgot the job: its last run is the one now
        if not runs:
            return None
        runs.sort(key=lambda r: r.started or 0.0)
        current = runs.pop()
    elif current.restarts and current.state.split()[0] == "COMPLETING":
        # a requeue's passage (or a later run's end): scontrol's start and end name no run then (its
        # start is the requeue's moment, its end that plus the time limit); the runs are sacct's or
        # the job completion record's lines, and the next one has not started
        current = replace(current, started=None, ended=None, walltime_end=None, nodes=(), head=None)
    earlier, seen = [], set()
    for run in runs:
        if run.started and run.ended and run.started not in seen and (
                current.started is None or run.started < current.started):
            seen.add(run.started)
            earlier.append(Run(run.started, run.ended, run.nodes))
    return replace(current, earlier=tuple(sorted(earlier, key=lambda r: r.started)))


def _scontrol(text: str) -> JobRecord:
    fields = dict(pair.split("=", 1) for pair in text.split() if "=" in pair)
    state = fields.get("JobState", "UNKNOWN")
    started, ends = _epoch(fields.get("StartTime")), _epoch(fields.get("EndTime"))
    running = state not in OVER
    nodes = () if state == "PENDING" else expand(fields.get("NodeList", ""))
    restarts = fields.get("Restarts", "0")
    return JobRecord(fields.get("JobId", ""), state, None if state == "PENDING" else started,
                     None if running else ends, ends if running else None, nodes,
                     fields.get("BatchHost") or (nodes[0] if nodes else None), "scontrol",
                     int(restarts) if restarts.isdigit() else 0,
                     preempted=_epoch(fields.get("PreemptTime")) if running else None)


def _run(source: str, text: str) -> JobRecord | None:
    parts = text.split("|")
    if len(parts) < 5:
        return None
    job, state, start, end, nodelist = parts[:5]
    nodes = expand(nodelist) if nodelist not in ("None assigned", "(null)") else ()
    return JobRecord(job, state.split()[0], _epoch(start), _epoch(end), None, nodes, nodes[0] if nodes else None,
                     source)


def _epoch(value: str | None) -> float | None:
    return float(value) if value and value.isdigit() and int(value) > 0 else None


def expand(hostlist: str) -> tuple[str, ...]:
    """Slurm's host list (``node[1-3,7],gpu-a[01-02]``) as names, as ``scontrol show hostnames``."""
    names = []
    for part in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", hostlist.strip()):
        names += _one(part)
    return tuple(names)


def _one(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern] if pattern else []
    head, tail = pattern[:match.start()], pattern[match.end():]
    out = []
    for piece in match[1].split(","):
        low, _, high = piece.partition("-")
        width = len(low)
        for n in range(int(low), int(high or low) + 1):
            out += [f"{head}{n:0{width}d}{rest}" for rest in _one(tail) or [""]]
    return out
