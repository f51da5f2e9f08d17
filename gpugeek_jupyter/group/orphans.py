"""Worker groups whose kernel is gone. A group belongs to the cluster (its workers are detached),
so a kernel that dies leaves it running — its cell goes on, and `%gpugeek attach` can read it.
Once that cell has ended, the group is kept for the idle window (``UNCLAIMED_KEEP_S`` on a
cluster without one) with its journal and pulled variables: a new kernel reads them with
`%gpugeek attach JOB`, or takes the group over with `--adopt`. After that the next group started
from this machine removes it — sooner when that group needs its room, and says so — so a
restarted kernel never finds its cluster full of a dead kernel's workers; a new group that finds
no room says which jobs hold it. A kernel that exits
(shut down, restarted), or moves to another cluster, takes its group along, unless a job still
runs there (``leave``; ``cells/leaving.py`` asks it at a kernel's exit).

A group's owner is the kernel that started it (in its name: host, pid) until another adopts it
(rank 0 then keeps the new owner, ``Worker.adopted``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..cluster.processes import kernel_gone, this_kernel
from ..units import clock

NAMESPACE = "gpugeek"    # the Ray namespace of this package's named actors (every driver joins it)
PREFIX = "gpugeek-group/"
UNCLAIMED_KEEP_S = 1800.0   # a gone kernel's ended job's group is kept this long, where no idle window is set
FIRST_LOOK_S = 1.0       # a new group without room after this says what holds it…
ROOM_LOOK_S = 5.0        # …and looks again this often for a gone kernel's group to remove


def group_name(group_id: str, rank: int | None = None) -> str:
    """The Ray name of a group's placement group (rank None) or of one of its workers."""
    return f"{PREFIX}{group_id}" + ("" if rank is None else f"/{rank}")


def new_group_id() -> str:
    """This machine, this kernel's process, and a tag: whose group it is, by its name alone."""
    import uuid

    return f"{this_kernel()}:{uuid.uuid4().hex[:6]}"


def _owner(group_id: str, state: dict | None = None) -> str:
    """The kernel whose group it is: the last to adopt it, else the one that started it."""
    return (state or {}).get("owner") or group_id.rsplit(":", 1)[0]


def _workers(names: list[str]) -> str:
    return f"{len(names)} worker{'s' if len(names) != 1 else ''}"


def _kept_until(state: dict, keep_s: float | None) -> float:
    return (state.get("ended") or 0.0) + (UNCLAIMED_KEEP_S if keep_s is None else keep_s)


def reclaim(driver, keep_s: float | None = None, room_needed: bool = False) -> list[str]:
    """Remove the groups of kernels of this machine that are gone, whose job ended more than
    ``keep_s`` ago (the cluster's idle window) with nobody taking them over — or at once when a
    new group needs their room; say so, and return their ids. A group whose job still runs is left
    to finish, one within its window is kept for `%gpugeek attach`, and one that a live kernel
    adopted is that kernel's. ``driver`` asks the cluster (``driving``)."""
    gone = []
    for group_id in driver.groups():
        if not kernel_gone(_owner(group_id)):
            continue
        state = driver.lead_state(group_id)       # None: rank 0 is dead, and nothing of the group can run
        within = state is not None and time.time() < _kept_until(state, keep_s)   # its window for `attach`
        if state is not None and (state["running"] or not kernel_gone(_owner(group_id, state))
                                  or (within and not room_needed)):
            continue
        driver.remove_group(group_id)
        gone.append(group_id)
        print(f"note: removed the worker group of a kernel that is gone ({group_id})"
              f"{_why_removed(state, early=within)}", flush=True)
    return gone


def _why_removed(state: dict | None, early: bool) -> str:
    """What the removal note says of the group's last job (nothing when rank 0 was dead)."""
    if not state or not state.get("job") or not state.get("ended"):
        return ""
    step = f" (step {state['step']})" if state.get("step") else ""
    why = f": job {state['job'].get('name')!r} ended at {clock(state['ended'])}{step} and nobody took it over"
    return why + ("; this cell needed its room, so its output and pulled variables are gone with it" if early else "")


def holders(driver, besides: str) -> list[str]:
    """What the cluster's other worker groups hold its room for, a phrase each: a job that runs
    (whose kernel, how many workers, which step), or another kernel's warm group."""
    said = []
    for group_id, names in driver.groups().items():
        state = None if group_id == besides else driver.lead_state(group_id)
        if state is None or not state.get("job"):
            continue
        job, owner = state["job"], _owner(group_id, state)
        gone = kernel_gone(owner)
        what = f"job {job.get('name')!r} ({job.get('id')}) of kernel {owner}{' (gone)' if gone else ''}"
        if state["running"]:
            said.append(f"{what} runs on {_workers(names)}, at step {state.get('step')}")
        elif gone is None:
            said.append(f"{what} ended; that kernel, on another machine, keeps {_workers(names)} warm")
        elif gone is False:
            said.append(f"{what} ended; its {_workers(names)} wait for that kernel's next cell "
                        f"(`%gpugeek reset` there frees them)")
    return said


def wait_for_room(driver, ready, timeout: float, besides: str, keep_s: float | None = None,
                  growing: Callable[[], str] | None = None) -> bool:
    """Wait up to ``timeout`` for a new group's placement group (``ready``). Meanwhile a gone
    kernel's group whose job ended is removed (this cell needs its room, window or not), and what
    holds the room is said once: a restarted kernel learns that its old job still runs. On a
    cluster that grows, ``growing()`` says what the wait is for when no group holds the room (asked
    only once the wait is real: it reads the cluster's free room then)."""
    import ray

    deadline = time.monotonic() + timeout
    look, said = FIRST_LOOK_S, False
    while True:
        done, _ = ray.wait([ready], timeout=max(0.0, min(look, deadline - time.monotonic())))
        if done or time.monotonic() >= deadline:
            return bool(done)
        look = ROOM_LOOK_S
        reclaim(driver, keep_s, room_needed=True)
        held = [] if said else holders(driver, besides)
        if held:
            print(f"note: waiting for room on the cluster: {'; '.join(held)} — this cell waits up to "
                  f"{timeout:.0f} s in all", flush=True)
            said = True
        elif growing and not said:
            print(f"note: waiting for {growing()} — this cell waits up to {timeout:.0f} s in all", flush=True)
            said = True


def leave(group) -> bool:
    """Stop ``group`` unless a job still runs there (True then): its workers are detached, so a
    kernel that exits, or moves to another cluster, would otherwise leave them on this one."""
    import ray

    if group.broken or not group.workers or not group.connected():
        return False
    try:
        if ray.get(group.workers[0].state.remote(), timeout=5).get("running"):
            return True
        group.stop()
    except Exception:  # noqa: BLE001 - the cluster out of reach as the kernel goes: the orphan sweep
        pass
    return False
