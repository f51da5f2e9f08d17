"""What runs on each node of a cluster we start Ray on ourselves. On an ``ssh`` cluster it is sent
over SSH as the script itself (``python -`` reads it from stdin); on a cloud, Ray's cluster
launcher copies it onto every node (the YAML's ``file_mounts``) and its start commands call it —
so both start Ray the same way. The nodes need Python and Ray, not this package, and nothing is
left on them but Ray's own temp dir and the cluster's token file.

    facts                     versions, devices, clock and interfaces, as JSON (checked before a start)
    start ORDER [ray start FLAG…]
                              ``ray start`` in a session of its own, marked with the cluster's
                              marker (ORDER: JSON); FLAGs are added to Ray's command line
    node-ip                   the address Ray advertises on this node when ORDER names none
    ps MARKER                 our processes on this host: those in a session MARKER proves ours
    stop MARKER GRACE [DIR]   SIGTERM, then SIGKILL after GRACE seconds, every process of ours;
                              then remove Ray's temp dir DIR, where its mark says it is the cluster's
    guard ORDER               the head's watchdog (``guard/headwatch.py``), marked like Ray: this
                              package comes in the script (``PACKAGE = …``, a base64 tar.gz) and
                              is unpacked beside the token, or the launcher copied it there
    ledger HOME NAME          the head watchdog's ledger for cluster NAME, as JSON

Ownership is checked here, by process, on the host itself, as on the laptop
(``cluster/processes.py``): a process is ours when it is in a session we began, and a session is
ours when a process in it carries the cluster's marker. Ray's word ("No nodes remaining") is never
taken for it; nor a folder's name: Ray's temp folder is removed where its mark is (``marks.py``).
The token arrives in the script's text (``TOKEN = …`` prepended) over SSH, or in the token file
itself where the cluster launcher copied it; never on a command line. Either way the file is made
0600. The exit status is 1 when the answer says ``ok: false`` (``ray up`` reads it).

Standard library only (any Python a host has), sent as one text after marks.py (``ssh.host_script``).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

MARKER = "GPUGEEK_CLUSTER"    # cluster/processes.py's, which the head's watchdog uses
# ``ray start`` as Ray's CLI runs it; on a head, without Ray's client server, which it otherwise
# starts whenever Ray Client's packages are there (and they always are): kernels reach the cluster
# through its keeper, and nothing of ours listens for a Ray Client. (``ray.scripts.scripts`` asks
# ``get_ray_client_dependency_error`` whether to start it; tests/test_onhost.py holds that.)
RAY_START = "from ray.scripts.scripts import main; main()"
# Ray gives a raylet 30 s to register (fixed): a busy host can miss that, once or twice; only the
# third miss is the error (as a local head's, ``backends/local.py``)
START_TRIES = 3
HEAD_START = ("import ray.scripts.scripts as cli\n"
              "cli.get_ray_client_dependency_error = lambda: 'the cluster is reached through its keeper'\n"
              "cli.main()")
try:    # imported as the package's module; sent or copied as one text, marks.py's lines come first
    from .marks import mark_folder, remove_ours
except ImportError:
    pass
TOKEN = globals().get("TOKEN")      # prepended by the sender for `start`
PACKAGE = globals().get("PACKAGE")  # prepended by the sender for `guard`


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
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {parts[3].split("/")[0]: parts[1] for parts in (line.split() for line in text.splitlines())
            if len(parts) >= 4}


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
    """PIDs of our processes on this host: every process in a session that a process carrying
    ``marker`` is in. ``ray start`` and the head's watchdog each begin a session of their own, and
    everything they start stays in it, whatever its environment (Ray's dashboard and runtime-env
    agents do not keep the marker); the marker proves the session is ours, as a stranger's never
    carries it. This script's own session is never one of them, nor session 0 (kernel threads, and
    in a container the session of its init, whose leader lives outside: the host's sshd there)."""
    needle = f"{MARKER}={marker}".encode()
    me = os.getsid(0)
    states = {int(entry): _state(entry) for entry in os.listdir("/proc")
              if entry.isdigit() and int(entry) != os.getpid()}
    sessions = set()
    for pid, state in states.items():
        if state is None or state[1] in (0, me) or state[1] in sessions:
            continue     # session 0: kernel threads, or a leader outside this PID namespace (a container's init)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    sessions.add(state[1])
        except OSError:
            continue
    return sorted(pid for pid, state in states.items() if state is not None and state[1] in sessions)


def _state(pid):
    """A process's state letter and session id, from ``/proc/PID/stat``; None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[3])


def start(args):
    """``ray start`` for the head or a worker; prints our PIDs on this host once it has started."""
    spec, extra = json.loads(args[0]), args[1:]
    ray = ray_command(spec, extra[2:] if extra[:2] == ["ray", "start"] else extra)
    if not ray.get("ok"):
        return ray
    marker, cmd, env, log, ip = spec["marker"], ray["cmd"], ray["env"], ray["log"], ray["ip"]
    for attempt in range(1, START_TRIES + 1):
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            code = proc.wait(timeout=spec.get("timeout", 120))
        if code == 0:
            break
        stop([marker, "1"])
        with open(log, "rb") as f:
            tail = f.read().decode(errors="replace").strip().splitlines()[-3:]
        if attempt == START_TRIES or "timed out during startup" not in " ".join(tail):
            return {"ok": False, "error": "; ".join(tail) or f"exit {code}"}
    return {"ok": True, "ip": ip, "pids": ours(marker), "port": spec["port"], "keeper_port": spec.get("keeper_port")}


def ray_command(spec, extra=()):
    """The ``ray start`` command line, environment and log for ORDER (``spec``, its ports moved
    where they are held), or an answer that says why there is none.

    What ORDER leaves out comes from the node: its address (``node_ip``), the head's (Ray's
    launcher exports ``RAY_HEAD_IP`` to a worker's start commands), its node type and resources
    (``RAY_NODE_TYPE_NAME``, ``RAY_OVERRIDE_RESOURCES``, also exported by the launcher)."""
    marker = spec["marker"]
    head = spec.get("head") or f"{os.environ.get('RAY_HEAD_IP', '')}:{spec['port']}"
    if spec["role"] != "head" and head.startswith(":"):
        return {"ok": False, "error": "no head address: none in the order and RAY_HEAD_IP is not set"}
    ip = spec.get("ip") or node_ip(None if spec["role"] == "head" else head.rpartition(":")[0])
    temp_dir = spec["temp_dir"].replace("{ip}", ip)
    token_path = os.path.expanduser(spec["token_path"])
    if not _token_at(token_path):
        return {"ok": False, "error": f"no token: none sent and none at {spec['token_path']}"}
    if (refused := mark_folder(temp_dir, marker, os.environ.get("SLURM_JOB_ID"))) is not None:
        return refused        # a folder of that name that is someone else's
    if spec.get("restart"):       # `ray up` on a running head starts it again: ours go first
        stop([marker, "5"])
    cmd = [sys.executable, "-c", HEAD_START if spec["role"] == "head" else RAY_START, "start",
           f"--node-ip-address={ip}", f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    if spec.get("gpus") is not None:
        cmd.append(f"--num-gpus={int(spec['gpus'])}")
    if spec.get("cpus") is not None:
        cmd.append(f"--num-cpus={int(spec['cpus'])}")
    if spec["role"] == "head" and spec.get("free_ports"):   # another Ray (or ours) may hold the usual ones
        _move_off_held_ports(spec, ip)
    if spec["role"] == "head":
        cmd += ["--head", f"--port={spec['port']}",
                f"--include-dashboard={'true' if spec.get('dashboard') else 'false'}"]
        if not any(flag.startswith("--autoscaling-config") for flag in extra):
            cmd.append("--no-monitor")    # no autoscaler: the nodes are the hosts we start
        if spec.get("system_config"):     # raynodes.LINK_CONFIG: the GCS gives it to every process of the cluster
            cmd.append(f"--system-config={json.dumps(spec['system_config'])}")
    else:
        cmd += [f"--address={head}"]
    cmd += extra
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path, RAY_USAGE_STATS_ENABLED="0",
               **spec.get("env", {}))    # raynodes.NODE_ENV, and a head's GCS settings (HEAD_ENV)
    if spec.get("node_type"):
        env["RAY_NODE_TYPE_NAME"] = spec["node_type"]
    env[MARKER] = marker
    env.pop("RAY_AUTH_TOKEN", None)
    env.update(_closed_metric_ports(spec["port"]) if spec["role"] == "head" else {})
    return {"ok": True, "cmd": cmd, "env": env, "ip": ip,
            "log": os.path.join(os.path.dirname(token_path), f"ray-start-{ip}.log")}


def _closed_metric_ports(gcs_port):
    """The dashboard's and the autoscaler's Prometheus servers bind every interface, with no token
    and no setting for the address: pointed at the GCS port (bound on every interface before they
    start) they cannot open, which Ray logs and goes on without."""
    return {"DASHBOARD_METRIC_PORT": str(gcs_port), "AUTOSCALER_METRIC_PORT": str(gcs_port)}


def _token_at(path):
    """The cluster's token at ``path``, 0600 in a 0700 folder: the one sent with this script, or
    the one the cluster launcher copied there. False when there is neither."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    if TOKEN is not None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(TOKEN)
    elif not (os.path.exists(path) and os.path.getsize(path)):
        return False
    os.chmod(path, 0o600)   # an existing file keeps its mode on open: set it
    return True


def node_ip(peer=None):
    """The address this node reaches ``peer`` from (the head, for a worker), else the one its
    default route leaves from — as Ray itself picks it. A UDP socket's connect sends nothing."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((peer or "8.8.8.8", 80))
            return sock.getsockname()[0]
    except OSError:
        outside = [a for a in _interfaces() if not a.startswith("127.")]
        return outside[0] if len(outside) == 1 else "127.0.0.1"


def _free(ip, port):
    """Whether ``port`` is free on ``ip`` here."""
    with socket.socket() as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
        return True


def _move_off_held_ports(spec, ip):
    """The head's GCS port (on its address) and the keeper's (on its loopback, or where the order
    says it listens), each moved to a free one where it is held — never onto the other's (the
    system may hand back the port it just let go)."""
    while not _free(ip, spec["port"]):
        spec["port"] = _any_free_port(ip)
    if spec.get("keeper_port"):
        where = spec.get("keeper_host") or "127.0.0.1"
        while not _free(where, spec["keeper_port"]) or spec["keeper_port"] == spec["port"]:
            spec["keeper_port"] = _any_free_port(where)


def _any_free_port(ip):
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def stop(args):
    """SIGTERM every process of ours, SIGKILL what is left after GRACE seconds. The list is made
    anew each round: a process forked while we stop (a worker the raylet was starting) carries the
    marker too, and is caught by the next round instead of outliving the cluster."""
    marker, grace = args[0], float(args[1]) if len(args) > 1 else 5.0
    termed = set()
    pids = []
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        deadline = time.time() + wait
        while True:
            pids = [pid for pid in ours(marker) if _running(pid)]
            for pid in pids:
                if sig == signal.SIGTERM and pid in termed:
                    continue      # once is the ask; its grace runs on
                termed.add(pid)
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            if not pids or time.time() > deadline:
                break
            time.sleep(0.1)
        if not pids:
            break
    if not pids and len(args) > 2:
        remove_ours(args[2], marker)
    return {"ok": not pids, "left": pids}


def guard(args):
    """Start the head's watchdog with this host's Python (which has Ray) on the package sent along,
    in a session of its own carrying the marker (so ``stop`` ends it with Ray); its pid."""
    import base64
    import io
    import tarfile

    if args[0].startswith("@"):       # a file the launcher copied (a cloud head)
        with open(os.path.expanduser(args[0][1:])) as f:
            order = json.load(f)
    else:
        order = json.loads(args[0])
    if "{head_ip}" in order["gcs"]:    # a cloud head knows its address only once it runs
        order = json.loads(json.dumps(order).replace("{head_ip}", node_ip()))
    home = os.path.expanduser(order["home"])
    folder = os.path.dirname(home)
    os.makedirs(home, mode=0o700, exist_ok=True)
    package = os.path.join(folder, "package")
    if PACKAGE is not None:
        shutil.rmtree(package, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(PACKAGE)), mode="r:gz") as tar:
            # our own archive; the "data" filter where this Python has it (3.8.17+, 3.12)
            tar.extractall(package, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    elif not os.path.isdir(os.path.join(package, "gpugeek_jupyter")):
        return {"ok": False, "error": f"no package: none sent and none at {package}"}
    path = os.path.join(home, "order.json")
    with open(path, "w") as f:
        json.dump(order, f)
    env = dict(os.environ, GPUGEEK_HOME=home, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_TOKEN_PATH=os.path.expanduser(order["token_path"]), **{MARKER: order["marker"]},
               PYTHONPATH=os.pathsep.join([package] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("RAY_AUTH_TOKEN", None)
    # Ray first, as in every Ray process: it puts the packages it ships (psutil) on the path
    boot = ("import sys, runpy, ray\nsys.argv[0] = 'headwatch'\n"
            "runpy.run_module('gpugeek_jupyter.guard.headwatch', run_name='__main__')")
    with open(os.path.join(home, "watchdog.log"), "ab") as out:   # a Slurm job's is this script's child
        proc = subprocess.Popen([sys.executable, "-c", boot, path], env=env, stdout=out, stderr=out, cwd=home,
                                stdin=subprocess.DEVNULL, start_new_session=not order.get("scheduled"))
    if order.get("scheduled"):    # in the foreground of the job's step, which sees and ends it
        signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
        return {"ok": proc.wait() == 0}
    time.sleep(1.0)
    if proc.poll() is not None:
        with open(os.path.join(home, "watchdog.log"), "rb") as f:
            tail = f.read().decode(errors="replace").strip().splitlines()[-3:]
        return {"ok": False, "error": "; ".join(tail) or f"exit {proc.returncode}"}
    return {"ok": True, "pid": proc.pid}


def ledger(args):
    """The head watchdog's ledger for one cluster (its newest row of that name): the cluster's
    stop, its nodes and its events."""
    import sqlite3

    db = os.path.join(os.path.expanduser(args[0]), "state.db")
    if not os.path.exists(db):
        return {"ok": False, "error": f"no ledger at {db}"}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM clusters WHERE name=? ORDER BY id DESC LIMIT 1", (args[1],)).fetchone()
        if row is None:
            return {"ok": True, "cluster": None, "nodes": [], "events": []}
        nodes = [dict(r) for r in conn.execute("SELECT * FROM nodes WHERE cluster_id=?", (row["id"],))]
        events = [dict(r) for r in conn.execute("SELECT * FROM events WHERE cluster_id=?", (row["id"],))]
    cluster = {k: row[k] for k in ("stopping", "stopped", "stop_reason", "budget_usd", "idle_minutes",
                                   "idle_since", "idle_why")}
    return {"ok": True, "cluster": cluster, "nodes": nodes, "events": events}


def forget(args):
    """Remove a stopped cluster's folder here (its token, logs and the head watchdog's ledger, by
    then copied to the laptop): only a folder directly in ``~/.gpugeek/clusters``."""
    folder = os.path.realpath(os.path.expanduser(args[0]))
    clusters = os.path.realpath(os.path.expanduser("~/.gpugeek/clusters"))
    if os.path.dirname(folder) != clusters:
        return {"ok": False, "error": f"{args[0]} is not a cluster's folder in ~/.gpugeek/clusters"}
    shutil.rmtree(folder, ignore_errors=True)
    return {"ok": not os.path.exists(folder)}


def _running(pid):
    state = _state(pid)
    return state is not None and state[0] != "Z"


def _private():
    """What this script writes on a host (the token, the ledger, Ray's temp folders, logs) is the
    host user's alone: files 0600, folders 0700 — also a state folder an earlier version made 0755."""
    os.umask(0o077)
    for folder in ("~/.gpugeek", "~/.gpugeek/clusters"):
        path = os.path.expanduser(folder)
        if os.path.isdir(path):
            os.chmod(path, 0o700)


def main(argv):
    command, args = argv[0], argv[1:]
    _private()
    if command == "facts":
        result = facts()
    elif command == "start":
        result = start(args)
    elif command == "node-ip":
        result = {"ip": node_ip(os.environ.get("RAY_HEAD_IP"))}
    elif command == "ps":
        result = {"pids": ours(args[0])}
    elif command == "stop":
        result = stop(args)
    elif command == "guard":
        result = guard(args)
    elif command == "ledger":
        result = ledger(args)
    elif command == "forget":
        result = forget(args)
    else:
        result = {"ok": False, "error": f"unknown command {command!r}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if result.get("ok") is False:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
