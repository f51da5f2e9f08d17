"""``check``: one line for each way to get machines — ready, or what is missing and what to do —
found without launching anything or spending a cent, so that ``up`` does not fail half-way.

Each backend answers for itself (``Backend.readiness``; a cloud's through its ``Cloud.readiness``);
what several of them look at the same way (a host over SSH, this machine, a Kubernetes cluster)
is here. Not a backend: code outside ``backends/`` may import it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..errors import GpugeekError
from ..remote import ssh
from .base import Asked, Backend, Readiness

KUBECTL_TIMEOUT_S = 15
SMI_TIMEOUT_S = 10
RAYCLUSTER_CRD = "rayclusters.ray.io"


@dataclass(frozen=True)
class Check:
    """What ``check`` found: a line for each way looked at; ``ready`` when every one is."""

    lines: tuple[Readiness, ...]

    @property
    def ready(self) -> bool:
        return all(r.ready for r in self.lines)

    def __str__(self) -> str:
        return "\n".join(map(str, self.lines))

    __repr__ = __str__


def check(backends: Mapping[str, Backend], ways: str | list[str] | tuple[str, ...] | None = None, *,
          region: str | None = None, login: str | None = None, ssh_key: str | None = None,
          hosts: str | None = None) -> Check:
    """Each of ``backends`` (the registry, ``interface.backends``) named in ``ways`` (comma-separated,
    or a list; none: every one with something of its own to look at) asked whether ``up`` could get
    its machines, all at once."""
    named = tuple(w.strip() for w in (ways.split(",") if isinstance(ways, str) else ways or ()) if w.strip())
    unknown = [w for w in named if w not in backends]
    if unknown:
        raise GpugeekError(f"check: no way to get machines called {unknown[0]!r} — one of {', '.join(backends)}")
    asked = Asked(region=region, login=login, ssh_key=ssh_key, hosts=hosts, ways=named)
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda w: _one(w, backends[w], asked), named or tuple(backends)))
    return Check(tuple(r for r in found if r is not None))


def _one(way: str, backend, asked: Asked) -> Readiness | None:
    """One backend's line, never a traceback: what it raised becomes its line."""
    try:
        found = backend.readiness(asked)
    except GpugeekError as exc:
        found = Readiness(way, False, str(exc))
    except Exception as exc:  # noqa: BLE001 - one line for the user, whatever the SDK raised
        found = Readiness(way, False, f"{type(exc).__name__}: {exc}")
    if found is None and way in asked.ways:
        found = Readiness(way, True, "nothing to look at before `up` (it needs nothing set up here)")
    return found and Readiness(found.way, found.ready, " ".join(found.line.split()))


# -- what several backends look at the same way ------------------------------------------------------

def here(way: str) -> Readiness:
    """This machine: always ready; what it has (CPUs, NVIDIA GPUs where ``nvidia-smi`` lists any)."""
    gpus = []
    if shutil.which("nvidia-smi"):
        try:
            said = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=SMI_TIMEOUT_S)
            gpus = [g.strip() for g in said.stdout.splitlines() if g.strip()] if said.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired):
            gpus = []
    kinds = sorted(set(gpus))
    has = (", ".join(f"{gpus.count(k)}× {k}" for k in kinds)) if gpus else "no GPU (CPU only)"
    return Readiness(way, True, f"this machine: {os.cpu_count() or 1} CPUs, {has}")


def login_node(way: str, asked: Asked) -> Readiness | None:
    """A scheduler's login node: answers over SSH, and has ``sbatch`` on its login shell's PATH."""
    if not asked.login:
        return Readiness(way, False, "name the login node to look at: --login USER@HOST (and --ssh-key "
                                     "KEY)") if way in asked.ways else None
    try:
        target = ssh.parse_hosts([asked.login])[0]
    except GpugeekError:
        raise GpugeekError(f"--login {asked.login!r} is not a host — write the login node as "
                           "[USER@]HOST[:PORT]") from None
    done = ssh.run(target, asked.ssh_key, "bash -lc 'command -v sbatch'", timeout=30)
    found = done.stdout.strip().splitlines()
    if done.returncode != 0 or not found:
        return Readiness(way, False, f"{target} answers over SSH but has no sbatch — is it the cluster's login "
                                     f"node? (Slurm's commands on its PATH)")
    return Readiness(way, True, f"{target} answers over SSH; sbatch at {found[-1]}")


def your_hosts(way: str, asked: Asked) -> Readiness | None:
    """Your own hosts (``--hosts``): each answers over SSH."""
    if not asked.hosts:
        return Readiness(way, False, "name the machines to look at: --hosts USER@HOST,… (and --ssh-key "
                                     "KEY)") if way in asked.ways else None
    targets = ssh.parse_hosts(asked.hosts)

    def answers(target: ssh.Target) -> str | None:
        try:
            ssh.run(target, asked.ssh_key, "true", timeout=30)
        except GpugeekError as exc:
            return str(exc)
        return None

    failed = [why for why in ssh.on_hosts(targets, answers) if why]
    if failed:
        return Readiness(way, False, failed[0] + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    return Readiness(way, True, f"{', '.join(map(str, targets))} answer{'s' if len(targets) == 1 else ''} over SSH")


def kubernetes(way: str) -> Readiness:
    """``kubectl``, a kubeconfig, and the RayCluster CRD (the KubeRay operator) in that cluster."""
    if shutil.which("kubectl") is None:
        return Readiness(way, False, "kubectl is not on PATH — install it and point KUBECONFIG at your cluster")
    configs = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or ["~/.kube/config"]
    if not any(Path(p).expanduser().exists() for p in configs):
        return Readiness(way, False, "no kubeconfig (KUBECONFIG, ~/.kube/config) — get your cluster's from its "
                                     "provider, or set KUBECONFIG")
    try:
        done = subprocess.run(["kubectl", "get", "crd", RAYCLUSTER_CRD, "-o", "name",
                               f"--request-timeout={KUBECTL_TIMEOUT_S}s"], capture_output=True, text=True,
                              timeout=KUBECTL_TIMEOUT_S + 5)
    except subprocess.TimeoutExpired:
        return Readiness(way, False, f"kubectl got no answer from the cluster within {KUBECTL_TIMEOUT_S} s")
    if done.returncode == 0:
        return Readiness(way, True, f"the cluster in your kubeconfig has the RayCluster CRD ({RAYCLUSTER_CRD})")
    said = (done.stderr.strip().splitlines() or ["kubectl failed"])[-1]
    if "NotFound" in said or "not found" in said:
        return Readiness(way, False, "the cluster has no RayCluster CRD — install the KubeRay operator: "
                                     "`helm install kuberay-operator kuberay/kuberay-operator`")
    return Readiness(way, False, f"kubectl cannot reach the cluster: {said}")


def cloud(way: str, provider, region: str | None) -> Readiness:
    """A cloud of ``clouds/``: its own look (``Cloud.readiness``), or its one line of what is missing."""
    try:
        return Readiness(way, True, provider.readiness(region))
    except GpugeekError as exc:
        return Readiness(way, False, str(exc))
