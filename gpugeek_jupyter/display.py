"""How results show themselves: a live widget where a notebook front end can render one, else
HTML, else text — one bundle, as Ray's ``repr_with_fallback`` does.

Data objects (a cluster's status, a cost report) build their text and HTML and ask this module
for the rest; they never import widgets. The notebook layer (``widgets/``) registers what to
show for each kind of object when the extension loads in a kernel. Nothing here imports anything:
every layer may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# a kind of object (its class, or a protocol class) → what makes its view
_views: dict[type, Callable[[Any], Any]] = {}


def in_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, VS Code, nbclient): there widgets can render.
    In plain IPython or a script there is no front end, so only HTML and text are produced."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def kernel_name() -> str | None:
    """"kernel 3f2a9c1e" — the Jupyter kernel's id, from its connection file — or None outside one."""
    if not in_kernel():
        return None
    try:
        from ipykernel import get_connection_file

        stem = get_connection_file().rsplit("/", 1)[-1].removesuffix(".json")
    except Exception:  # noqa: BLE001 - a kernel without a connection file: its process still names it
        return "kernel"
    return f"kernel {stem.removeprefix('kernel-')[:8]}"


def register(kind: type, make: Callable[[Any], Any]) -> None:
    """Show objects of ``kind`` with ``make(obj)``. For a data type, ``make`` returns the widget
    view's mimebundle; for a protocol (the job monitor), it is the factory callers ask for."""
    _views[kind] = make


def view_maker(kind: type) -> Callable[[Any], Any] | None:
    """What was registered for ``kind`` (or a base of it), only where a front end can show it."""
    if not in_kernel():
        return None
    for klass in getattr(kind, "__mro__", (kind,)):
        if klass in _views:
            return _views[klass]
    return None


def bundle(obj: object, text: str, html: str) -> dict:
    """``obj``'s display bundle: its widget where one is registered and can show, plus HTML and
    text for every other front end (nbconvert, a saved notebook, plain IPython)."""
    data = {"text/plain": text, "text/html": html}
    make = view_maker(type(obj))
    if make is not None:
        view: Mapping = make(obj)
        if WIDGET_MIME in view:
            data[WIDGET_MIME] = view[WIDGET_MIME]
    return data


# a table's columns as a person reads them; the frames themselves keep their names for code
COLUMN_WORDS = {
    "node_id": "node", "node_type": "node type", "offer_id": "offer", "gpus": "GPUs",
    "usd_per_hour": "$/h", "up_for": "up for", "usd": "$", "on_demand_usd": "$ at on-demand",
    "spot_saved_usd": "spot saved $", "end_reason": "ended because", "job_id": "job",
    "idle_usd": "idle $", "sampled_hours": "sampled hours", "idle_hours": "idle hours",
}
WHOLE = ("gpus", "workers", "nodes")     # counts: 8, not 8.0


def in_words(frame):
    """``frame`` (a pandas DataFrame) for showing: columns titled in words, counts as whole
    numbers (an unknown one stays blank)."""
    shown = frame.copy()
    for column in WHOLE:
        if column in shown:
            shown[column] = [f"{float(v):g}" if v == v and v is not None else "" for v in shown[column]]
    return shown.rename(columns=COLUMN_WORDS)
