"""What a cluster on machines we reach over SSH knows of them, and the one place it changes.

``Remote`` is a cluster spec's record of its machines (``ClusterSpec.remote``): the hosts the
user named and how to reach them, what each host turned out to be, where Ray and the head's
watchdog keep their files, the ports, the tunnel's line. It is frozen, its lists tuples: nothing
changes it in place. A backend hands back what it learned as one of the facts below, each
declaring the fields it sets, and ``learn`` applies them to the spec — writing the registry when
given the cluster's id, once per change of state. ``tests/test_remote_record.py`` finds any other
change to it in the package.

A record written by an older version (a plain dict of the same keys) loads as it was; keys a later
version added are dropped, as ``ClusterSpec.from_json`` drops its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

from . import registry


@dataclass(frozen=True, kw_only=True)
class Remote:
    """Empty (``Remote()``) for a cluster on this machine or one Ray's operators run."""

    # asked: what ``up`` was told (--hosts, --ssh-key, --gpus-per-host, --python, --pip-index-url…)
    hosts: tuple[str, ...] = ()        # user@host[:port], the head first
    ssh_key: str | None = None
    known_hosts: str | None = None     # a file of our own (a cloud's fresh instances), else the user's
    gpus_per_host: int | None = None
    cpus_per_host: int | None = None
    python: str | None = None          # an environment of the user's on every host, else we make one
    install: bool = True               # make the runtime where it is missing
    pip_index_url: str | None = None   # the mirror the hosts install from
    extra: tuple[str, ...] = ()        # packages the jobs' storage needs on every host
    # found: what each host is, asked before anything is recorded (in the order of ``hosts``)
    pythons: tuple[str, ...] = ()      # the Python that runs Ray there
    ips: tuple[str, ...] = ()          # the address the other hosts reach it at
    # laid out: what a stop needs, recorded before anything starts
    temp_dirs: tuple[str, ...] = ()    # Ray's on each host
    token_path: str | None = None      # the cluster's token on every host
    head_ip: str | None = None
    gcs_port: int | None = None
    keeper_port: int | None = None     # the keeper's line, on the head's loopback
    keeper_host: str | None = None     # where the keeper listens as the SSH host sees it (None: the head's loopback)
    job_id: str | None = None          # the scheduler's job that holds the nodes (Slurm)
    walltime_end: float | None = None  # … when it ends at its time limit, as the scheduler says (the countdown)
    restarts: int = 0                  # … how often it was requeued (each run on an allocation of its own)
    # started: the head's watchdog and the tunnel's end here
    guard_home: str | None = None
    guard_pid: int | None = None
    line_address: str | None = None    # 127.0.0.1:PORT, the tunnel's end of the keeper's line

    @property
    def head(self) -> str | None:
        """The head host as the user named it."""
        return self.hosts[0] if self.hosts else None

    @classmethod
    def from_json(cls, data: dict | None) -> Remote:
        """The stored form (lists for tuples); keys this version does not know are dropped."""
        kept = {}
        for f in fields(cls):
            if f.name in (data or {}):
                value = data[f.name]
                kept[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**kept)


@dataclass(frozen=True)
class Asked:
    """Your own machines, as ``up`` was told of them."""

    hosts: tuple[str, ...]
    ssh_key: str | None
    gpus_per_host: int | None
    cpus_per_host: int | None
    python: str | None
    install: bool
    pip_index_url: str | None


@dataclass(frozen=True)
class StorageNeeds:
    """What the jobs' storage (``up --storage``) needs installed on every host."""

    extra: tuple[str, ...]


@dataclass(frozen=True)
class Found:
    """Each host asked what it is (``runtime.ready``), or read from Ray's on-premise provider."""

    pythons: tuple[str, ...]
    ips: tuple[str, ...]


@dataclass(frozen=True)
class LaidOut:
    """Where each host's processes keep their files and which ports the head asks for."""

    temp_dirs: tuple[str, ...]
    token_path: str
    head_ip: str
    gcs_port: int
    keeper_port: int


@dataclass(frozen=True)
class HeadStarted:
    """The ports the head's Ray and keeper got (others where the usual ones were taken there)."""

    gcs_port: int
    keeper_port: int


@dataclass(frozen=True)
class CloudHead:
    """A rented head as the cluster launcher left it: how to reach it, and where its Ray listens."""

    hosts: tuple[str, ...]
    head_ip: str
    ssh_key: str | None
    known_hosts: str
    gcs_port: int
    keeper_port: int
    pip_index_url: str | None


@dataclass(frozen=True)
class Guarded:
    """The head's watchdog running: where it keeps its state, and its pid (None: it started itself)."""

    guard_home: str
    guard_pid: int | None = None


@dataclass(frozen=True)
class LineOpened:
    """The tunnel's end here of the keeper's line."""

    line_address: str


@dataclass(frozen=True)
class Submitted:
    """The scheduler took the job: what a stop cancels."""

    job_id: str


@dataclass(frozen=True)
class Allocated:
    """The job runs: its nodes, where Ray and the keeper listen on the first one (reached through
    the login host), and where each node keeps Ray's files."""

    ips: tuple[str, ...]
    temp_dirs: tuple[str, ...]
    head_ip: str
    gcs_port: int
    keeper_port: int
    keeper_host: str
    walltime_end: float | None      # None: no time limit, or the scheduler did not say
    restarts: int = 0               # the job's run: 0, then one more each time it is requeued


Fact = Asked | StorageNeeds | Found | LaidOut | HeadStarted | CloudHead | Guarded | LineOpened | Submitted | Allocated
FACTS = (Asked, StorageNeeds, Found, LaidOut, HeadStarted, CloudHead, Guarded, LineOpened, Submitted, Allocated)


class Holder(Protocol):
    """What holds a remote record: a ``ClusterSpec``."""

    remote: Remote


def learn(spec: Holder, /, *facts: Fact, record_id: int | None = None, **columns) -> Remote:
    """What a backend learned, applied to ``spec.remote``; with ``record_id``, written to the
    registry in one transaction with ``columns`` (the whole spec among them, where it changed
    too) — merged into the stored record, so what another process learned there meanwhile (a
    reopened tunnel) is kept. The only change to a remote record."""
    changes: dict = {}
    for fact in facts:
        for f in fields(fact):
            value = getattr(fact, f.name)
            changes[f.name] = tuple(value) if isinstance(value, list) else value
    spec.remote = replace(spec.remote, **changes)
    if record_id is not None:
        registry.update(record_id, remote=changes, **columns)
    return spec.remote
