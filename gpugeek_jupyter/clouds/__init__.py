"""The cloud providers whose machines ``up`` rents through Ray's cluster launcher, one module a
provider, each one ``base.Cloud`` object: its YAML sections, credentials, preemption notices and
the head's self-stop. A new cloud is one module here; the launcher
(``backends/launcher.py``), the workers' notice watch (``workers/notice.py``) and the head's
watchdog on a cloud head (``guard/cloudhead.py``) ask the object, never the provider's name.

Runs on: the laptop (the launcher's YAML), the workers (notices), a cloud head (its self-stop).
May import: the ground floor.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterator, Mapping
from importlib import import_module

from .base import Cloud

__all__ = ["CLOUDS", "PROVIDERS", "Cloud"]

# a provider is its module's name; read from the folder, so that none is imported to be listed
PROVIDERS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"))


class Clouds(Mapping[str, Cloud]):
    """Provider → its module's ``Cloud``, the module imported when first asked for: a head loads
    its own cloud's code alone, an ssh or Slurm head none (a host's Python may lack what a
    provider's module needs, and that failure would stop a head that never uses it)."""

    def __getitem__(self, name: str) -> Cloud:
        if name not in PROVIDERS:
            raise KeyError(name)
        module = import_module(f".{name}", __name__)
        return next(v for v in vars(module).values() if isinstance(v, Cloud))

    def __iter__(self) -> Iterator[str]:
        return iter(PROVIDERS)

    def __len__(self) -> int:
        return len(PROVIDERS)


CLOUDS = Clouds()
