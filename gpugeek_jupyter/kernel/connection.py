"""How a kernel reaches a cluster: the one room that knows. Everything above calls ``connect``,
``disconnect`` and ``connected_address`` and nothing else of Ray's connection machinery.

The kernel becomes a Ray driver (``ray.init(address)``) of local, sim and attached clusters on
its own network. It is not part of an ``ssh``, onprem or cloud (aws, gcp, azure) cluster: it talks
to the cluster's keeper on the head over the line (``line/``), through the cluster's SSH tunnel, as
source text and data — so its Python and Ray versions are free of the hosts'. Only a cluster
someone else runs, named ``--address ray://…``, is joined as a Ray Client (the same Python minor
and Ray version on both ends), and said so. It only records itself attached to KubeRay ones. A
driver whose cluster is stopped elsewhere (the watchdog, JupyterLab, another kernel) must let go at
once — a Ray driver whose GCS has gone ends its own process a minute later — so a watcher thread
drops the connection when the registry says a stop has begun.
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from contextlib import contextmanager

from .. import raynodes, store
from ..backends.interface import CLIENT_SCHEME, capable
from ..cluster import registry
from ..cluster.processes import this_kernel
from ..cluster.registry import ClusterRecord
from ..cluster.spec import ClusterSpec
from ..errors import GpugeekError
from ..group.link import StoppedElsewhere
from ..line.messages import PROTOCOL, Hello, Ship
from ..line.wire import Line, LinkDown, TokenRefused
from ..raynodes import NODE_ENV, token_text, use_token_auth
from ..remote import tunnel
from ..versions import PACKAGE_VERSION, version_of
from . import environment, headlogs, raylines
from .session import WATCHER, Connection, current, fine, trouble
from .session import attach as session_attach

WATCH_INTERVAL_S = registry.KERNELS_LOOK_EVERY_S
CLIENT_TRIES = 3
CLIENT_SETTLE_S = 40.0      # Ray's reconnect grace period (30 s) and a margin
KEEPER_WAIT_S = 90.0        # a keeper just started by the head's watchdog (importing Ray, joining it)
DIAL_TIMEOUT_S = 5.0
SHIP_TIMEOUT_S = 300.0      # a working folder of up to 500 MiB, through the tunnel


_watcher: threading.Thread | None = None


def connected_address() -> str | None:
    """The address of the cluster this process is a Ray driver of, as ``ray.init`` was given it."""
    connection = current().connection
    return connection.address if connection is not None else None


def connect(record: ClusterRecord) -> None:
    """Make this kernel a Ray driver (local, sim, attach), a caller of the keeper over the line
    (ssh, onprem, clouds), or a Ray Client (``--address ray://…``) of the cluster, and attached to it."""
    global _watcher
    session = current()
    can = capable(record)
    # a cloud head not yet reached (its `up` failed half-way) has no tunnel to open: attached only
    reachable = not can.tunnelled or ClusterSpec.from_json(record.spec).remote.hosts
    if can.tunnelled and reachable:
        record = tunnel.ensure(record)
    if not record.address or not reachable or can.kernel_joins is None:
        session_attach(record)     # this notebook looks after it, even without a driver
        return
    if can.kernel_joins == "line":
        _line(session, record)
    else:
        _ray(session, record)
    session_attach(record)
    if _watcher is None:
        _watcher = threading.Thread(target=_watch, name="gpugeek-connection", daemon=True)
        _watcher.start()


def _ray(session, record: ClusterRecord) -> None:
    """This kernel a Ray driver of the cluster, or a Ray Client of one someone else runs."""
    import ray

    _no_auto_init()
    if session.line is not None:
        _leave_line(session)
    if ray.is_initialized():
        if session.connection and session.connection.address == record.address:
            return
        if session.connection is None:
            print(f"note: this kernel's own Ray connection is closed; it now drives {record.name!r}")
        else:
            _leave_group(session)
        ray.shutdown()
        session.connection = None
    # simulated nodes share one log folder, so every node's log monitor would repeat every line:
    # there we keep Ray's logs in the files and show status instead
    use_token_auth()      # our clusters require Ray's token, a driver's as a client's
    if record.address.startswith(CLIENT_SCHEME):
        print(f"note: joining {record.address} as a Ray Client, as you asked: this kernel needs the cluster's "
              f"Python minor version and Ray version, and Ray ends the job after 30 s without the link",
              flush=True)
        _client_init(record.address, job_env(record, remote=True))
        kind = "client"
    else:
        raylines.keep_out()
        ray.init(address=record.address, namespace="gpugeek", logging_level="ERROR",
                 configure_logging=True, log_to_driver=not record.simulated,
                 runtime_env=job_env(record, remote=False) or None)
        kind = "driver"
    session.connection = Connection(record.address, store.path(), record.id, kind=kind)


def _line(session, record: ClusterRecord) -> None:
    """This kernel on the line to the cluster's keeper (on its head, through the tunnel): the
    token proven both ways and versions told; waits for a keeper that is still starting."""
    connection = session.connection
    if session.line is not None and connection is not None and connection.cluster_id == record.id:
        return
    if session.line is not None or (connection is not None and connection.kind == "driver"):
        _leave_group(session)
    if session.line is not None:
        _leave_line(session)
    elif connection is not None:
        let_go()
    hello = Hello(protocol=PROTOCOL, package=PACKAGE_VERSION, python=platform.python_version(), ray=version_of("ray"),
                  kernel=this_kernel())
    line = Line(_dialer(record.id), token_text(), hello)
    waiting = headlogs.Waiting(record, KEEPER_WAIT_S)     # the head's logs say what will not clear by itself
    while True:
        try:
            line.open()
            break
        except TokenRefused:
            raise GpugeekError(f"cluster {record.name!r} refused this kernel's token: RAY_AUTH_TOKEN or Ray's token "
                               "file here is not the one `up` used — "
                               f"start the kernel with that token, or `%gpugeek down {record.name}` and `up` it "
                               f"again") from None
        except LinkDown as exc:
            waiting.failed(str(exc))
            time.sleep(1.0)
    session.line = line
    session.connection = Connection(record.address, store.path(), record.id, kind="line")
    _ship_cluster_files(line, record)


def _ship_cluster_files(line: Line, record: ClusterRecord) -> None:
    """``up --env``'s requirements and ``--working-dir``'s folder, on the keeper for every group:
    sent where it lacks them (it keeps them across its own restarts, so a kernel that connects
    again sends nothing)."""
    spec = ClusterSpec.from_json(record.spec)
    if not spec.env and not spec.working_dir:
        return
    held = line.call(Ship(), SHIP_TIMEOUT_S)
    send: dict = {}
    if list(spec.env) != held.pip:
        send["pip"] = list(spec.env)
    if spec.working_dir and not held.working_dir and os.path.isdir(spec.working_dir):
        send["working_dir"] = environment.packed_folder(spec.working_dir)
    if send:
        line.call(Ship(**send), SHIP_TIMEOUT_S)


def _dialer(cluster_id: int):
    """How the line reaches the keeper: the cluster's tunnel (opened again where it died), then its
    local end. Whatever fails is an ``OSError`` to the line: not there now, dialled again later."""
    def dial() -> socket.socket:
        try:
            record = registry.get(cluster_id)
        except KeyError:
            raise OSError("the cluster is no longer in this machine's registry") from None
        if not record.live:
            raise OSError("the cluster was stopped")
        try:
            record = tunnel.ensure(record)
        except GpugeekError as exc:
            raise OSError(str(exc)) from None
        host, _, port = ClusterSpec.from_json(record.spec).remote.line_address.rpartition(":")
        return socket.create_connection((host, int(port)), timeout=DIAL_TIMEOUT_S)
    return dial


def line() -> Line | None:
    """This kernel's line to its remote cluster's keeper, if it is on one."""
    return current().line


def _leave_line(session) -> None:
    """Off the line (this kernel moves to another cluster): its warm group there stopped first."""
    line_, session.line = session.line, None
    if line_ is not None:
        line_.close()
    session.connection = None


def _leave_group(session) -> None:
    """This kernel moves to another cluster: its warm group there is stopped (its workers are
    detached, and would stay), unless a job runs on it — then the job goes on, and is said."""
    group = session.group
    if group is None or not group.leave():
        return
    left, job = registry.get(session.connection.cluster_id), (group.job or {}).get("id", "JOB")
    print(f"note: this kernel's job {job} goes on on {left.name!r} — `%gpugeek up {left.name}` then "
          f"`%gpugeek attach {job}` follows it", flush=True)


def _client_init(address: str, runtime_env: dict) -> None:
    """``ray.init`` as a Ray Client. The head's proxy starts a server process for each client, and
    under load that start sometimes fails at once ("Initialization failure from server"): a new
    attempt gets a new server."""
    import ray

    for attempt in range(CLIENT_TRIES):
        try:
            ray.init(address, namespace="gpugeek", logging_level="ERROR", log_to_driver=True, runtime_env=runtime_env)
            return
        except ConnectionAbortedError as exc:
            server_died = any(sign in str(exc) for sign in ("Starting Ray client server failed",
                                                            "start_specific_server"))
            if not server_died or attempt == CLIENT_TRIES - 1:
                raise
            ray.shutdown()
            time.sleep(1.0)


def settle(record: ClusterRecord | None = None) -> bool:
    """Wait out a Ray Client's reconnection; True when the connection had to be made anew.

    When the tunnel drops (the laptop slept, the watchdog is reopening it), Ray's client reconnects
    by itself within its grace period, and most calls wait for it, but some fail at once meanwhile
    ("Cannot invoke RPC on closed channel"). So a cell first waits for the client's channel to be
    ready again — read from the client's own state, no request — and for the cluster's tunnel
    (``record``: as the cell just read it, not read twice). A client that gave up is connected
    again; the workers it owned are gone with its session."""
    connection = current().connection
    if connection is None or not connection.client:
        return False
    from ray.util.client import ray as client

    deadline = time.monotonic() + CLIENT_SETTLE_S
    if record is None or record.id != connection.cluster_id:
        record = None
    while client.is_connected() and time.monotonic() < deadline:
        if steady() and _tunnel_lives(record or registry.get(connection.cluster_id)):
            break
        time.sleep(0.1)
        record = None          # the watchdog's new tunnel: read afresh
    if client.is_connected():
        return False
    record = registry.get(connection.cluster_id)
    print(f"note: the connection to {record.name!r} was lost; connecting again", flush=True)
    rejoin(record)
    return True


def _tunnel_lives(record: ClusterRecord) -> bool:
    """Whether the cluster's SSH tunnel process lives. Killed, it takes the client's channel down,
    but the channel may read ready for a moment more: a cell sent then never reaches rank 0. So
    a cell waits for the watchdog's new tunnel (which it records) as for the channel."""
    from ..cluster import processes

    return not capable(record).tunnelled or not record.session_id or processes.alive(record.session_id)


def steady() -> bool:
    """Whether this kernel's connection can take a request now (a Ray Client's channel is ready:
    not reconnecting; the line is up). Costs no request: for what runs between cells, which must
    never wait."""
    session = current()
    connection = session.connection
    if connection is not None and connection.kind == "line":
        return session.line is not None and session.line.up
    if connection is None or not connection.client:
        return connection is not None
    import grpc
    from ray.util.client import ray as client

    worker = client.get_context().client_worker
    return client.is_connected() and worker is not None and \
        getattr(worker, "_conn_state", grpc.ChannelConnectivity.READY) == grpc.ChannelConnectivity.READY


def job_env(record: ClusterRecord, *, remote: bool) -> dict:
    """The job's ``runtime_env``: on a remote cluster this package (so the workers run the
    kernel's own version of it, and a host needs only Python, Ray and torch) and the kernel's
    modules its cells needed (``environment``); everywhere, the cluster's ``up --env`` packages."""
    spec = ClusterSpec.from_json(record.spec)
    if not remote:
        return environment.runtime_env(spec.env, package=False, folder=spec.working_dir)
    modules = list(environment.shipment().for_cluster(record.id).shipped.values())
    # the workers' priority too, for a cluster whose nodes someone else started (ours have it); pip
    # installs from the index the hosts' runtime came from (`--pip-index-url`), where one was given
    return {**environment.runtime_env(spec.env, modules, folder=spec.working_dir,
                                      index_url=spec.remote.pip_index_url), "env_vars": dict(NODE_ENV)}


def reconnect(record: ClusterRecord) -> None:
    """Connect again (the job's ``runtime_env`` grew, or an old placement group would not go);
    the worker group is stopped first: its workers belong to the cluster, and would outlive the
    old connection."""
    session = current()
    if session.group is not None:
        session.group.stop()
        session.group.broken = True
    let_go()
    connect(record)


def rejoin(record: ClusterRecord) -> None:
    """A Ray Client that gave up (the link was down longer than its grace), connected again. The
    worker group is kept: its workers are detached and named, and outlive the old session
    (``group/workergroup.WorkerGroup.refind``). Raises what Ray raises while the cluster is still out of reach."""
    from ray.util.client import ray as client

    if client.is_connected() and steady():
        return
    let_go()
    connect(record)


def _no_auto_init() -> None:
    """Switch off Ray's auto-init (``RAY_ENABLE_AUTO_CONNECT=0``, read when Ray is imported): once
    this kernel's cluster goes, a Ray call still under way — a running cell's, on the main thread,
    when the watcher lets go — must fail and say so, not start a Ray of its own on this machine."""
    raynodes.no_auto_init()


def disconnect(record: ClusterRecord) -> None:
    """Let go of the cluster before it goes away under this kernel, and detach from it."""
    session = current()
    if session.connection is not None and session.connection.cluster_id == record.id:
        let_go()
    registry.detach(record.id)


@contextmanager
def cell_running():
    """Around a cell's Ray calls in the main thread. The watcher never shuts Ray down under them
    (a ``ray.wait`` whose Ray is shut down from another thread can spin for good): it only notes
    the stop; the cell sees it (``check_stop``) and its end lets go here, in this thread."""
    session = current()
    session.cells_running += 1
    try:
        yield
    finally:
        session.cells_running -= 1
        if session.stop_seen and not session.cells_running:
            session.stop_seen = False
            let_go()


def check_stop() -> None:
    """Raise ``StoppedElsewhere`` once the watcher has seen the cluster's stop begin."""
    if current().stop_seen:
        raise StoppedElsewhere


def let_go() -> None:
    """Shut this process's connection: its Ray, or its line (the cluster is being stopped elsewhere)."""
    session = current()
    if session.line is not None:
        _leave_line(session)
        return
    try:
        import ray

        ray.shutdown()
    except BaseException:  # noqa: BLE001 - Ray's calls raise SystemExit while it shuts down
        pass
    session.connection = None


def _watch() -> None:
    """Disconnect this kernel when its cluster is stopped elsewhere (watchdog, another kernel)."""
    session = current()
    while True:
        time.sleep(WATCH_INTERVAL_S)
        connection = session.connection
        if connection is None:
            continue
        # never end this thread: without it, the next cluster stopped elsewhere takes the kernel
        # with it (Ray ends a driver whose raylet dies)
        watch_once(session, connection)


def watch_once(session, connection) -> None:
    """One look of the watcher: a registry it cannot read is counted and said (``trouble``)."""
    try:
        stopping = registry.stop_started(connection.db, connection.cluster_id)
    except Exception as exc:  # noqa: BLE001 - counted, and said at the next command
        trouble(WATCHER, exc)
        return
    fine(WATCHER)
    if stopping and session.connection == connection:
        if session.cells_running:      # the cell lets go itself, within a few seconds
            session.stop_seen = True
        else:
            let_go()      # (it takes Ray's errors while it shuts down)
