"""gpugeek-jupyter: price → plan → provision → run → meter → view, from a notebook.

``%load_ext gpugeek_jupyter`` registers ``%gpugeek``; the same steps are plain functions here.
Importing the package loads none of its layers (only ``lean``, which keeps a slow optional
import out of the kernel's ``import ray``): a Ray worker, the watchdog and the Jupyter
server import only the modules they use, and ``gpugeek_jupyter.up`` (say) loads the API on first
use. This is also where the notebook layer plugs itself in: in a kernel, the first use of the
API (or ``%load_ext``) registers the widgets that the API's results show as.
"""

from __future__ import annotations

from .lean import leave_out_slow_optional_imports

leave_out_slow_optional_imports()       # before anything imports Ray: seconds of CPU no kernel needs

API = ("Advice", "Check", "Cluster", "ClusterStatus", "CostReport", "DoctorReport", "LaunchConfig", "Plan", "advise",
       "attach", "backend_features", "check", "clusters", "cost", "doctor", "down", "fetch", "jobs", "limits", "log",
       "offers", "plan", "preempt",
       "price_performance", "reset", "run", "scale", "status", "torchrun", "up", "update_catalog")
WIDGETS = ("ClusterPanel", "CostDashboard", "JobMonitor", "OfferPicker")

__all__ = [*API, *WIDGETS, "GpugeekError", "load_ipython_extension"]


def __getattr__(name: str):
    """The API and the widgets load on first use."""
    if name == "__version__":
        from .versions import PACKAGE_VERSION as value
    elif name == "GpugeekError":
        from .errors import GpugeekError as value
    elif name in API:
        from . import api

        _plug_in_widgets()
        value = getattr(api, name)
    elif name in WIDGETS:
        from . import widgets

        value = getattr(widgets, name)
    else:
        raise AttributeError(f"module 'gpugeek_jupyter' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _plug_in_widgets() -> None:
    """In a kernel, the API's results show as live widgets (a script never loads ipywidgets), and
    the events it writes name the kernel."""
    from .display import in_kernel

    if in_kernel():
        from .widgets import register

        register()
        _name_the_kernel()


def _name_the_kernel() -> None:
    from .display import kernel_name
    from .meter import ledger

    ledger.acting_as(kernel_name() or "IPython")


def load_ipython_extension(ipython) -> None:
    """``%load_ext gpugeek_jupyter``: the magic and the widgets (each result still shows as HTML
    and text where no front end can render a widget); and after every cell the node samplers'
    reports go to the ledger (so time between cells — idle GPUs — is recorded too)."""
    from .magics import GpugeekMagics, drain_telemetry
    from .widgets import register

    register()
    _name_the_kernel()
    ipython.register_magics(GpugeekMagics)
    if drain_telemetry not in ipython.events.callbacks["post_execute"]:
        ipython.events.register("post_execute", drain_telemetry)


def _jupyter_server_extension_points() -> list[dict]:
    """The REST API under ``/gpugeek/`` that JupyterLab's status bar and sidebar read."""
    return [{"module": "gpugeek_jupyter.server"}]


def _jupyter_labextension_paths() -> list[dict]:
    """For ``jupyter labextension develop``: the built front end, next to this package."""
    return [{"src": "labextension", "dest": "gpugeek-jupyter"}]
