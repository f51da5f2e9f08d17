"""A cell's outcome across the ranks: {"results": {rank: result}, "failed": rank, "dead": rank,
"stuck": [ranks]}. Judged one way wherever the cell is led: by rank 0 (``Worker.execute_all``),
and by a kernel that sent the cell to every rank itself (``group/sending.py``).
"""

from __future__ import annotations

import pickle

from .options import CellCall

CANCEL_WAIT_S = 2.0     # how long the ranks get to stop once one failed; longer: stuck


def fresh(dead: int | None = None) -> dict:
    """An outcome with no rank heard from yet."""
    return {"results": {}, "failed": None, "dead": dead, "stuck": []}


def judge(rank: int, result: dict, outcome: dict) -> None:
    """A rank's result into the cell's outcome: the first error (not an interrupt) failed it."""
    outcome["results"][rank] = result
    if not result["ok"] and not result.get("interrupted") and outcome["failed"] is None:
        outcome["failed"] = rank


def died(rank: int, outcome: dict) -> None:
    """A rank found dead: the first one found is the one named."""
    if outcome["dead"] is None:
        outcome["dead"] = rank


def collect(rank: int, ref, outcome: dict) -> None:
    """A rank's finished actor call into the cell's outcome (a dead actor noted as such)."""
    import ray

    try:
        result = ray.get(ref)
    except ray.exceptions.RayActorError:
        died(rank, outcome)
        return
    except Exception as exc:  # noqa: BLE001 - Ray could not run the call at all: say it as the rank's error
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "output": "", "samples": []}
    judge(rank, result, outcome)


def for_peers(call: CellCall) -> bytes:
    """Rank 0's call as the other ranks get it, pickled (``CellCall.for_peers``)."""
    return pickle.dumps(call.for_peers())
