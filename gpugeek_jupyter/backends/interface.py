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

from collections.abc import Iterator, Mapping
from importlib import import_module

from ..clouds import CLOUDS
from .base import CLIENT_SCHEME, READY_TIMEOUT_S, Backend, Feature, LaunchConfig, Started

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

# name → (its module here, its class); a cloud's is the launcher's backend made from it
_WHERE = {"local": ("local", "LocalBackend"), "sim": ("sim", "SimBackend"), "ssh": ("hosts", "SshBackend"),
          **{name: ("clouds", "LauncherBackend") for name in CLOUDS}, "onprem": ("onprem", "OnPremBackend"),
          "kuberay": ("kuberay", "KubeRayBackend"), "slurm": ("slurm", "SlurmBackend"),
          "attach": ("attach", "AttachBackend")}


class Backends(Mapping[str, Backend]):
    """Name → backend, each made (its module imported) when first asked for: a cluster's head
    loads its own backend's code alone (an ssh head's watchdog never imports the clouds')."""

    def __init__(self) -> None:
        self._made: dict[str, Backend] = {}

    def __getitem__(self, name: str) -> Backend:
        if name not in self._made:
            module, kind = _WHERE[name]
            made = getattr(import_module(f".{module}", __package__), kind)
            self._made[name] = made(CLOUDS[name]) if name in CLOUDS else made()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_WHERE)

    def __len__(self) -> int:
        return len(_WHERE)


BACKENDS = Backends()
DEFAULT = "local"      # what `up` starts when no backend is named: this machine
ATTACH = "attach"      # what `up --address` means: a cluster someone else runs
REHEARSE = "sim"       # offers rehearsed on this machine: simulated nodes, simulated $
BY_SSH = "ssh"         # the way onto a machine rented anywhere: its address and a key


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
