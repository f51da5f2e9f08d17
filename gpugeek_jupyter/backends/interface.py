"""The registry of backends (``BACKENDS``), each a class in its own module (``base.Backend``: show
a config, start, stop, scale, and what it can do):

- ``local``: a Ray head on this machine with its real CPUs/GPUs (the default).
- ``sim``: Ray's fake multi-node autoscaler with node types made from offers (rehearsal).
- ``ssh``: the user's own machines, Ray started on each over SSH, reached through a tunnel.
- one a cloud of ``clouds/`` (aws, gcp, azure): Ray's cluster launcher (``ray up``/``ray down``)
  on a generated YAML whose start commands are the ``ssh`` backend's; its head reached through
  the same tunnel.
- ``onprem``: your own ``--hosts`` through Ray's cluster launcher and its on-premise provider:
  the cloud path's YAML, with the hosts in its provider section.
- ``kuberay``: a RayCluster manifest applied with ``kubectl``.
- ``slurm``: one allocation of a Slurm cluster, submitted from its login node, holding Ray; its
  head reached through the login node.
- ``attach``: an existing Ray cluster at ``--address``; we own none of it and never stop it.

Code outside ``backends/`` asks a cluster's backend what it can do (``capable(record).tunnelled``),
never its name. A new backend is one module with one class, and a line here; a new cloud is one
module of ``clouds/`` (its launcher backend is made from it here).
"""


from __future__ import annotations

from ..clouds import CLOUDS
from .attach import AttachBackend
from .base import CLIENT_SCHEME, READY_TIMEOUT_S, Backend, Feature, LaunchConfig, Started
from .clouds import LauncherBackend
from .hosts import SshBackend
from .kuberay import KubeRayBackend
from .local import LocalBackend
from .onprem import OnPremBackend
from .sim import SimBackend
from .slurm import SlurmBackend

__all__ = [
    "ATTACH",
    "BACKENDS",
    "BY_SSH",
    "CLIENT_SCHEME",
    "DEFAULT",
    "READY_TIMEOUT_S",
    "REHEARSE",
    "Backend",
    "Feature",
    "LaunchConfig",
    "Started",
    "capabilities",
    "capable",
    "renting",
]

BACKENDS: dict[str, Backend] = {
    "local": LocalBackend(),
    "sim": SimBackend(),
    "ssh": SshBackend(),
    **{name: LauncherBackend(provider) for name, provider in CLOUDS.items()},
    "onprem": OnPremBackend(),
    "kuberay": KubeRayBackend(),
    "slurm": SlurmBackend(),
    "attach": AttachBackend(),
}
DEFAULT = LocalBackend.name      # what `up` starts when no backend is named: this machine
ATTACH = AttachBackend.name      # what `up --address` means: a cluster someone else runs
REHEARSE = SimBackend.name       # offers rehearsed on this machine: simulated nodes, simulated $
BY_SSH = SshBackend.name         # the way onto a machine rented anywhere: its address and a key


def capabilities() -> list[str]:
    """What a backend says it can do: the names ``Backend`` declares."""
    return list(vars(Backend)["__annotations__"])


def renting(provider: str) -> str | None:
    """The backend through which ``up`` rents this provider's machines for you; None: ``up``
    cannot (rent the box there yourself, then start Ray on it over SSH: ``BY_SSH``)."""
    for name, impl in BACKENDS.items():
        if impl.launches and impl.provider == provider:
            return name
    return None


def capable(cluster) -> Backend:
    """What a cluster's backend can do: ``cluster`` is a record, a spec or a request (anything
    with a ``backend``), or a backend's name."""
    return BACKENDS[cluster if isinstance(cluster, str) else cluster.backend]
