"""The keeper's supervisor, in the head's watchdog: it starts the keeper (``keeper/serve.py``) beside
itself, and starts it again at the next look should it die — the groups it held are named and
detached, so the new one finds them, and a kernel's line dials it again by itself.

The keeper runs in a session of its own carrying the cluster's marker, as the watchdog and Ray do,
so every stop of the cluster's processes on this host ends it too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Ray first, as in every Ray process: it puts the packages it ships (psutil) on the path
BOOT = ("import sys, runpy, ray\nsys.argv[0] = 'keeper'\n"
        "runpy.run_module('gpugeek_jupyter.keeper.serve', run_name='__main__')")
RESTARTS_SAID = 20        # after this many starts in a row that died at once, it is said and left


class Keeper:
    """The keeper process of this head: its order (``keeper.json``) is written from the watchdog's."""

    def __init__(self, order: dict, home: Path):
        self.home = home
        self.path = home / "keeper.json"
        self.log = home / "keeper.log"
        keeper = order.get("keeper") or {}
        self.order = {"gcs": order["gcs"], "ip": order["ip"], "token_path": order["token_path"],
                      "port": keeper.get("port"), "host": keeper.get("host"), "home": str(home / "keeper"),
                      "index_url": keeper.get("index_url")}
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0

    @property
    def wanted(self) -> bool:
        return bool(self.order["port"])

    def start(self) -> int:
        self.path.write_text(json.dumps(self.order))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", BOOT, str(self.path)], env=dict(os.environ),
                                         stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd=self.home)
        self.starts += 1
        self.started_at = time.time()
        return self.proc.pid

    def stop(self, grace: float = 2.0) -> None:
        """End it (a Slurm job's head: once its watchdog ends, nothing may outlive the job's step)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill_now(self) -> None:
        """End it from a signal handler: SIGKILL to its session, waiting for nothing — the handler
        may have come while this process waited on it, and Popen's wait is not reentrant (a wait
        here would wait on its own lock for good)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)      # its own session: pid == process group
            except OSError:
                pass

    def tend(self) -> str | None:
        """At each look: start it again if it died; what to put in the ledger, or None."""
        if not self.wanted or self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        if self.starts >= RESTARTS_SAID and time.time() - self.started_at < 60:
            return None if self.starts > RESTARTS_SAID else self._said(code, again=False)
        pid = self.start()
        return self._said(code, again=True, pid=pid)

    def _said(self, code: int, again: bool, pid: int | None = None) -> str:
        tail = self.log.read_bytes()[-400:].decode(errors="replace").strip().splitlines()[-1:] \
            if self.log.exists() else []
        why = f"the keeper ended (exit {code}{': ' + tail[0] if tail else ''})"
        if again:
            return f"{why}; started again (pid {pid}): kernels dial it again by themselves"
        self.starts += 1
        return f"{why}, {RESTARTS_SAID} times in a row — left stopped; its log: {self.log}"
