"""What a kernel and its cluster's keeper say to each other: one dataclass per message, built by
keyword, each field typed: plain data (text, numbers, lists, dicts, bytes) or a *record* — a
dataclass of plain data registered with ``record`` (the run options, ``workers/options.py``), which
crosses as a dict named for it and is made again on the other end. A message crosses the line as a
pickle of builtins alone (protocol 5), read back by an unpickler that refuses every class — so no
code object, and none of our classes, ever crosses: the two ends may run other Pythons and other Rays.

Values a cell pushes or pulls travel inside as ``bytes`` (pickled by the side that has their
types); the messages themselves never hold them as objects.

A conversation opens with ``Hello`` (the kernel's protocol and versions) and ``Welcome`` (the
keeper's), or ``Refused`` with the reason in one line. Every request then gets one reply — the
type its ``request`` declaration names (``Done`` where there is nothing to tell), or ``Failed`` —
and any number of ``Said`` before it: what the keeper prints while it works on the request (a
group waiting for room, say), shown in the cell. A reply of another type is a broken line.
"""

from __future__ import annotations

from dataclasses import field

from .codec import (
    MESSAGES,
    RECORDS,
    REPLIES,
    Plain,
    ProtocolError,
    Record,
    decode,
    encode,
    message,
    record,
    reply_fits,
    request,
)
from .news import LeadWord, News

__all__ = ["MESSAGES", "PROTOCOL", "RECORDS", "REPLIES", "Plain", "ProtocolError", "Record", "decode", "encode",
           "message", "record", "reply_fits", "request"]     # with every message below

PROTOCOL = 2        # a change to any message below is a new protocol: both ends must agree


# -- opening ---------------------------------------------------------------------------------------

@message
class Hello:
    """The kernel: who it is and what it speaks."""

    protocol: int
    package: str            # gpugeek-jupyter's version in the kernel
    python: str             # the kernel's Python, "3.12.1"
    ray: str | None         # the kernel's Ray (None: none installed)
    kernel: str             # host:pid, as the cluster knows a kernel (whose groups, whose jobs)


@message
class Welcome:
    """The keeper: what it runs, on the head."""

    protocol: int
    package: str
    python: str
    ray: str
    torch: str | None
    pid: int
    head: str               # the head's address on the cluster's network


@message
class Refused:
    why: str


# -- replies ---------------------------------------------------------------------------------------

@message
class Done:
    """A request done, with nothing to tell."""


@message
class Failed:
    """A request that failed: ``why`` is one line for the user. ``ours``: the keeper's own fault
    (its type and message, the traceback in the keeper's log), not a mistake the user can mend."""

    why: str
    ours: bool = False


@message
class Said:
    """What the keeper printed while it worked on the request: shown in the cell as it comes."""

    text: str


# -- a worker group, held by the keeper for a kernel ----------------------------------------------------

@message
class GroupStarted:
    group_id: str
    options: Record                     # the group's RunOptions
    info: list[dict[str, Plain]]        # each rank's description (``Worker.setup``)
    notes: list[str] = field(default_factory=list)


@request(GroupStarted | Done)
class StartGroup:
    """Build (or find already built) the group ``group_id`` for ``options`` (a ``RunOptions``).
    ``background``: answer ``Done`` at once and build it after (``up --workers``: the first cell finds it)."""

    group_id: str
    options: Record
    owner: str
    sample_gpus: bool = True
    notices: str | None = None
    grows: bool = True
    keep_s: float | None = None
    background: bool = False


@request(GroupStarted)
class AdoptGroup:
    """Kernel ``owner`` takes over the group of a kernel that is gone (``attach --adopt``)."""

    group_id: str
    owner: str


@request(Done)
class StopGroup:
    group_id: str


@message
class Staying:
    """Whether a job still runs on the group (so it stays)."""

    running: bool


@request(Staying)
class LeaveGroup:
    """The kernel goes: the group is stopped unless a job runs on it."""

    group_id: str


@message
class RankVersions:
    ranks: list[dict[str, str | None]]      # by rank: {module: its version, None where it has none}


@request(RankVersions)
class Versions:
    """Each rank's version of each module (``versions.version_of``)."""

    group_id: str
    names: list[str]


@message
class NodeSamples:
    samples: list[dict[str, Plain]]         # each sampler's reports (``meter/telemetry.py``)


@request(NodeSamples)
class DrainTelemetry:
    """The node samplers' reports since the last ask, at most once every ``every`` seconds."""

    group_id: str
    every: float = 0.0


@message
class Held:
    """What the keeper holds for new groups: each module's version, the pip requirements, and
    whether a working folder came."""

    modules: dict[str, str]
    pip: list[str]
    working_dir: bool


@request(Held)
class Ship:
    """What every new group's workers get besides the package: the kernel's modules (each a
    ``name``, ``version`` and a gzipped tar ``archive`` of its files and metadata, or a ``pip``
    requirement), ``up --env``'s requirements and the folder each cell starts in (a gzipped tar),
    as Ray's ``runtime_env`` sends them to the nodes. What is None stays as it was."""

    modules: list[dict[str, Plain]] = field(default_factory=list)
    pip: list[str] | None = None
    working_dir: bytes | None = None


# -- a cell ----------------------------------------------------------------------------------------------

@message
class CellNews:
    """What the cell sent home since the cursor (``journal.Journal.since``: the ranks' output and
    reports, the nodes' samples, ``next``, and ``outcome`` once it ended), and whether the group is
    broken (the keeper stopped it: a rank died or stuck)."""

    number: int
    news: News
    broken: bool = False


@request(CellNews)
class RunCell:
    """A cell for the group, as source text. ``uid`` is the kernel's name for this sending: sent
    again after the line came back, it is not run again. The reply waits up to ``wait_s`` for the
    cell's first news (an empty cell's whole outcome comes with it)."""

    uid: str
    group_id: str
    source: str
    options: Record                 # the cell's RunOptions
    pull: list[str]
    job: dict[str, Plain]           # the ledger's job: id, name, kernel
    push: bytes | None = None       # the pushed variables, pickled by the kernel
    wait_s: float = 0.0


@request(CellNews)
class ReadCell:
    """The cell's journal from ``cursor`` on, held up to ``wait_s`` for news."""

    group_id: str
    number: int
    cursor: int
    wait_s: float


@message
class Stopped:
    """The stop button's end: whether a rank was stuck, and the group had to go."""

    broken: bool


@request(Stopped)
class Interrupt:
    """The stop button: every rank of the group's cell sent as ``uid`` (one that has not come yet
    never runs)."""

    group_id: str
    uid: str


# -- the cluster's groups and jobs, whoever started them ------------------------------------------------------

@message
class Groups:
    groups: dict[str, list[str]]        # {group id: its workers' names, by rank}


@request(Groups)
class ListGroups:
    """Every worker group on the cluster."""


@message
class GroupState:
    state: LeadWord | None              # None: rank 0 is gone


@request(GroupState)
class LeadState:
    """Rank 0's word on its group (``Worker.state``)."""

    group_id: str


@request(Done)
class RemoveGroup:
    group_id: str


@message
class Jobs:
    kept: list[tuple[str, dict[str, Plain]]]     # (its group, the job) for every kept job


@request(Jobs)
class KeptJobs:
    """Every job the cluster's groups keep."""


@message
class Journal:
    news: News | None                   # None: the job is no longer kept


@request(Journal)
class ReadJournal:
    """A kept job's journal from ``cursor`` on (``attach``)."""

    group_id: str
    number: int
    cursor: int
    wait_s: float


@request(Done)
class InterruptJob:
    """The stop button from a kernel that attached: every rank of the group."""

    group_id: str
    number: int


# -- the cluster's nodes ---------------------------------------------------------------------------------------

@message
class Answer:
    yes: bool


@request(Answer)
class NodeAnswers:
    """Whether the node still runs work (a worker can die alone on a node that lives on)."""

    node_id: str


@request(Done)
class WaitGone:
    """Until Ray finds these nodes gone, or ``until`` (Unix time)."""

    node_ids: list[str]
    until: float


@message
class RoomFor:
    workers: int


@request(RoomFor)
class Room:
    """How many workers of ``each`` ``kind`` (GPU or CPU) the cluster holds now."""

    kind: str
    each: float


@request(Done)
class NeverFits:
    """Refuse at once a group the cluster could never hold (``placement.never_fits``)."""

    workers: int
    gpus_per_worker: float
    grows: bool


@message
class Examined:
    """What ``health.nodes.examine`` found, as plain data: each node's facts, the pairs' and links'
    figures, the collectives that failed, the phases' times, and the head's own versions."""

    facts: list[dict[str, Plain]]
    pairs: list[list[Plain]]
    links: list[list[Plain]]
    failed: list[list[Plain]]
    phases: dict[str, float]
    took_s: float
    reference: dict[str, str | None]


@request(Examined)
class Examine:
    """``doctor``'s look at every node (``health.nodes.examine``), from the head."""

    packages: list[str]
    labels: dict[str, str]
    gcs_port: int | None = None
