"""What a cell gives back to the notebook: its value and pulled variables, a rank's error (or its
death), the stop button's, and the ranks' output as it arrives (rank 0's as is, or every rank's
labelled)."""

from __future__ import annotations

import pickle
import sys
from dataclasses import dataclass, field

from ..errors import GpugeekError
from ..line.news import News
from ..workers.journal import BOUND_BYTES


class RemoteError(GpugeekError):
    """An exception in the user's cell on a worker: its traceback, labelled with the rank; out of
    GPU memory, the rank's reading of the GPU then (``oom.memory_at``)."""

    def __init__(self, rank: int, traceback_text: str, extra: str = "", preempted: dict | None = None,
                 memory: dict | None = None):
        super().__init__(f"rank {rank}: {traceback_text.strip().splitlines()[-1]}")
        self.rank, self.traceback_text, self.extra, self.memory = rank, traceback_text, extra, memory
        self.preempted = preempted    # the job stopped on a preemption notice: {step, deadline, nodes}

    def _render_traceback_(self) -> list[str]:
        lines = [f"\x1b[0;31mgpugeek: the cell failed on rank {self.rank}\x1b[0m",
                 *self.traceback_text.rstrip().splitlines()]
        return lines + (self.extra.splitlines() if self.extra else [])


class Interrupted(GpugeekError):
    """The stop button: every worker was interrupted."""


RAY_IN_WORDS = {      # Ray's exceptions, as the notebook says them: no name of Ray's reaches a user
    "GetTimeoutError": "its workers did not answer in time (their Python environment still building on the "
                       "hosts, or no room for them?)",
    "RuntimeEnvSetupError": "the workers' Python environment could not be made on the hosts",
    "RayActorError": "a worker's process ended",
    "ActorDiedError": "a worker's process ended",
    "ActorUnavailableError": "a worker could not be reached",
    "OutOfMemoryError": "a host ran out of memory",
    "NodeDiedError": "a host left the cluster",
    "ObjectLostError": "what a worker sent was lost with its host",
    "RaySystemError": "Ray failed on the hosts",
}


def in_words(exc: BaseException) -> str:
    """What went wrong, in the user's words: Ray's exceptions by what they mean (with the last line
    of what they say), the worker's own errors as they are."""
    if type(exc).__module__.split(".")[0] == "ray":
        means = next((RAY_IN_WORDS[k.__name__] for k in type(exc).__mro__ if k.__name__ in RAY_IN_WORDS),
                     "Ray failed on the hosts")
        detail = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = detail[-1] if detail else ""
        for name in RAY_IN_WORDS:
            said = said.replace(f"{name}: ", "").replace(name, "")
        return f"{means}: {said[:300]}" if said and "timed out" not in said.lower() else means
    return f"{type(exc).__name__}: {exc}"


class WorkerDied(Exception):
    def __init__(self, rank: int, why: str):
        super().__init__(f"worker {rank} died ({why})")
        self.rank = rank


def failure(outcome: dict) -> Exception | None:
    """What a cell's outcome (``workers/outcome.py``) raises in the notebook; None: it did not fail.
    A dead rank first (an error on a rank whose peer died under it is that death's); then the
    failed rank's error — the ``gg`` helper's own word in one line, as in the kernel — with the
    stuck ranks named and a preemption notice the ranks stopped on."""
    results, stuck, failed = outcome["results"], outcome["stuck"], outcome["failed"]
    if outcome["dead"] is not None:
        return WorkerDied(outcome["dead"], "its process ended")
    if failed is None:
        return None
    extra = (f"rank {', '.join(map(str, stuck))} did not stop (blocked in a collective), so the group was "
             f"stopped — its variables are gone, the next cell starts a new one" if stuck else "")
    notices = [r["preempted"] for r in results.values() if r.get("preempted")]
    preempted = {"step": notices[0]["step"], "deadline": max(n["deadline"] for n in notices),
                 "nodes": sorted({n["node"] for n in notices if n["node"]})} if notices else None
    if results[failed].get("said") and not extra:
        return GpugeekError(results[failed]["said"])
    return RemoteError(failed, results[failed]["error"], extra, preempted, results[failed].get("memory"))


@dataclass
class Result:
    """What a cell gave back: rank 0's last value, the pulled variables, the wall time."""

    value: dict | None = None
    pulled: dict = field(default_factory=dict)
    seconds: float = 0.0
    wrote: dict | None = None     # what rank 0 wrote in its folder, on nodes not the notebook's (``workers/files.py``)

    @classmethod
    def of(cls, first: dict, seconds: float) -> Result:
        """Rank 0's result of the cell (``Worker.execute``), as the notebook gets it: each pulled
        variable loaded here, or one line naming the one this kernel cannot load."""
        return cls(value=first.get("value"), seconds=seconds, wrote=first.get("wrote"),
                   pulled={name: _pulled(name, blob) for name, blob in (first.get("pulled") or {}).items()})

    def shown(self):
        """The value as the notebook should display it (None: nothing to display)."""
        if not self.value:
            return None
        if "pickle" in self.value:
            try:
                return pickle.loads(self.value["pickle"])
            except Exception:  # noqa: BLE001 - a class the notebook does not have
                return _Text("<a value of a type this notebook cannot load>")
        return _Text(self.value["repr"])


def _pulled(name: str, blob: bytes):
    """A pulled variable, loaded with the types this kernel has (plain pickle: ``workers/values.py``;
    a pandas object made again with this kernel's pandas, or refused in one line)."""
    try:
        return pickle.loads(blob)
    except GpugeekError as exc:    # a pandas object whose dtype cannot cross to this pandas (``values.plain``)
        raise GpugeekError(f"--pull {name}: {exc} — it is still on the workers: pull what it holds instead") from None
    except Exception as exc:  # noqa: BLE001 - said in one line; the variable stays on the workers
        raise GpugeekError(f"--pull {name}: this kernel cannot load it ({type(exc).__name__}: {exc}) — a type "
                           f"defined in a cell, or a module this kernel lacks; it is still on the workers: "
                           f"pull it as plain data (a tensor, a dict, a DataFrame)") from None


class _Text:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Printer:
    """Worker output into the cell: rank 0 as is, or every rank with a ``[rank N]`` prefix."""

    def __init__(self, all_ranks: bool):
        self.all_ranks = all_ranks
        self.at_line_start: dict[int, bool] = {}

    def show(self, rank: int, text: str) -> None:
        if not text or (rank != 0 and not self.all_ranks):
            return
        if self.all_ranks:
            out = []
            for piece in text.splitlines(keepends=True):
                if self.at_line_start.get(rank, True):
                    out.append(f"[rank {rank}] ")
                out.append(piece)
                self.at_line_start[rank] = piece.endswith("\n")
            text = "".join(out)
        sys.stdout.write(text)
        sys.stdout.flush()

    def show_ranks(self, ranks: dict, on_samples=None) -> None:
        """Each rank's output, in rank order ({rank: {"output", "samples"}}: a drain's or the
        outcome's), and its ``gg`` reports handed to ``on_samples``."""
        for rank in sorted(ranks):
            self.show(rank, ranks[rank].get("output", ""))
            if on_samples and ranks[rank].get("samples"):
                on_samples(ranks[rank]["samples"])


def show_drained(drained: News | None, printer: Printer, on_samples, on_node_samples, cursor: int,
                 step: int | None) -> tuple[int, int | None]:
    """A drain's answer (``progress.gather``, or a journal read from ``cursor``): the ranks' output
    shown and reports handed on, the nodes' reports to ``on_node_samples``; where to read on from,
    and the latest step the journal told of."""
    if not drained:
        return cursor, step
    if "next" in drained:           # read from the cell's journal: where to read on from
        if drained["dropped"] and drained["dropped"] > 0:
            print(f"\n[{drained['dropped']} earlier drains of this cell's output were dropped: rank 0 keeps the "
                  f"last {BOUND_BYTES >> 20} MiB]", flush=True)
        cursor, step = drained["next"], drained.get("step", step)
    printer.show_ranks(drained["ranks"], on_samples)
    if drained.get("nodes") and on_node_samples is not None:
        on_node_samples(drained["nodes"])
    return cursor, step
