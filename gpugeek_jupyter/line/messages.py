"""What a kernel and its cluster's keeper say to each other: one dataclass per message, each field
plain data (text, numbers, lists, dicts, bytes). A message crosses the line as a pickle of those
builtins alone (protocol 5), read back by an unpickler that refuses every class — so no code object,
and none of our classes, ever crosses: the two ends may run other Pythons and other Rays.

Values a cell pushes or pulls travel inside as ``bytes`` (pickled by the side that has their
types); the messages themselves never hold them as objects.

A conversation opens with ``Hello`` (the kernel's protocol and versions) and ``Welcome`` (the
keeper's), or ``Refused`` with the reason in one line. Every request then gets one reply — its own
message, ``Done`` with a plain value, or ``Failed`` — and any number of ``Said`` before it: what
the keeper prints while it works on the request (a group waiting for room, say), shown in the cell.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field, fields
from typing import Any

PROTOCOL = 1        # a change to any message below is a new protocol: both ends must agree

MESSAGES: dict[str, type] = {}


class ProtocolError(Exception):
    """What came over the line is no message of this protocol."""


def message(cls):
    """A message type: a frozen dataclass, known by its name on both ends."""
    cls = dataclass(frozen=True)(cls)
    MESSAGES[cls.__name__] = cls
    return cls


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
    """A request done; ``value`` is its plain answer (None for none)."""

    value: Any = None


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
class StartGroup:
    """Build (or find already built) the group ``group_id`` for ``options`` (``RunOptions``' fields).
    ``background``: answer at once and build it after (``up --workers``: the first cell finds it)."""

    group_id: str
    options: dict
    owner: str
    sample_gpus: bool = True
    notices: str | None = None
    grows: bool = True
    keep_s: float | None = None
    background: bool = False


@message
class GroupStarted:
    group_id: str
    options: dict
    info: list              # each rank's description (``Worker.setup``)
    notes: list = field(default_factory=list)


@message
class AdoptGroup:
    """Kernel ``owner`` takes over the group of a kernel that is gone (``attach --adopt``)."""

    group_id: str
    owner: str


@message
class StopGroup:
    group_id: str


@message
class LeaveGroup:
    """The kernel goes: the group is stopped unless a job runs on it (``Done(True)`` then)."""

    group_id: str


@message
class Versions:
    """Each rank's version of each module (``versions.version_of``)."""

    group_id: str
    names: list


@message
class DrainTelemetry:
    """The node samplers' reports since the last ask, at most once every ``every`` seconds."""

    group_id: str
    every: float = 0.0


@message
class Ship:
    """What every new group's workers get besides the package: the kernel's modules (each a
    ``name``, ``version`` and a gzipped tar ``archive`` of its files and metadata, or a ``pip``
    requirement), ``up --env``'s requirements and the folder each cell starts in (a gzipped tar),
    as Ray's ``runtime_env`` sends them to the nodes. What is None stays as it was; ``Done`` tells
    what the keeper holds ({"modules": {name: version}, "pip": [...], "working_dir": bool})."""

    modules: list = field(default_factory=list)
    pip: list | None = None
    working_dir: bytes | None = None


# -- a cell ----------------------------------------------------------------------------------------------

@message
class RunCell:
    """A cell for the group, as source text. ``uid`` is the kernel's name for this sending: sent
    again after the line came back, it is not run again. The reply waits up to ``wait_s`` for the
    cell's first news (an empty cell's whole outcome comes with it)."""

    uid: str
    group_id: str
    source: str
    options: dict
    pull: list
    job: dict
    push: bytes | None = None       # the pushed variables, pickled by the kernel
    wait_s: float = 0.0


@message
class ReadCell:
    """The cell's journal from ``cursor`` on, held up to ``wait_s`` for news."""

    group_id: str
    number: int
    cursor: int
    wait_s: float


@message
class CellNews:
    """What the cell sent home since the cursor (``journal.Journal.since``: the ranks' output and
    reports, the nodes' samples, ``next``, and ``outcome`` once it ended), and whether the group is
    broken (the keeper stopped it: a rank died or stuck)."""

    number: int
    news: dict
    broken: bool = False


@message
class Interrupt:
    """The stop button: every rank of the group's cell sent as ``uid`` (one that has not come yet
    never runs); ``Done(broken)``: a rank was stuck, and the group had to go."""

    group_id: str
    uid: str


# -- the cluster's groups and jobs, whoever started them ------------------------------------------------------

@message
class ListGroups:
    """Every worker group on the cluster: ``Done({group id: its workers' names, by rank})``."""


@message
class LeadState:
    """Rank 0's word on its group (``Worker.state``), None when rank 0 is gone."""

    group_id: str


@message
class RemoveGroup:
    group_id: str


@message
class KeptJobs:
    """Every job the cluster's groups keep: ``Done([[group id, job], …])``."""


@message
class ReadJournal:
    """A kept job's journal from ``cursor`` on (``attach``); ``Done(None)`` when no longer kept."""

    group_id: str
    number: int
    cursor: int
    wait_s: float


@message
class InterruptJob:
    """The stop button from a kernel that attached: every rank of the group."""

    group_id: str
    number: int


# -- the cluster's nodes ---------------------------------------------------------------------------------------

@message
class NodeAnswers:
    """Whether the node still runs work (a worker can die alone on a node that lives on)."""

    node_id: str


@message
class WaitGone:
    """Until Ray finds these nodes gone, or ``until`` (Unix time)."""

    node_ids: list
    until: float


@message
class Room:
    """How many workers of ``each`` ``kind`` (GPU or CPU) the cluster holds now."""

    kind: str
    each: float


@message
class NeverFits:
    """Refuse at once a group the cluster could never hold (``placement.never_fits``)."""

    workers: int
    gpus_per_worker: float
    grows: bool


@message
class Examine:
    """``doctor``'s look at every node (``health.nodes.examine``), from the head."""

    packages: list
    labels: dict
    gcs_port: int | None = None


# -- encoding ---------------------------------------------------------------------------------------------------

def encode(number: int, msg) -> bytes:
    """The message as it crosses the line: a pickle of builtins alone."""
    body = {f.name: getattr(msg, f.name) for f in fields(msg)}
    return pickle.dumps({"id": number, "type": type(msg).__name__, "fields": body}, protocol=5)


class _Builtins(pickle.Unpickler):
    """Reads builtins only: any class a pickle names is refused, ours and everyone's."""

    def find_class(self, module: str, name: str):
        raise ProtocolError(f"a message may hold plain data only, not {module}.{name}")


def decode(data: bytes) -> tuple[int, object]:
    """(the request id, the message) from what came over the line."""
    try:
        raw = _Builtins(io.BytesIO(data)).load()
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything unreadable is a broken message
        raise ProtocolError(f"an unreadable message ({type(exc).__name__})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("fields"), dict) or not isinstance(raw.get("id"), int):
        raise ProtocolError("a message is a dict of id, type and fields")
    cls = MESSAGES.get(raw.get("type"))
    if cls is None:
        raise ProtocolError(f"no message {raw.get('type')!r} in protocol {PROTOCOL}")
    known = {f.name for f in fields(cls)}
    if set(raw["fields"]) - known:
        raise ProtocolError(f"{cls.__name__} has no field {sorted(set(raw['fields']) - known)[0]!r}")
    try:
        return raw["id"], cls(**raw["fields"])
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None
