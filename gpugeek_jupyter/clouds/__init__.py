"""The cloud providers whose machines ``up`` rents through Ray's cluster launcher, one module a
provider, each one ``base.Cloud`` object: its YAML sections, credentials, preemption notices and
the head's self-stop. A new cloud is one module here and a line below; the launcher
(``backends/launcher.py``), the workers' notice watch (``workers/notice.py``) and the head's
watchdog (``guard/headwatch.py``) ask the object, never the provider's name.

Runs on: the laptop (the launcher's YAML), the workers (notices), a cloud head (its self-stop).
May import: the ground floor.
"""

from __future__ import annotations

from .aws import AWS
from .azure import AZURE
from .base import Cloud
from .gcp import GCP

__all__ = ["CLOUDS", "Cloud"]

CLOUDS: dict[str, Cloud] = {c.name: c for c in (AWS, GCP, AZURE)}
