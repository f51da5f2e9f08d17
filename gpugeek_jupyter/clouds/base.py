"""What a cloud provider is to us: how Ray's launcher rents its machines, how a spot node there
hears it is being taken, and how a head there ends itself. One object a provider, as SkyPilot's
``sky/clouds/<cloud>.py``: the launcher, the workers and the head's watchdog ask it, never its name.

Runs on: the laptop (the launcher's YAML, the credentials), the workers (preemption notices),
a cloud head (its self-stop). The standard library alone (and ``errors``): every one of those
has it. A provider's SDK is imported only to list what it bills (``instances``), where the cluster
is rented from: the laptop, a cloud head.
"""

from __future__ import annotations

import importlib.util
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ..errors import GpugeekError

METADATA_TIMEOUT_S = 0.5
API_TIMEOUT_S = 5.0        # one call to a provider's API from a watchdog's look: a look is seconds


class CloudUnanswered(GpugeekError):
    """The provider's API did not answer (or refused to): what it bills stays as last known."""


@dataclass(frozen=True)
class Instance:
    """One machine of a cluster as its provider bills it: from ``launched`` until ``ended``
    (None while it bills, or when the provider does not say when it ended: then ``gone``)."""

    id: str
    node_type: str        # the launcher's node type: ``head``, or a worker type's name
    launched: float       # seconds since the epoch, as the provider recorded
    ended: float | None
    state: str            # the provider's own word (EC2: pending, running, shutting-down, terminated, …)
    address: str          # the private address
    spot: bool
    gone: bool            # no longer billed (ended, stopped or terminated)
    head: bool = False    # the cluster's head (Ray's node kind tag)
    preempted: bool = False   # the provider took it back (a spot interruption), as it says why it ended


class Cloud:
    """One provider. ``name`` is the catalog's and Ray's provider type; ``head_instance`` a small
    CPU machine (the head runs Ray's control plane, not training; priced where ``catalog/heads.py``
    holds it); ``self_stop`` the shell command with which a head ends itself, as the
    provider documents it."""

    name: str
    head_instance: str
    kubernetes_spot: tuple[str, str]   # how its managed Kubernetes labels spot nodes (KubeRay's selector)
    self_stop: str
    sdk: tuple[str, str]          # the module ``ray up`` needs for this provider, and its pip names
    credentials: tuple[tuple[str, ...], tuple[str, ...]]   # the variables and files its chain reads
    no_credentials: str           # what to do when none are found
    refusals: Mapping[str, str] = MappingProxyType({})   # its API's error code → what to do, when it refuses a launch
    no_capacity: tuple[str, ...] = ()   # the codes that mean "none free there now": another zone or offer
    billing_minimum_s: float = 0.0      # an instance is billed at least this long once launched
    lists_instances = False             # ``instances`` and ``terminate`` speak its API (else: Ray's node table)

    def provider_section(self, node_type, cluster_name: str) -> dict:
        """The YAML's ``provider`` section, placed where the first node type's offer is."""
        raise NotImplementedError

    def auth(self) -> dict:
        return {"ssh_user": "ubuntu"}

    def node_config(self, instance: str, node_type, *, spot: bool) -> dict:
        """One node type's ``node_config``; ``node_type`` None: the head."""
        raise NotImplementedError

    def head_config(self, config: dict, region: str) -> dict:
        """The head's node config (in ``region``, the workers'), changed where its self-stop needs it."""
        return config

    def worker_config(self, config: dict, storage: str | None) -> dict:
        """A worker's node config, given where its jobs checkpoint (``up --storage``): what the
        machine needs to reach that storage (its role, on a cloud that grants access by role)."""
        return config

    def read_notice(self, node_id: str = "") -> float | None:
        """On a spot node: when it goes (a Unix time), once the provider has said so; else None."""
        raise NotImplementedError

    def instances(self, cluster_name: str, region: str, since: float = 0.0) -> list[Instance]:
        """The instances of the cluster Ray's launcher named ``cluster_name`` (found by its tags),
        launched at or after ``since``: the provider's own record of what it bills. Raises
        ``CloudUnanswered``."""
        raise NotImplementedError

    def terminate(self, instance_ids: list[str], region: str) -> None:
        """End these instances through the provider's API (billing stops as they shut down).
        Raises ``CloudUnanswered``."""
        raise NotImplementedError

    def check_credentials(self) -> None:
        """One clear line when nothing in the provider's standard chain could authenticate
        ``ray up``, or the SDK it needs is missing. Nothing is read out or printed."""
        variables, files = self.credentials
        if not (any(os.environ.get(v) for v in variables) or any(Path(f).expanduser().exists() for f in files)):
            raise GpugeekError(self.no_credentials)
        self.check_more()
        module, pip = self.sdk
        if not importable(module):
            raise GpugeekError(f"`ray up` on {self.name} needs the {self.name} SDK — pip install {pip}")

    def check_more(self) -> None:
        """What else ``ray up`` needs set for this provider."""

    def readiness(self, region: str | None = None) -> str:
        """``check``'s line: whether ``up`` could rent machines here, found without launching or
        paying for anything. Raises ``GpugeekError`` with what is missing and what to do."""
        self.check_credentials()
        return f"the SDK ({self.sdk[1]}) and credentials found (not tried: nothing is launched)"

    def image(self, region: str) -> str | None:
        """Your machine image for a node in ``region`` (``[cluster] images`` in config.toml), or
        None: Ray's launcher picks its own."""
        from ..config import settings

        return next((i for cloud, where, i in settings().images if (cloud, where) == (self.name, region)), None)

    def cannot_start_in(self, region: str) -> str | None:
        """Why Ray's launcher cannot start a node in ``region`` as things stand, and what to do;
        None where it can. Asked before anything is made or called (``up``) and marked in the offers."""
        return None

    def __repr__(self) -> str:
        return f"<cloud {self.name}>"


def metadata(method: str, url: str, headers: dict) -> str | None:
    """A metadata service's answer: the body, or None for a 404 (no notice yet)."""
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=METADATA_TIMEOUT_S) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
