"""What runs on each host of an ``ssh`` cluster, sent over SSH as the script itself (``python -``
reads it from stdin): the hosts need Python and Ray, not this package, and nothing is left on them
but Ray's own temp dir and the cluster's token file.

    facts                     versions, devices, clock and interfaces, as JSON (doctor reads these)
    start ROLE ARGS…          ``ray start`` in a session of its own, marked with the cluster's marker
    ps MARKER                 our processes on this host: those whose environment carries MARKER
    stop MARKER GRACE [DIR]   SIGTERM, then SIGKILL after GRACE seconds, every process of ours;
                              then remove Ray's temp dir DIR

Ownership is checked here, by process, on the host itself: a process is ours only if its
environment carries the cluster's marker. Ray's word ("No nodes remaining") is never taken for it.
The token arrives in the script's text (``TOKEN = …`` prepended), never on a command line, and is
written 0600.

Standard library only, and Python 3.8+: it must run on whatever Python a host has.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

MARKER = "GPUGEEK_CLUSTER"
TOKEN = globals().get("TOKEN")      # prepended by the sender for `start`


def facts():
    import platform

    out = {"host": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable,
           "time": time.time(), "cpus": os.cpu_count(), "packages": {}}
    try:
        from importlib import metadata
    except ImportError:
        metadata = None
    for name in ("ray", "torch", "gpugeek-jupyter", "numpy"):
        try:
            out["packages"][name] = metadata.version(name) if metadata else None
        except Exception:  # noqa: BLE001 - not installed (PackageNotFoundError): reported as missing
            out["packages"][name] = None
    out["interfaces"] = _interfaces()
    out["gpus"], out["driver"] = _gpus()
    return out


def _interfaces():
    """IPv4 address → interface name, from ``ip -o -4 addr`` (present on every Linux host)."""
    try:
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                              timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            found[parts[3].split("/")[0]] = parts[1]
    return found


def _gpus():
    if shutil.which("nvidia-smi") is None:
        return [], None
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = [[cell.strip() for cell in line.split(",")] for line in text.strip().splitlines() if line.strip()]
    return [r[0] for r in rows], (rows[0][2] if rows and len(rows[0]) > 2 else None)


def ours(marker):
    """PIDs of the processes on this host whose environment carries ``marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(entry))
    return sorted(found)


def start(args):
    """``ray start`` for the head or a worker; prints our PIDs on this host once it has started."""
    spec = json.loads(args[0])
    marker, temp_dir = spec["marker"], spec["temp_dir"]
    token_path = os.path.expanduser(spec["token_path"])
    os.makedirs(os.path.dirname(token_path), mode=0o700, exist_ok=True)
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(TOKEN or "")
    os.chmod(token_path, 0o600)   # an existing file keeps its mode on open: set it
    cmd = [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start",
           f"--node-ip-address={spec['ip']}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
           f"--num-gpus={int(spec['gpus'])}"]
    if spec.get("cpus") is not None:
        cmd.append(f"--num-cpus={int(spec['cpus'])}")
    if spec["role"] == "head":
        cmd += ["--head", f"--port={spec['port']}", f"--ray-client-server-port={spec['client_port']}",
                "--include-dashboard=false", "--no-monitor"]
    else:
        cmd += [f"--address={spec['head']}"]
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path,
               RAY_USAGE_STATS_ENABLED="0", RAY_NODE_TYPE_NAME=spec["node_type"])
    env[MARKER] = marker
    env.pop("RAY_AUTH_TOKEN", None)
    log = os.path.join(os.path.dirname(token_path), f"ray-start-{spec['ip']}.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        code = proc.wait(timeout=spec.get("timeout", 120))
    if code != 0:
        stop([marker, "1"])
        with open(log, "rb") as f:
            tail = f.read().decode(errors="replace").strip().splitlines()[-3:]
        return {"ok": False, "error": "; ".join(tail) or f"exit {code}"}
    if spec["role"] == "head":     # Ray's client server starts after `ray start` returns
        deadline = time.time() + spec.get("timeout", 120)
        while not _listening(spec["ip"], spec["client_port"]):
            if time.time() > deadline:
                return {"ok": False, "error": f"Ray's client server did not listen on port {spec['client_port']}"}
            time.sleep(0.1)
    return {"ok": True, "pids": ours(marker)}


def _listening(ip, port):
    try:
        socket.create_connection((ip, port), timeout=1).close()
        return True
    except OSError:
        return False


def stop(args):
    marker, grace = args[0], float(args[1]) if len(args) > 1 else 5.0
    pids = ours(marker)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + wait
        while time.time() < deadline:
            pids = [pid for pid in pids if _running(pid)]
            if not pids:
                break
            time.sleep(0.1)
        if not pids:
            break
    if not pids and len(args) > 2 and os.path.basename(args[2]).startswith("gg-"):
        shutil.rmtree(args[2], ignore_errors=True)
    return {"ok": not pids, "left": pids}


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv):
    command, args = argv[0], argv[1:]
    if command == "facts":
        result = facts()
    elif command == "start":
        result = start(args)
    elif command == "ps":
        result = {"pids": ours(args[0])}
    elif command == "stop":
        result = stop(args)
    else:
        result = {"ok": False, "error": f"unknown command {command!r}"}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
