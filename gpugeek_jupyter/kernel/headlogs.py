"""Why a cluster's head has no keeper for a kernel: the end of the head's logs, read over SSH
(``onhost/headlogs.py``, sent to the head's Python), said in one line — the watchdog that could not
start or the keeper that ended, on which Python, the exception it ended on and where its log is —
in place of a guess. A kernel waiting for its keeper looks every few seconds (``Waiting``), so a
watchdog that died at its start is said at once, not after the whole wait.
"""

from __future__ import annotations

import re
import time
from pathlib import Path, PurePosixPath

from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..remote import ssh

SCRIPT = Path(__file__).resolve().parent.parent / "onhost" / "headlogs.py"    # read as text and sent, never imported
LOOK_FIRST_S = 3.0      # a watchdog just started imports Ray first: no look before this
LOOK_EVERY_S = 5.0
TRACEBACK = "Traceback (most recent call last):"
PYTHON = re.compile(r"/python(3\.\d+)/")
# what a Python that cannot run the code fails with: the same at every start (never waited out)
AT_EVERY_START = ("ImportError", "ModuleNotFoundError", "SyntaxError")


class HeadFailed(GpugeekError):
    """The head's watchdog or keeper could not start: nothing there lets a kernel in."""


def home(record: ClusterRecord) -> str | None:
    """The head watchdog's home there (its logs, the keeper's), as the head's order named it."""
    remote = ClusterSpec.from_json(record.spec).remote
    if remote.guard_home:
        return remote.guard_home
    return str(PurePosixPath(remote.token_path).parent / "head") if remote.token_path else None


def look(record: ClusterRecord, timeout: float = 20) -> dict | None:
    """The end of the head's logs and which of its watchdog and keeper runs; None when it cannot
    be read (the head does not answer over SSH)."""
    remote, folder = ClusterSpec.from_json(record.spec).remote, home(record)
    if not remote.head or not folder:
        return None
    python = (remote.pythons or [remote.python or "python3"])[0]
    try:
        head = ssh.parse_hosts([remote.head])[0]
        done = ssh.run(head, remote.ssh_key, f"{ssh.quote(python)} - {ssh.quote(folder)}", SCRIPT.read_text(),
                       timeout=timeout)
        answer = ssh.answer(head, "reading the head's logs", done)
    except GpugeekError:
        return None
    return answer if answer.get("ok") else None


def failure(lines: list[str] | None) -> tuple[str, str | None, bool] | None:
    """A log's last traceback: the exception it ended on, the Python it ran on (from its frames'
    paths), and whether it came while its modules were imported; None without one."""
    starts = [i for i, line in enumerate(lines or []) if line.startswith(TRACEBACK)]
    if not starts:
        return None
    rest = lines[starts[-1] + 1:]
    error = next((line.strip() for line in rest if line.strip() and not line.startswith(" ")), None)
    if error is None:
        return None
    python = next((m.group(1) for line in rest if (m := PYTHON.search(line))), None)
    importing = any(line.strip().startswith("File ") and line.endswith("in <module>") and '"<string>"' not in line
                    for line in rest)
    return error, python, importing


def _ended_by_guard(lines: list[str] | None) -> bool:
    """``onhost.py guard`` answered (its last line, JSON): on a Slurm head it waits for its watchdog."""
    last = next((line for line in reversed(lines or []) if line.strip()), "")
    return last.startswith("{") and '"ok"' in last


def said(record: ClusterRecord, answer: dict, final: bool, traced: bool = False) -> str | None:
    """One line on what failed on the head, or None while its logs show nothing that will not clear
    by itself (``final``: the wait is over — the keeper's last failure is said too; ``traced``: only
    a failure its log shows the exception of)."""
    remote = ClusterSpec.from_json(record.spec).remote
    where = f"{remote.head}:{home(record)}"
    logs, running = answer.get("logs") or {}, answer.get("running")
    sees = running is not None and not remote.job_id      # a Slurm head's processes are not the login node's
    watchdog_gone = (sees and not running.get("watchdog")) or _ended_by_guard(logs.get("guard.log"))
    if watchdog_gone:
        for log in ("watchdog.log", "guard.log"):
            found = failure(logs.get(log))
            if found is not None:
                error, python, importing = found
                on = f" on Python {python}" if python else ""
                return (f"the head's watchdog {'could not start' if importing else 'ended'}{on}: {error} — its "
                        f"log: {where}/{log}")
        if traced:
            return None
        last = next((line.strip() for line in reversed(logs.get("watchdog.log") or []) if line.strip()), None)
        return (f"the head's watchdog is not running ({f'its log ends {last!r}' if last else 'it left no log'}) — "
                f"its log: {where}/watchdog.log")
    found = failure(logs.get("keeper.log"))
    keeper_runs = sees and running.get("keeper")
    # the watchdog starts a keeper that ended again: waited out, unless it fails as it imports
    if found is not None and (final or (not keeper_runs and (found[2] or found[0].split(":")[0] in AT_EVERY_START))):
        error, python, importing = found
        on = f" on Python {python}" if python else ""
        return (f"the head's keeper {'could not start' if importing else 'ended'}{on}: {error} — its log: "
                f"{where}/keeper.log")
    return None


def ended(record: ClusterRecord) -> str | None:
    """What the head's logs say ended there, with its exception (a start that failed while the
    head's watchdog ran: on Slurm one that could not start ends the job, and Ray with it)."""
    answer = look(record, timeout=10)
    return said(record, answer, final=True, traced=True) if answer is not None else None


class Waiting:
    """A kernel waiting for its cluster's keeper: after each dial that failed, the head's logs are
    read every few seconds, and what will not clear by itself is said at once (``HeadFailed``)."""

    def __init__(self, record: ClusterRecord, wait_s: float):
        now = time.monotonic()
        self.record, self.deadline, self.next_look = record, now + wait_s, now + LOOK_FIRST_S

    def failed(self, why: str) -> None:
        """Raises once waiting longer cannot help, or the wait is over; else returns (dial again)."""
        now, name = time.monotonic(), self.record.name
        over = now > self.deadline
        if over or now >= self.next_look:
            answer = look(self.record)
            self.next_look = time.monotonic() + LOOK_EVERY_S
            line = said(self.record, answer, final=over) if answer is not None else None
            if line is not None:
                raise HeadFailed(f"cluster {name!r}: {line}") from None
        if over:
            remote, folder = ClusterSpec.from_json(self.record.spec).remote, home(self.record)
            logs = f"its logs: {remote.head}:{folder}/keeper.log and watchdog.log" if folder else "its head's logs"
            raise GpugeekError(f"cluster {name!r}'s keeper does not answer on its head ({why}) — {logs}; "
                               f"`%gpugeek up {name}` tries again") from None
