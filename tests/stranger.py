"""A stranger on the hosts' network: a machine beside the cluster's hosts that is not in the
cluster and has no token, trying every port a host listens on.

    python tests/stranger.py ADDRESS PORT [PORT …] --touch PATH [--token FILE] [--patience S] [--only HOW]

For each port: a TCP connect, an HTTP GET of ``/`` and ``/metrics``, a Ray driver join
(``ray.init(address=ADDRESS:PORT)``) and a Ray Client connect (``ray://ADDRESS:PORT``). A join
that works runs a task that creates PATH on whichever node runs it; a driver off the cluster's
nodes cannot run one, so a GCS that answers it at all counts too. Prints one JSON object:
{port: {"tcp": bool, "http": status or error, "driver": what happened, "client": what happened}}.
Every attempt is bounded in time; the Ray ones run in processes of their own (forks of this one,
which loads Ray once), killed at the end.
``--token FILE`` is the control: the same joins holding the cluster's token, which must work.
A port whose server answered the GET as HTTP/1 or as SSH gets no Ray tries: Ray's drivers and
clients speak gRPC (HTTP/2), which such a server cannot be. ``--patience S`` bounds each try
(default ``JOIN_TIMEOUT_S``); ``--only driver`` (or ``client``) makes only that kind of Ray try.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

JOIN_TIMEOUT_S = 45
PARALLEL = 6           # tries at once: each a process of its own that mostly waits on its bounds
RAN = "STRANGER-RAN"
# a driver off the cluster's nodes gets this far only once the GCS has answered it (the session's
# raylet socket is the next thing it looks for, on its own machine): the GCS gave out its session
GCS_ANSWERED = "sockets/raylet"

JOIN = f"""
import socket, sys, ray
target = sys.argv[1]
if target.startswith("ray://"):       # a Ray Client: two tries at connecting (5 s, then 10 s)
    ray.util.connect(target[len("ray://"):], connection_retries=2, ray_init_kwargs={{"logging_level": "ERROR"}})
else:                                 # a Ray driver
    ray.init(address=target, log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=0)       # runs even where a worker group holds every CPU
def touch(path):
    open(path, "w").write("a stranger was here")
    return socket.gethostname()

print("{RAN}", ray.get(touch.remote(sys.argv[2]), timeout=20), flush=True)
"""


def tcp(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3):
            return True
    except OSError:
        return False


def http(address: str, port: int) -> dict:
    """Each path's HTTP status, or why there was none."""
    out = {}
    for path in ("/", "/metrics"):
        try:
            with urllib.request.urlopen(f"http://{address}:{port}{path}", timeout=5) as answer:
                out[path] = answer.status
        except urllib.error.HTTPError as exc:
            out[path] = exc.code
        except Exception as exc:  # noqa: BLE001 - not HTTP at all: what happened, in words
            said = str(exc)
            out[path] = ("no HTTP/1 (an HTTP/2 server: gRPC)" if said.startswith("\x00\x00") else
                         f"no HTTP ({said.strip()[:40]})" if type(exc).__name__ == "BadStatusLine" else
                         f"{type(exc).__name__}: {said[:60]}")
    return out


def stranger_env(token: str | None) -> None:
    """This process's environment becomes a stranger's: no token anywhere it could find one (but
    ``token``, for the control). Set before Ray loads: each try is a fork of this process."""
    for key in [k for k in os.environ if k.startswith("RAY_")]:
        del os.environ[key]
    os.environ["HOME"] = "/nonexistent"       # no ~/.ray/auth_token
    os.environ["RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL"] = "minor"    # the hosts' 3.11.x need not be this one's
    os.environ.update(RAY_gcs_server_request_timeout_seconds="5")      # a port that is no GCS: given up sooner
    if token:
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)


def start_join(target: str, touch: str) -> tuple[int, int]:
    """A Ray driver (``ADDRESS:PORT``) or Ray Client (``ray://…``) join, in a forked process of its
    own (its own session, its output into a pipe): (pid, the pipe's read end). Ray is loaded once,
    here, before the fork: a process that loaded it anew for each try spent seconds of CPU each."""
    read, write = os.pipe()
    sys.stdout.flush()                                # nothing of ours is printed twice
    pid = os.fork()
    if pid == 0:                                      # the try
        try:
            os.setsid()
            os.close(read)
            os.dup2(write, 1)
            os.dup2(write, 2)
            sys.argv = ["-c", target, touch]
            exec(compile(JOIN, "<join>", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - what a refused join says is its traceback's last line
            import traceback

            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    os.close(write)
    return pid, read


def said_by(out: str, code: int | None, patience: float) -> str:
    """What one try printed last, in words: "ran on HOST", "answered …" or "refused …"."""
    if code is None:
        return f"no answer within {patience:g} s"
    for line in out.splitlines():
        if line.startswith(RAN):
            return f"ran on {line.split()[1]}"
    if GCS_ANSWERED in out:
        return "answered: the GCS gave out its session"
    lines = [line for line in out.splitlines() if line.strip()]
    return f"refused (exit {code}): {lines[-1][:160] if lines else ''}"


def joins(targets: list[str], touch: str, patience: float) -> list[str]:
    """Each target's join, ``PARALLEL`` at a time, each bounded by ``patience`` s; every try's
    process group is killed when it ends (anything it started goes with it)."""
    import selectors

    import ray  # noqa: F401 - loaded once, before the forks

    said: list[str] = [""] * len(targets)
    waiting = list(enumerate(targets))
    running: dict[int, tuple[int, int, float, bytearray]] = {}       # read fd -> (index, pid, deadline, out)
    with selectors.DefaultSelector() as sel:
        while waiting or running:
            while waiting and len(running) < PARALLEL:
                index, target = waiting.pop(0)
                pid, fd = start_join(target, touch)
                running[fd] = (index, pid, time.monotonic() + patience, bytearray())
                sel.register(fd, selectors.EVENT_READ)
            soonest = min(deadline for _, _, deadline, _ in running.values())
            for key, _ in sel.select(timeout=max(0.0, soonest - time.monotonic())):
                chunk = os.read(key.fd, 65536)
                running[key.fd][3].extend(chunk)
                if not chunk:                                          # the try closed its output: it ended
                    finish(sel, running, key.fd, said, patience, timed_out=False)
            for fd in [fd for fd, (_, _, deadline, _) in running.items() if time.monotonic() >= deadline]:
                finish(sel, running, fd, said, patience, timed_out=True)
    return said


def finish(sel, running: dict, fd: int, said: list[str], patience: float, timed_out: bool) -> None:
    index, pid, _, out = running.pop(fd)
    sel.unregister(fd)
    os.close(fd)
    try:
        os.killpg(pid, signal.SIGKILL)       # anything it started
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    code = None if timed_out else os.waitstatus_to_exitcode(status)
    said[index] = said_by(out.decode(errors="replace"), code, patience)


def speaks_grpc_or_unknown(http_result: dict) -> bool:
    """False where the GET was answered as HTTP/1 (a status) or as SSH: no Ray behind it."""
    said = http_result["/"]
    return not isinstance(said, int) and "SSH-" not in str(said)


def main(argv: list[str]) -> None:
    touch = argv[argv.index("--touch") + 1]
    token = argv[argv.index("--token") + 1] if "--token" in argv else None
    patience = float(argv[argv.index("--patience") + 1]) if "--patience" in argv else JOIN_TIMEOUT_S
    hows = (argv[argv.index("--only") + 1],) if "--only" in argv else ("driver", "client")
    address, ports = argv[0], [int(p) for p in argv[1:argv.index("--touch")]]

    with ThreadPoolExecutor(max_workers=len(ports) or 1) as pool:     # each port's GETs wait on their own
        found = dict(zip(ports, pool.map(lambda port: {"tcp": tcp(address, port), "http": http(address, port)},
                                         ports), strict=True))
    tries = [(port, how) for port in ports for how in hows if speaks_grpc_or_unknown(found[port]["http"])]
    # a port whose GET got no answer at all is the one whose tries wait out their whole bound: first
    tries.sort(key=lambda t: "Timeout" not in str(found[t[0]]["http"]))
    for port in ports:
        found[port].update({how: "not tried: not gRPC" if how in hows else f"not tried: --only {hows[0]}"
                            for how in ("driver", "client")})
    stranger_env(token)
    joined = joins([f"{'ray://' if how == 'client' else ''}{address}:{port}" for port, how in tries], touch, patience)
    for (port, how), said in zip(tries, joined, strict=True):
        found[port][how] = said
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
