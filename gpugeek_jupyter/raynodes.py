"""Ray's own node table, read straight from the cluster's GCS.

Ray records when each node joined (``start_time_ms``), when it died (``end_time_ms``), which
autoscaler node type it is and whether it is idle. That is the record we price, so node
lifetimes in the ledger are Ray's, not our guesses. Reading it needs no driver connection and no
dashboard. It goes through Ray's private ``GcsClient``; this module is the one door of this
package into Ray's insides (that client, the KV store from a worker, the driver's printer, the
folder uploads, the launcher's config checks, auto-init), so a Ray upgrade that moves one breaks
exactly this module, and ``tests/test_ray_contract.py`` names what moved. (The same client writes
the sim backend's preemption notices into the cluster's KV store.)
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .errors import GpugeekError

# How the GCS finds a node dead, set on every head we start (Ray's own values, written down so the
# ledger can count back): a check every 3 s, five missed in a row. A host whose processes died is
# called dead ~13 s later; one that went silent (no answer at all) only after each check's 10 s
# timeout too, so a cut of a few seconds between hosts is ridden out.
HEALTH_CHECK_PERIOD_S = 3.0
HEALTH_CHECK_MISSES = 5
# Ray starts every worker process at niceness 15, below its own daemons and anything else on the
# host (a driver stays at 0). The ranks are the work the user pays for: on every node we start,
# workers run at the host's normal priority (``benchmarks/bench_remote.py`` part B measured it).
# Ray's own Prometheus export listens on every interface with no token (anyone on the hosts'
# network reads it); our telemetry and the ledger's /gpugeek/metrics do not need it, so it is off.
# When the first driver connects, a raylet starts one idle worker per CPU for tasks to come; ours
# never take them (a rank needs its own environment; a node's sampler and probe start once), so
# each would boot Ray, idle, and be reaped: CPU and memory a node spends for nothing.
NODE_ENV = {"RAY_worker_niceness": "0", "RAY_enable_metrics_collection": "0",
            "RAY_prestart_worker_first_driver": "0"}
HEAD_ENV = {**NODE_ENV, "RAY_health_check_period_ms": str(int(HEALTH_CHECK_PERIOD_S * 1000)),
            "RAY_health_check_timeout_ms": "10000",
            "RAY_health_check_failure_threshold": str(HEALTH_CHECK_MISSES)}
# A host cut off for a few seconds (a cable, a switch) must come back as it was. The GCS's connection to
# its raylet has data in flight when the link goes; TCP resends it with its timeout doubled each time
# (0.2 s … 13.6 s, 27 s), so once the link is back that connection stays mute until the next resend —
# seen 26 s after a 15 s cut that came right after a 12 s one — and every health check queued behind
# it times out: five in a row and a living host is "dead", its ranks killed. gRPC's keepalive (a ping
# after 5 s with nothing read while a call waits, 20 s for its answer, which gRPC also sets as the
# socket's TCP_USER_TIMEOUT) closes such a connection ~20 s after it went mute (seen: 21 s), and Ray
# dials a fresh one, which works as soon as the link does. Not sooner: once closed, a dial to a host
# still cut off can fail at once ("failed to connect") and so does each check then, 3 s apart; 20 s
# outlasts a cut of 15 s. A host silent for good is so found dead sooner than the 65 s of missed
# checks before (estimated ~35-40 s, not measured). (A lower TCP resend ceiling, the sysctl
# net.ipv4.tcp_rto_max_ms, needs root on every host; the per-socket option needs Ray's own code.)
# Given to the head as its system config, which the GCS hands to every raylet, worker and driver: a
# gRPC server answers GOAWAY "too_many_pings" to a client pinging more often than its own process's
# setting allows, so every process must agree (set as env on our nodes only, the keeper's driver was
# left out and did: seen). ``tests/test_ray_contract.py`` holds the names.
LINK_CONFIG = {"grpc_client_keepalive_time_ms": 5000, "grpc_client_keepalive_timeout_ms": 20000}
# How long Ray's launcher (``ray up``) and its autoscaler wait for a new machine to answer SSH before
# they give it up: read from the environment at import (``tests/test_ray_contract.py`` holds the name)
SSH_WAIT_ENV = "AUTOSCALER_NODE_START_WAIT_S"
# a node found dead by missed checks died about this long before Ray wrote it down: the checks
# it missed, the first one at a random point of its period (a silent host: later still)
DIED_BEFORE_NOTICED_S = (HEALTH_CHECK_MISSES - 0.5) * HEALTH_CHECK_PERIOD_S
MISSED_CHECKS = "health check failed"


class ClusterUnreachable(GpugeekError):
    """The cluster's GCS did not answer."""


@dataclass(frozen=True)
class RayNode:
    node_id: str
    node_type: str            # the autoscaler node type; "" for a head started by hand
    alive: bool
    is_head: bool
    started: float            # seconds since the epoch, as Ray recorded
    ended: float | None
    idle_s: float | None      # how long Ray has seen it idle; None while it runs work
    raylet_socket: str
    resources: dict[str, float] = field(default_factory=dict)
    death_reason: str = ""

    @property
    def gpus(self) -> float:
        return self.resources.get("GPU", 0.0)


def use_token_auth() -> None:
    """Speak Ray's token authentication from this process, as Ray's own CLI does.

    Our clusters run with ``RAY_AUTH_MODE=token`` and Ray's standard token file
    (``~/.ray/auth_token``, made on first use), because a head on this machine is otherwise open
    to anyone who can reach its ports.
    """
    import os

    try:
        from ray._private.authentication import authentication_token_setup as auth
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray from before token authentication: nothing to do
        return

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        import logging

        quiet = logging.getLogger(auth.__name__)   # its INFO line would land on the cell's stderr
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            auth.generate_and_save_token()
        finally:
            quiet.setLevel(level)
        # Ray writes it world-readable; the token is the key to every cluster it guards
        os.chmod(auth._get_default_token_path(), 0o600)
        print(f"Ray token authentication: made a token at {auth._get_default_token_path()} (first use; "
              f"Ray's dashboard asks for it)")
    if os.environ.get(auth.AUTH_MODE_ENV_VAR) != "token":
        os.environ[auth.AUTH_MODE_ENV_VAR] = "token"
        Config.initialize("")


def token_text() -> str:
    """The token this process authenticates with (made on first use), to copy onto a cluster's hosts."""
    import os
    from pathlib import Path

    use_token_auth()
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    from ray._private.authentication import authentication_token_setup as auth

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or auth._get_default_token_path()).expanduser()
    if path.stat().st_mode & 0o077:     # Ray's own CLI writes it 0644: anyone here could use it
        os.chmod(path, 0o600)
    return path.read_text().strip()


@contextmanager
def _answering(address: str, timeout: float):
    """Only what means "nothing answered" — Ray's RPC failure (refused, timed out, GCS gone) and
    the OS's — becomes ``ClusterUnreachable``. Anything else (a TypeError after a Ray upgrade
    changed this private API, say) is a bug and surfaces: called "unreachable", it would have the
    watchdog stop a healthy cluster.

    Ray's client, made for a port where nothing listens (a head just stopped, a host gone), waits
    ~40 s whatever the call's timeout before it says so (Ray 2.60); a watchdog stuck that long
    misses its looks, a reader keeps the user waiting. So the port is dialled first, within ``timeout``."""
    from ray.exceptions import RpcError

    from .ports import why_closed

    host, _, port = address.rpartition(":")
    closed = why_closed(host.strip("[]"), int(port), timeout) if port.isdigit() else None
    if closed:
        raise ClusterUnreachable(f"the Ray cluster at {address} does not answer ({closed}) — check that it runs and "
                                 "this machine reaches it")
    use_token_auth()
    try:
        yield
    except (RpcError, ConnectionError, TimeoutError) as exc:
        raise ClusterUnreachable(f"the Ray cluster at {address} does not answer ({type(exc).__name__}) — check that "
                                 "it runs and this machine reaches it") from None


def read_nodes(address: str, timeout: float = 5.0) -> list[RayNode]:
    """Every node the cluster at ``address`` (host:port of its GCS) has known, dead ones too.
    ``ClusterUnreachable`` when nothing answers there; any other error is raised as it is."""
    from ray._raylet import GcsClient

    with _answering(address, timeout):
        table = GcsClient(address=address).get_all_node_info(timeout=timeout)
    return [_node(info) for info in table.values()]


def _node(info) -> RayNode:
    from ray.core.generated import gcs_pb2

    resources = dict(info.resources_total)
    alive = info.state == gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
    snapshot = info.state_snapshot
    idle = snapshot.state == gcs_pb2.NodeSnapshot.State.IDLE
    why = info.death_info.reason_message if not alive else ""
    ended = info.end_time_ms / 1000.0 if (not alive and info.end_time_ms) else None
    if ended is not None and MISSED_CHECKS in why:     # it died while the checks were being missed
        ended = max(info.start_time_ms / 1000.0, ended - DIED_BEFORE_NOTICED_S)
    return RayNode(
        node_id=info.node_id.hex(),
        node_type=info.node_type_name,
        alive=alive,
        is_head="node:__internal_head__" in resources or info.is_head_node,
        started=info.start_time_ms / 1000.0,
        ended=ended,
        idle_s=snapshot.idle_duration_ms / 1000.0 if (alive and idle) else None,
        raylet_socket=info.raylet_socket_name,
        resources=resources,
        death_reason=why,
    )


def held_by_placement_groups(address: str, timeout: float = 5.0) -> bool:
    """Whether every CPU and GPU in use on the cluster is a placement group's reservation. A warm
    worker group between cells holds its nodes that way, and Ray then calls them busy; a task or
    actor outside any group uses them otherwise."""
    import re

    from ray._raylet import GcsClient

    with _answering(address, timeout):
        usage = GcsClient(address=address).get_all_resource_usage(timeout=timeout)
    for node in usage.resource_usage_data.batch:
        total, available = dict(node.resources_total), dict(node.resources_available)
        for kind in ("CPU", "GPU"):
            used = total.get(kind, 0.0) - available.get(kind, 0.0)
            reserved = sum(v for k, v in total.items() if re.fullmatch(rf"{kind}_group_[0-9a-f]+", k))
            if used > reserved + 1e-6:
                return False
    return True


# -- preemption notices in the cluster's KV store (the sim backend's; workers/notice.py reads them)

NOTICE_NAMESPACE = b"gpugeek"
NOTICE_PREFIX = "notice/"            # + node id → when the node goes (Unix time, as text)


def send_notice(address: str, node_id: str, deadline: float) -> None:
    """Tell a node of the cluster at ``address`` that it goes at ``deadline`` (no driver needed)."""
    from ray._raylet import GcsClient

    use_token_auth()
    GcsClient(address=address).internal_kv_put((NOTICE_PREFIX + node_id).encode(), str(deadline).encode(),
                                               True, NOTICE_NAMESPACE)


# -- what the notebook's machine and the head's watchdog tell each other (remote/headguard.py)

def kv_put(address: str, key: str, value: dict, timeout: float = 5.0) -> None:
    """``value`` (JSON) under ``key`` in the cluster's KV store."""
    import json

    from ray._raylet import GcsClient

    with _answering(address, timeout):
        GcsClient(address=address).internal_kv_put(key.encode(), json.dumps(value).encode(), True,
                                                   NOTICE_NAMESPACE, timeout=timeout)


JOB_PREFIX = "job/"      # + a worker group's name: its running (or last) job, told by its rank 0


def kv_all(address: str, prefix: str, timeout: float = 5.0) -> dict[str, dict]:
    """Every JSON value under keys starting with ``prefix``: {key: value}."""
    import json

    from ray._raylet import GcsClient

    with _answering(address, timeout):
        client = GcsClient(address=address)
        keys = client.internal_kv_keys(prefix.encode(), NOTICE_NAMESPACE, timeout=timeout)
        out = {}
        for key in keys:
            raw = client.internal_kv_get(key, NOTICE_NAMESPACE, timeout=timeout)
            if raw:
                out[key.decode()] = json.loads(raw)
    return out


def kv_get(address: str, key: str, timeout: float = 5.0) -> dict | None:
    """What ``kv_put`` left under ``key``, or None."""
    import json

    from ray._raylet import GcsClient

    with _answering(address, timeout):
        raw = GcsClient(address=address).internal_kv_get(key.encode(), NOTICE_NAMESPACE, timeout=timeout)
    return json.loads(raw) if raw else None


# -- the rest of Ray's insides this package leans on, each behind one function here --------------
# (tests/test_ray_contract.py holds each against the Ray installed; nothing else of ours imports
# ray._private, ray._raylet, ray.autoscaler._private or internal_kv)

def put_from_worker(key: str, value: str) -> None:
    """``value`` under ``key`` in the KV store, from inside a Ray worker (its own GCS connection)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, True, namespace=NOTICE_NAMESPACE)


def get_from_worker(key: str) -> bytes | None:
    """What is under ``key`` in the KV store, read from inside a Ray worker."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(key, namespace=NOTICE_NAMESPACE)


def no_auto_init() -> None:
    """Ray's auto-init off in this process (``RAY_ENABLE_AUTO_CONNECT=0``, read only at import)."""
    from ray._private import auto_init_hook

    auto_init_hook.enable_auto_connect = False


def wrap_driver_printer(wrap) -> None:
    """Ray's driver prints its log thread's and its error listener's lines through
    ``print_to_stdstream(data, ignore_prefix)``: replace it with ``wrap(real)`` (before ``ray.init``,
    which hands it to the log thread; the listener finds it by name at each call). Once."""
    from ray._private import worker

    if not getattr(worker.print_to_stdstream, "gpugeek", False):
        wrapped = wrap(worker.print_to_stdstream)
        wrapped.gpugeek = True
        worker.print_to_stdstream = wrapped


def upload_folders(env: dict, scratch_dir: str) -> dict:
    """``env`` with its local ``py_modules`` and ``working_dir`` uploaded to the connected cluster
    and named by their URIs, as Ray's own driver does at ``ray.init``."""
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    env = upload_py_modules_if_needed(dict(env), include_gitignore=False, scratch_dir=scratch_dir)
    return upload_working_dir_if_needed(env, include_gitignore=False, scratch_dir=scratch_dir)


EC2_IMAGES = ("autoscaler/_private/aws/config.py", "DEFAULT_AMI")    # in Ray's package: the file, the name


@functools.lru_cache(maxsize=1)
def ec2_default_images() -> dict[str, str] | None:
    """Region → the machine image (AMI) Ray's cluster launcher gives an EC2 node whose config names
    none; a region missing here needs one named (else ``ray up`` stops after making its IAM role,
    key pair and security group: "no ImageId … and no default AMI is available for the region").
    Read from Ray's source, not imported (that module imports boto3 and Ray's autoscaler: seconds,
    for a table the offers are marked with); None where it is not found there."""
    import ast
    import importlib.util

    found = importlib.util.find_spec("ray")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(found.submodule_search_locations[0]) / EC2_IMAGES[0]
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == EC2_IMAGES[1] for t in node.targets):
            try:
                return dict(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def launcher_config(config: dict) -> dict:
    """A cluster-launcher config with Ray's provider defaults filled in and checked against its own
    JSON schema (Ray's exception, as it is, when it is refused)."""
    import copy
    import logging

    from ray.autoscaler._private.util import prepare_config, validate_config

    quiet = logging.getLogger("ray.autoscaler._private.util")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        prepared = prepare_config(copy.deepcopy(config))
        validate_config(prepared)
    finally:
        quiet.setLevel(level)
    return prepared
