"""What every widget here shares: one mimebundle with the widget, HTML and text, a figure
redrawn in place, a background refresher, and the panel base."""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from typing import ClassVar

import ipywidgets as w
import plotly.graph_objects as go

from ..display import WIDGET_MIME
from ..errors import GpugeekError


def widget_view(widget: w.Widget) -> dict:
    """The widget's own view bundle (not an override of ours): what a front end renders."""
    view = w.Widget._repr_mimebundle_(widget)
    return {WIDGET_MIME: view[WIDGET_MIME]} if view and WIDGET_MIME in view else {}


def bundle(text: str, html_text: str, widget: w.Widget | None = None) -> dict:
    """A widget's display bundle: the widget where a front end can show it, else HTML, else text."""
    return {"text/plain": text, "text/html": html_text, **(widget_view(widget) if widget is not None else {})}


def lines_html(lines: list[str]) -> str:
    return "<br>".join(html.escape(line) for line in lines)


class LiveFigure(w.Output):
    """A plotly figure that can be redrawn from any thread.

    Not a ``FigureWidget``: that one carries plotly.js (~5 MB) in every widget's state, which a
    live dashboard would send over the websocket and a saved notebook would keep, per figure.
    This shows the figure as a plain plotly output (rendered by plotly's JupyterLab renderer);
    a redraw replaces it with the new figure's JSON, a few kB.
    """

    def __init__(self, figure: go.Figure | None = None, **kwargs):
        super().__init__(**kwargs)
        self.figure: go.Figure | None = None
        self.redraws = 0
        if figure is not None:
            self.show(figure)

    def show(self, figure: go.Figure) -> None:
        self.figure = figure
        title = figure.layout.title.text or "plotly figure"
        self.show_json(figure_json(figure), html.unescape(str(title)).split("<br>")[0])

    def show_json(self, spec: dict, text: str) -> None:
        """Show a figure given as plotly JSON (``data`` + ``layout``): no figure object is built,
        which keeps a redraw in the kernel to about a millisecond."""
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {"application/vnd.plotly.v1+json": spec, "text/plain": text}},)
        self.redraws += 1


def figure_json(figure: go.Figure) -> dict:
    """The figure as strict JSON (NaN → null), as plotly's renderer and the comm need it."""
    return json.loads(figure.to_json())


class Refresher:
    """Calls ``refresh()`` every ``period`` seconds on a daemon thread, so the kernel stays free.

    ``refresh`` returns False to stop (the cluster stopped). An exception is reported through
    ``on_error`` as one line and the next tick goes on. One refresher runs per ``key`` (a kind of
    panel and its cluster): showing the panel again (a re-run cell, or ``status`` after ``up``)
    stops the older one, so threads never pile up. The newer one keeps the older panels as
    ``followers`` and refreshes each once more when it ends (the cluster stopped), so no panel
    of a stopped cluster still reads as running. ``lock`` is held around each refresh; the
    panel's buttons take it too.
    """

    _running: ClassVar[dict[tuple, Refresher]] = {}
    _registry_lock = threading.Lock()
    MAX_FOLLOWERS = 8            # the newest superseded panels (cleared outputs are never closed)

    def __init__(self, refresh: Callable[[], bool], period: float, on_error: Callable[[str], None],
                 key: tuple | None = None):
        self.refresh, self.period, self.on_error, self.key = refresh, period, on_error, key
        self.on_superseded: Callable[[str], None] | None = None
        self.followers: list[Refresher] = []     # superseded refreshers of the same key
        self.closed = False                      # its panel was closed: nothing to draw on
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gpugeek-refresh", daemon=True)

    def start(self) -> Refresher:
        if self.key is not None:
            with Refresher._registry_lock:
                older = Refresher._running.get(self.key)
                Refresher._running[self.key] = self
                if older is not None:     # handed over before it stops: its loop ends nobody
                    self.followers = [*older.followers, older][-self.MAX_FOLLOWERS:]
                    older.followers = []
            if older is not None:
                older.stop()
                if older.on_superseded:
                    older.on_superseded("a newer panel of this cluster is the live one")
        self.thread.start()
        return self

    def stop(self, wait: float = 5.0) -> None:
        """Stop, and wait for a refresh in progress, so nothing is drawn after this returns."""
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(wait)
        with Refresher._registry_lock:
            if Refresher._running.get(self.key) is self:
                del Refresher._running[self.key]

    def end(self) -> None:
        """Refresh the superseded panels one last time (the cluster stopped): each draws its
        final state. Called from the loop when ``refresh`` says stop, and by a panel that stopped
        the cluster itself."""
        with Refresher._registry_lock:
            followers, self.followers = self.followers, []
        for older in followers:
            if older.closed:
                continue
            try:
                with older.lock:
                    older.refresh()
            except Exception as exc:  # noqa: BLE001 - one panel's failure must not keep the others stale
                older.on_error(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and not self._stop.is_set()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):      # the full period after each refresh
            try:
                with self.lock:
                    if self._stop.is_set():
                        return
                    if self.refresh() is False:
                        break
            except Exception as exc:  # noqa: BLE001 - a panel must outlive one failed look
                self.on_error(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
        else:
            return      # stopped from outside: a newer panel took over, or a button ends them itself
        self.end()      # the cluster stopped


class LivePanel(w.VBox):
    """A panel kept current by a ``Refresher``, with one message line for what its buttons did."""

    refresher: Refresher

    def _act(self, action) -> None:
        """Run a button's action with the refresh paused; a bad input is one line, not a traceback."""
        try:
            with self.refresher.lock:
                action()
        except GpugeekError as exc:
            self._error(str(exc))

    def _say(self, text: str) -> None:
        self.message.value = html.escape(text)

    def _error(self, text: str) -> None:
        self.message.value = f"<span style='color:firebrick'>{html.escape(text)}</span>"

    def close(self) -> None:
        self.refresher.closed = True
        self.refresher.stop()
        super().close()
