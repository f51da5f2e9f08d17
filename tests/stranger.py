"""A stranger on the hosts' network: a machine beside the cluster's hosts that is not in the
cluster and has no token, trying every port a host listens on.

    python tests/stranger.py ADDRESS PORT [PORT …] --touch PATH [--token FILE] [--patience S]

For each port: a TCP connect, an HTTP GET of ``/`` and ``/metrics``, a Ray driver join
(``ray.init(address=ADDRESS:PORT)``) and a Ray Client connect (``ray://ADDRESS:PORT``). A join
that works runs a task that creates PATH on whichever node runs it; a driver off the cluster's
nodes cannot run one, so a GCS that answers it at all counts too. Prints one JSON object:
{port: {"tcp": bool, "http": status or error, "driver": what happened, "client": what happened}}.
Every attempt is bounded in time; the Ray ones run in processes of their own, killed at the end.
``--token FILE`` is the control: the same joins holding the cluster's token, which must work.
A port whose server answered the GET as HTTP/1 or as SSH gets no Ray tries: Ray's drivers and
clients speak gRPC (HTTP/2), which such a server cannot be. ``--patience S`` bounds each try
(default ``JOIN_TIMEOUT_S``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

JOIN_TIMEOUT_S = 45
PARALLEL = 6           # tries at once: each a Python process that loads Ray, then mostly waits on its bounds
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


def join(target: str, touch: str, token: str | None = None, patience: float = JOIN_TIMEOUT_S) -> str:
    """A Ray driver (``ADDRESS:PORT``) or Ray Client (``ray://…``) join, in a process of its own
    with no token anywhere it could find one (but ``token``, for the control): what it printed
    last, or "ran on HOST"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = "/nonexistent"       # no ~/.ray/auth_token
    env["RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL"] = "minor"    # the hosts' 3.11.x need not be this one's
    env["RAY_gcs_server_request_timeout_seconds"] = "5"       # a port that is no GCS: given up sooner
    if token:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token)
    proc = subprocess.Popen([sys.executable, "-c", JOIN, target, touch], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=patience)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"no answer within {patience:g} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # anything it started
        except ProcessLookupError:
            pass
    for line in out.splitlines():
        if line.startswith(RAN):
            return f"ran on {line.split()[1]}"
    if GCS_ANSWERED in out:
        return "answered: the GCS gave out its session"
    lines = [line for line in out.splitlines() if line.strip()]
    return f"refused (exit {proc.returncode}): {lines[-1][:160] if lines else ''}"


def speaks_grpc_or_unknown(http_result: dict) -> bool:
    """False where the GET was answered as HTTP/1 (a status) or as SSH: no Ray behind it."""
    said = http_result["/"]
    return not isinstance(said, int) and "SSH-" not in str(said)


def main(argv: list[str]) -> None:
    touch = argv[argv.index("--touch") + 1]
    token = argv[argv.index("--token") + 1] if "--token" in argv else None
    patience = float(argv[argv.index("--patience") + 1]) if "--patience" in argv else JOIN_TIMEOUT_S
    address, ports = argv[0], [int(p) for p in argv[1:argv.index("--touch")]]

    with ThreadPoolExecutor(max_workers=len(ports) or 1) as pool:     # each port's GETs wait on their own
        found = dict(zip(ports, pool.map(lambda port: {"tcp": tcp(address, port), "http": http(address, port)},
                                         ports), strict=True))
    tries = [(port, how) for port in ports for how in ("driver", "client")
             if speaks_grpc_or_unknown(found[port]["http"])]
    for port in ports:
        found[port].update(driver="not tried: not gRPC", client="not tried: not gRPC")
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        joined = pool.map(lambda t: join(f"{'ray://' if t[1] == 'client' else ''}{address}:{t[0]}", touch, token,
                                         patience), tries)
        for (port, how), said in zip(tries, joined, strict=True):
            found[port][how] = said
    print(json.dumps(found))


if __name__ == "__main__":
    main(sys.argv[1:])
