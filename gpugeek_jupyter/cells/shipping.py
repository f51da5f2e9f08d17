"""The kernel's modules on a remote cluster's workers, before a cell runs there: what the cell
imports (a script's modules beside it too) looked up (``kernel/environment.py``) and those the
workers lack sent — to the keeper, which gives them to the next group, or with the job, connected
anew (a Ray Client's).
"""

from __future__ import annotations

from ..cluster.registry import ClusterRecord
from ..errors import GpugeekError
from ..kernel import connection, environment
from ..kernel.session import current
from ..line.messages import Ship
from .driving import driver


def bring_modules(record: ClusterRecord, group, source: str, push: dict | None, script_dir: str | None) -> bool:
    """The kernel's modules this cell imports, on every worker of a remote cluster at the kernel's
    versions (``kernel/environment.py``) — a script's, those beside it too: those some worker lacks
    are sent — to the keeper, which gives them to the next group (a remote cluster's), or with the
    job, connected anew (a Ray Client's) — and the group starts afresh (True)."""
    session = current()
    if session.connection is None or not session.connection.remote:
        return False    # a local or sim cluster runs in this very environment
    names = environment.imports(source) | environment.pushed_modules(push)
    try:
        with environment.first_on_path(script_dir):
            names |= environment.beside(script_dir, source) if script_dir else set()
            missing = environment.needed(record.id, names, group.versions) if names else []
    except environment.CannotGo:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure refuses the cell: run on, it could run other code
        cause = exc if isinstance(exc, GpugeekError) else f"{type(exc).__name__}: {exc}"
        raise GpugeekError(f"could not check that the workers have this kernel's versions of "
                           f"{', '.join(sorted(names))} ({cause}) — the cell was not run, as the workers might "
                           f"run other versions of them; run it again, or `%gpugeek reset` first") from None
    if not missing:
        return False
    environment.shipment().shipped.update({m.name: m for m in missing})
    what = ", ".join(m.describe() for m in missing)
    lost = " — the worker group starts afresh (variables defined on it are gone)" if group.cells else ""
    try:
        if session.line is not None:
            shipped = environment.packed(missing)      # a module that cannot travel: said before anything stops
            print(f"note: sending {what} to the workers (they do not have this kernel's version){lost}", flush=True)
            driver().ask(Ship(modules=shipped))
            session.group.stop()
            session.group = None
            return True
        connection.job_env(record, remote=True)      # a module that cannot travel: said before anything stops
        print(f"note: sending {what} to the workers (they do not have this kernel's version); connecting "
              f"again with it{lost}", flush=True)
        connection.reconnect(record)
    except Exception as exc:  # noqa: BLE001 - said in one line; the connection is made without them
        environment.forget(missing)
        if session.connection is None:
            connection.connect(record)
        cause = exc if isinstance(exc, GpugeekError) else f"{type(exc).__name__}: {exc}"
        raise GpugeekError(f"could not send {what} to the workers ({cause}) — install it on the hosts, or "
                           f"list it in `%gpugeek up … --env requirements.txt`") from None
    return True
