"""What rank 0 tells of a cell and of its group, as the line carries it (``CellNews``,
``Journal``, ``GroupState``): declared shapes of plain data. Rank 0 makes them as dicts
(``workers/journal.py``, ``workers/outcome.py``, ``Worker.state``); ``tests/test_journal.py``
holds those to the keys declared here."""

from __future__ import annotations

from typing import TypedDict

from .codec import Plain


class RankNews(TypedDict):
    output: str                         # what the rank printed since the last read
    samples: list[dict[str, Plain]]     # its reports (``workers/options.Report``)


class Outcome(TypedDict):
    """A cell's end across the ranks (``workers/outcome.py``)."""

    results: dict[int, dict[str, Plain]]    # each rank's result: ok, value or error, output, …
    failed: int | None                  # the first rank whose cell failed
    dead: int | None                    # a rank whose worker died
    stuck: list[int]                    # ranks that did not stop when told


class _Drained(TypedDict):
    ranks: dict[int, RankNews]
    nodes: list[dict[str, Plain]]       # the node samplers' reports
    running: bool


class News(_Drained, total=False):
    """A cell's journal from a cursor on (``workers/journal.Journal.since``)."""

    next: int                           # where the next read begins
    dropped: int                        # entries before it that rank 0's bound let go
    step: int | None
    cell: int | None
    job: dict[str, Plain] | None
    outcome: Outcome | None             # once the cell ended


class LeadWord(TypedDict):
    """Rank 0's word on its group (``Worker.state``)."""

    cell: int | None
    job: dict[str, Plain] | None
    running: bool
    step: int | None
    began: float | None
    ended: float | None
    owner: str | None
