"""Real clouds through Ray's cluster launcher: a ``ray up`` YAML made from the offers.

We write the config (instance types, spot market options, min/max workers, idle timeout, head
node type), have Ray fill its defaults and validate it against its own schema, and run
``ray up -y`` / ``ray down -y`` only when the user says ``--yes``. Credentials stay where the
providers' standard chains keep them; we only check that some exist and never print them.

Past the provider section a cloud cluster is an ``ssh`` cluster: the YAML's start commands run the
same ``onhost.py start`` on every node (copied there with the token file by ``file_mounts``), so
Ray runs with the cluster's marker, token auth from a 0600 file, the head's watchdog and keeper and
the same ports; this machine reaches the head through the same tunnel (``find_head`` asks Ray's
CLI where the head is and how to log in to it).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..clouds import CLOUDS, Cloud
from ..cluster.remote import Remote
from ..cluster.spec import ClusterSpec, NodeType
from ..config import home, settings
from ..errors import GpugeekError, LaunchRefused
from ..raynodes import HEAD_ENV, LINK_CONFIG, NODE_ENV, SSH_WAIT_ENV, token_text
from ..remote import headguard, runtime, ssh
from . import launchlog
from .hosts import GCS_PORT, KEEPER_PORT, START_TIMEOUT_S

NODE_IDLE_MINUTES = 5
# On the nodes: the setup command makes the runtime (remote/runtime.py: Ray at this kernel's version,
# in a venv of its own), whose Python (runtime.python_on_host) runs the start commands; `ray up`
# leaves the autoscaler's config at BOOTSTRAP.
GUARD_ORDER = "guard.json"
UV_PACKED = "uv.gz"        # this machine's uv, in the nodes' folder: their runtime made with it
BOOTSTRAP = "~/ray_bootstrap_config.yaml"
SHOWN_MARKER = "<marker, set by up>"


def cluster_config(name: str, spec: ClusterSpec, marker: str | None = None) -> dict:
    """The cluster-launcher config for ``spec`` (before Ray fills its defaults); ``marker`` is
    the cluster's, known once ``up`` has recorded it. The clouds and your own machines
    (``onprem``) differ only in what says which machines there are."""
    head_start, worker_start = start_commands(name, marker or SHOWN_MARKER, spec)
    provider = rented_from(spec)
    machines = _cloud(name, spec, provider) if provider else _onprem(name, spec, marker)
    return {
        "cluster_name": machines.pop("cluster_name"),
        "max_workers": machines.pop("max_workers"),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": NODE_IDLE_MINUTES,
        **machines,
        "file_mounts": {node_dir(name): str(node_files(name))},
        # every list of commands said, none left to Ray's provider defaults (AWS's pip-installs boto3
        # into the image's Python: the runtime has it)
        "initialization_commands": [],
        "setup_commands": [setup_command(name, spec)],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [head_start],
        "worker_start_ray_commands": [worker_start],
    }


def rented_from(spec: ClusterSpec | None) -> Cloud | None:
    """The cloud whose machines ``spec`` rents; None: your own machines (Ray's on-premise provider)."""
    return CLOUDS.get(spec.backend) if spec is not None else None


def _cloud(name: str, spec: ClusterSpec, provider: Cloud) -> dict:
    """A cloud's machines: instance types from the offers, the head a small CPU machine."""
    workers = {t.name: _worker(provider, t, spec.storage) for t in spec.node_types}
    head_config = provider.head_config(provider.node_config(provider.head_instance, None, spot=False),
                                       spec.node_types[0].region)
    return {"cluster_name": name, "max_workers": sum(t.max_workers for t in spec.node_types),
            "provider": {**provider.provider_section(spec.node_types[0], name),
                         **({"use_internal_ips": True} if spec.internal_ips else {})},
            "auth": provider.auth(),
            "available_node_types": {"head": {"node_config": head_config, "resources": {}}, **workers},
            "head_node_type": "head"}


def _onprem(name: str, spec: ClusterSpec, marker: str | None) -> dict:
    """Your own machines through Ray's on-premise provider: the head on the first host, every
    other host a worker that Ray's autoscaler on the head starts (all of them, always). Ray keeps
    this cluster's state under its name on each machine, so each ``up`` gets a name of its own."""
    remote = spec.remote
    targets = ssh.parse_hosts(remote.hosts)
    ips = list(remote.ips or [t.host for t in targets])
    auth = {"ssh_user": targets[0].user or "root"}
    if remote.ssh_key:
        auth["ssh_private_key"] = remote.ssh_key
    tag = _tag(marker) if marker else "<tag>"
    return {"cluster_name": f"{name}-{tag}", "max_workers": len(ips) - 1,
            "provider": {"type": "local", "head_ip": ips[0], "worker_ips": ips[1:]}, "auth": auth}


def start_commands(name: str, marker: str, spec: ClusterSpec | None = None) -> tuple[str, str]:
    """The head's and every worker's start command: ``onhost.py start``, as on an ssh cluster's
    hosts. A worker's head address, node type and resources are what Ray's launcher exports to it
    (``RAY_HEAD_IP``, ``RAY_NODE_TYPE_NAME``, ``RAY_OVERRIDE_RESOURCES``); its temp dir is named
    by its address. The head's autoscaler gets the config `ray up` left there. A cloud's head is a
    CPU machine; your own machines' head trains too, with the GPUs and CPUs you gave per host."""
    order = {"marker": marker, "temp_dir": temp_dir(name), "token_path": f"{node_dir(name)}/auth_token",
             "port": GCS_PORT, "keeper_port": KEEPER_PORT, "timeout": START_TIMEOUT_S, "restart": True}
    python = runtime.python_on_host()     # the runtime the setup command makes
    if spec is not None and rented_from(spec) is None:
        # the node type is the one Ray's provider names (RAY_NODE_TYPE_NAME): its autoscaler knows no other
        order.update(gpus=spec.remote.gpus_per_host, cpus=spec.remote.cpus_per_host)
        head = {"role": "head", **order, "dashboard": spec.dashboard}
        python = spec.remote.python or python       # --python: an environment of yours, checked by setup
    else:
        head = {"role": "head", **order, "node_type": "head", "gpus": 0, "dashboard": True}
    # every head of ours: its checks, the keepalive; its autoscaler gives up a silent machine as `up` does
    head.update(env={**HEAD_ENV, **ssh_wait()}, system_config=LINK_CONFIG)
    run = f"ulimit -n 65536; {python} {node_dir(name)}/onhost.py start"
    # then the head's watchdog (guard/headwatch.py), on the package and order file_mounts copied
    guard = f"{python} {node_dir(name)}/onhost.py guard @{node_dir(name)}/{GUARD_ORDER}"
    return (f"{run} {shlex.quote(json.dumps(head))} ray start --autoscaling-config={BOOTSTRAP} && {guard}",
            f"{run} {shlex.quote(json.dumps({'role': 'worker', **order, 'env': NODE_ENV}))}")


def ssh_wait() -> dict[str, str]:
    """The environment that bounds Ray's wait for a new machine's SSH (``[cluster] ssh_wait_s``)."""
    return {SSH_WAIT_ENV: str(int(settings().ssh_wait_s))}


def temp_dir(name: str) -> str:
    """Ray's temp dir on every node, ``{ip}`` being the node's address."""
    return f"/tmp/gg-{_tag(name)}-{{ip}}"


def setup_command(name: str, spec: ClusterSpec | None = None) -> str:
    """Run on every node before its start command: the runtime made there (or found made), by the
    image's ``python3``, from ``[hosts] pip_index_url`` in config.toml or PyPI (your own machines:
    ``--pip-index-url``; a cloud's nodes: its SDK too), with what the jobs' storage needs."""
    provider = rented_from(spec)
    own = spec is not None and provider is None
    # a cloud's head runs Ray's autoscaler, which launches the workers through the cloud's SDK
    sdk = tuple(provider.sdk[1].split()) if provider is not None else ()
    storage = spec.remote.extra if spec is not None else ()
    order = runtime.order_for(spec.remote if own else Remote(pip_index_url=settings().pip_index_url,
                                                             extra=(*sdk, *storage)))
    if (uv := runtime.uv_for_nodes()) is not None:   # shipped in the folder (write_node_files)
        order["uv_packed"] = {"path": f"{node_dir(name)}/{UV_PACKED}", **uv}
    return f"python3 {node_dir(name)}/runtime.py install {shlex.quote(json.dumps(order))}"


def guard_order(record, spec: ClusterSpec) -> dict:
    """The head watchdog's order for a cloud head (its address filled in there), and for the keeper
    it starts (on the usual port: the head is a machine of this cluster's own), with the mirror
    the hosts install from (a rented one: ``[hosts] pip_index_url`` in config.toml)."""
    provider = rented_from(spec)
    index_url = spec.remote.pip_index_url or (settings().pip_index_url if provider is not None else None)
    return headguard.order(record, spec, settings().meter_interval_s, ip="{head_ip}", gcs_port=GCS_PORT,
                           temp_dirs={"*": temp_dir(record.name)}, token_path=f"{node_dir(record.name)}/auth_token",
                           cloud=provider.name if provider else None,
                           keeper_port=spec.remote.keeper_port or KEEPER_PORT, index_url=index_url)


def node_ip_command(name: str) -> str:
    """Run on the head, says the address its Ray listens on."""
    return f"{runtime.python_on_host()} {node_dir(name)}/onhost.py node-ip"


def node_dir(name: str) -> str:
    """The cluster's folder on every node: ``onhost.py`` and the token (kept 0600 by ``onhost``)."""
    return f"~/.gpugeek/clusters/{_tag(name)}"


def node_files(name: str) -> Path:
    """This machine's copy of that folder, which ``file_mounts`` ships to the nodes."""
    return home() / "launch" / f"{name}-node"


def write_node_files(name: str, guard: dict | None = None) -> Path:
    """``onhost.py`` and the token, in a 0700 folder, the token 0600 (rsync keeps the modes); with
    ``guard``, the head watchdog's order and the package it runs (``headguard``)."""
    folder = node_files(name)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    (folder / "onhost.py").write_text(ssh.host_script())
    shutil.copyfile(runtime.SCRIPT, folder / "runtime.py")
    if runtime.uv_for_nodes() is not None:
        (folder / UV_PACKED).write_bytes(runtime.packed_uv())
    if guard is not None:
        (folder / GUARD_ORDER).write_text(json.dumps(guard))
        headguard.copy_package(folder / "package")
    fd = os.open(folder / "auth_token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token_text())
    os.chmod(folder / "auth_token", 0o600)
    return folder


def _tag(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:8]


def _worker(provider: Cloud, t: NodeType, storage: str | None) -> dict:
    return {
        "min_workers": t.min_workers,
        "max_workers": t.max_workers,
        "node_config": provider.worker_config(provider.node_config(t.instance_type, t, spot=t.pricing == "spot"),
                                              storage),
        "resources": {"GPU": t.gpu_count, f"accelerator_type:{t.gpu}": 1},
    }


def validate(config: dict) -> dict:
    """Ray fills its provider defaults and checks the result against its own JSON schema."""
    from ..raynodes import launcher_config

    try:
        return launcher_config(config)
    except Exception as exc:  # noqa: BLE001 - jsonschema.ValidationError, ValueError, …: Ray's words, one line
        message = getattr(exc, "message", None) or str(exc).splitlines()[0]
        raise GpugeekError(f"Ray rejects the generated {config['provider']['type']} config: {message}") from None


def write(name: str, config: dict) -> Path:
    folder = home() / "launch"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{name}-{config['provider']['type']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- the head, once `ray up` has made it -------------------------------------------------------------

@dataclass(frozen=True)
class Head:
    """How this machine reaches a launched head: SSH to its public address (as Ray's launcher
    logs in), Ray on its private one."""

    public_ip: str
    private_ip: str
    ssh_user: str
    ssh_key: str | None


def find_head(name: str, path: Path, log: Path) -> Head:
    """Ask Ray's CLI: ``ray get-head-ip`` for the public address, ``ray exec`` of ``onhost.py
    node-ip`` for the one Ray listens on, and the login Ray bootstrapped for the config."""
    public = head_ip(ray_cli("get-head-ip", str(path), log=log))
    private = head_ip(str(answer(ray_cli("exec", str(path), node_ip_command(name), log=log)).get("ip", "")))
    user, key = ssh_login(path, log)
    return Head(public, private, user, key)


# `ray up` caches the bootstrapped config (with the key it made or found) under the config's hash
LOGIN = ("import json, sys, yaml\n"
         "from ray.autoscaler.sdk import bootstrap_config\n"
         "auth = bootstrap_config(yaml.safe_load(open(sys.argv[1])))['auth']\n"
         "print(json.dumps({'user': auth['ssh_user'], 'key': auth.get('ssh_private_key')}))\n")


def ssh_login(path: Path, log: Path) -> tuple[str, str | None]:
    """The SSH user and private key Ray's launcher logs in to the nodes with."""
    found = answer(_run([sys.executable, "-c", LOGIN, str(path)], ["bootstrap_config"], log))
    return found["user"], found.get("key")


def head_ip(text: str) -> str:
    """The address on the last line of a Ray CLI's output, or one line saying there was none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        return str(ipaddress.ip_address(lines[-1]))
    except (ValueError, IndexError):
        said = lines[-1] if lines else "nothing"
        raise GpugeekError(f"Ray's launcher gave no head address (it said: {said!r})") from None


def answer(text: str) -> dict:
    """The last JSON object line of a command's output (``ray exec`` prints its own lines too)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise GpugeekError(f"no answer from the head (its output ended: {text.strip()[-200:]!r})")


RAY = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]  # this env's `ray` CLI


def ray_cli(*args: str, log: Path, timeout: float | None = None, env: dict | None = None) -> str:
    """Run the ``ray`` CLI of this environment; its output goes to ``log``; one line if it fails."""
    return _run([*RAY, *args], args, log, timeout, env)


def _run(cmd: list[str], args, log: Path, timeout: float | None = None, env: dict | None = None) -> str:
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(log, "ab") as out:
        began = out.tell()
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, timeout=timeout,
                              env={**os.environ, **env} if env else None)
        out.write(done.stdout)
    if done.returncode != 0:
        failed = f"`ray {' '.join(args[:2])}` failed (exit {done.returncode}) — see {log}"
        with open(log, "rb") as f:
            f.seek(began)
            text = f.read().decode(errors="replace")
            refused = refusal(text)
        if refused is not None:
            code, said = refused
            raise LaunchRefused(f"{failed}: {code}", code, said)
        if SILENT in text:
            raise GpugeekError(f"`ray {' '.join(args[:1])}` gave up: a new machine answered no SSH in "
                               f"{(env or {}).get(SSH_WAIT_ENV, '?')} s ([cluster] ssh_wait_s in config.toml) — its "
                               "firewall or security group may not let this machine in on port 22 (with "
                               "--internal-ips: is this machine inside its network?), or its image runs no sshd "
                               f"(Ray's log: {log})")
        # neither: the launcher's own reason, in its words (launchlog), and what to do where known
        failed = launchlog.failure(f"`ray {' '.join(args[:2])}`", text, log, done.returncode)
        raise GpugeekError(failed)
    return done.stdout.decode(errors="replace")


# what Ray's updater says when a new machine's SSH never answered within its wait
SILENT = "wait_ready timeout exceeded"
# how Ray's launcher reports a cloud API's refusal: its own exception, or the SDK's error
REFUSED = (re.compile(r"Node Launch Exception \((?P<code>[\w.]+)\): (?P<said>[^\n\x1b]+)"),
           re.compile(r"An error occurred \((?P<code>[\w.]+)\) when calling the \w+ operation[^:]*: "
                      r"(?P<said>[^\n\x1b]+)"))


# how Ray's autoscaler logs a worker the cloud would not launch (v1: node_launcher.py; v2: its
# node_provider.py), the cloud's code and words as in REFUSED
WORKER_REFUSED = re.compile(r"Failed to launch \d+ nodes?(?:\(s\))? of type (?P<type>[\w.-]+?)[.:] "
                            r"(?:Node Launch Exception )?\((?P<code>[\w.]+)\): (?P<said>[^\n\x1b]+)")


def worker_refusals(text: str) -> list[tuple[str, str, str]]:
    """Each worker launch the cloud refused in the autoscaler's log: (node type, code, words)."""
    return [(m["type"], m["code"], m["said"].strip().rstrip(".") + ".") for m in WORKER_REFUSED.finditer(text)]


def refusal(text: str) -> tuple[str, str] | None:
    """The cloud's last refusal in a Ray CLI's output: its error code and its words."""
    for pattern in REFUSED:
        found = list(pattern.finditer(text))
        if found:
            return found[-1]["code"], found[-1]["said"].strip().rstrip(".") + "."
    return None


def kubectl_available() -> bool:
    return shutil.which("kubectl") is not None
