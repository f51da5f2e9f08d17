"""Reaching the user's own machines over SSH: the host list, the ``ssh`` command line (the tunnel
uses it too), and running ``onhost`` on a host.

We call the system's ``ssh`` (the user's config, agent and keys apply) in batch mode: no prompt
ever blocks a notebook. Host keys are learned on first contact into ``$GPUGEEK_HOME/known_hosts``
and checked from then on (``StrictHostKeyChecking=accept-new``).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..config import home
from ..errors import GpugeekError

HOST = re.compile(r"(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?(?P<host>[A-Za-z0-9][A-Za-z0-9.-]{0,252})"
                  r"(?::(?P<port>\d{1,5}))?")
# the script that runs on a host (standard library only), read as text and sent, never imported;
# it travels as one text, its folder marks first (``host_script``)
ONHOST = Path(__file__).resolve().parent.parent / "onhost" / "script.py"
HOST_SCRIPT = (ONHOST.with_name("marks.py"), ONHOST)
CONNECT_TIMEOUT_S = 10


def host_script() -> str:
    """The host script as it is sent over SSH, copied onto a cloud's nodes or into a Slurm job's
    folder: its parts joined, each one idea of its own in the package (``onhost/``)."""
    return "\n\n".join(part.read_text() for part in HOST_SCRIPT)


@dataclass(frozen=True)
class Target:
    """One host as the user named it: ``[USER@]HOST[:PORT]``."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}{f':{self.port}' if self.port else ''}"


def parse_hosts(text: str | Sequence[str] | None) -> list[Target]:
    """``--hosts a,b,c`` (or a record's hosts) as targets, or one line saying which entry is wrong."""
    items = [t.strip() for t in (text or "").split(",")] if text is None or isinstance(text, str) else list(text)
    items = [t for t in items if t]
    if not items:
        raise GpugeekError("--hosts names no machine — name them, like --hosts ubuntu@10.0.0.5,10.0.0.6")
    targets = []
    for item in items:
        match = HOST.fullmatch(item)
        if not match or (match["port"] and not 0 < int(match["port"]) < 65536):
            raise GpugeekError(f"--hosts {item!r} is not a host — write each host as [USER@]HOST[:PORT]")
        targets.append(Target(match["host"], match["user"], int(match["port"]) if match["port"] else None))
    if len({t.host for t in targets}) != len(targets):
        raise GpugeekError("--hosts: a host is named twice — name each once")
    return targets


def local_dir(name: str, cluster_id: int) -> Path:
    """This machine's folder for one ssh cluster's logs (0700)."""
    folder = home() / "ssh" / f"{name}-{cluster_id}"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def options(key: str | None, known_hosts: str | None = None) -> list[str]:
    """``known_hosts``: a file of the cluster's own (a cloud reuses public addresses for other
    machines), else ours for every host the user named."""
    known = known_hosts or home() / "known_hosts"
    opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={known}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
    if key:
        opts += ["-i", str(Path(key).expanduser()), "-o", "IdentitiesOnly=yes"]
    return opts


def argv(target: Target, key: str | None, *remote: str, known_hosts: str | None = None) -> list[str]:
    port = ["-p", str(target.port)] if target.port else []
    dest = f"{target.user}@{target.host}" if target.user else target.host
    return ["ssh", *options(key, known_hosts), *port, dest, *remote]


def on_host(target: Target, key: str | None, python: str, command: str, *args: str,
            token: str | None = None, package: str | None = None, timeout: float = 60) -> dict:
    """Run ``onhost.py COMMAND ARGS`` on the host with its ``python``; its JSON answer.

    One line naming the host when SSH fails, the host has no such Python, or the script fails.
    """
    script = host_script()
    if token is not None:
        script = f"TOKEN = {token!r}\n{script}"
    if package is not None:     # base64 text: the head's watchdog (``guard``)
        script = f"PACKAGE = {package!r}\n{script}"
    quoted = " ".join(quote(a) for a in (python, "-", command, *args))
    return answer(target, command, _ssh(target, key, quoted, script, timeout))


def answer(target: Target, command: str, done: subprocess.CompletedProcess) -> dict:
    """A host script's JSON answer (its last line), or one line naming the host."""
    try:   # a script that answers ``ok: false`` exits 1: its answer says why
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        if done.returncode != 0:
            raise GpugeekError(f"{target}: {command} failed on the host ({_last(done.stderr)}) — check Python 3.10 or "
                               "newer there, then try again") from None
        raise GpugeekError(f"{target}: unexpected answer to {command}: {_last(done.stdout)} — check that its login "
                           "prints nothing else") from None


def on_hosts(items: list, call, *args, **kwargs) -> list:
    """``call(item, …)`` for every host (a target, or its index) at once; results in order."""
    with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        return list(pool.map(lambda item: call(item, *args, **kwargs), items))


def run(target: Target, key: str | None, remote: str, stdin: str | bytes | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """``remote`` (a shell command line) run on the host; one line naming the host when SSH itself
    fails or hangs. ``stdin`` as bytes gives bytes back."""
    return _ssh(target, key, remote, stdin, timeout)


def _ssh(target: Target, key: str | None, remote: str, stdin: str | bytes | None, timeout: float):
    try:
        done = subprocess.run(argv(target, key, remote), input=stdin, capture_output=True,
                              text=not isinstance(stdin, bytes), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GpugeekError(f"{target}: no answer over SSH within {timeout:.0f} s — check that the host is up and `ssh "
                           f"{target}` works") from None
    if done.returncode == 255:
        stderr = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
        raise GpugeekError(f"{target}: SSH failed — {_why(target, stderr)}")
    return done


def _why(target: Target, stderr: str) -> str:
    """What SSH said, and what to do about it."""
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr or "Host key verification failed" in stderr:
        known = next((line.split("Add correct host key in ")[1].split(" to get rid")[0]
                      for line in stderr.splitlines() if "Add correct host key in " in line),
                     str(home() / "known_hosts"))
        port = f"[{target.host}]:{target.port}" if target.port else target.host
        return (f"the host's key is not the one {known} holds for {target.host} (a reinstalled machine, or "
                f"another one at that address). If you expect the change, forget the old key with "
                f"`ssh-keygen -R {quote(port)} -f {quote(known)}` and run up again; if not, do not connect")
    return f"{_last(stderr)} (check the host, the user and --ssh-key)"


def quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
