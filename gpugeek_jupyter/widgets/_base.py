"""What every widget here shares: knowing when a widget can be shown, one mimebundle with a
widget, HTML and text, a background refresher, and replacing a live figure's content."""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable

import ipywidgets as w
import plotly.graph_objects as go

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def in_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, VS Code, nbclient): there widgets can render.
    In plain IPython or a script there is no front end, so only HTML and text are produced."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def bundle(text: str, html_text: str, widget=None) -> dict:
    """A display bundle: the widget where a front end can show it, else HTML, else text."""
    data = {"text/plain": text, "text/html": html_text}
    if widget is not None:
        import ipywidgets

        view = ipywidgets.Widget._repr_mimebundle_(widget)   # the view itself, not our override
        if WIDGET_MIME in view:
            data[WIDGET_MIME] = view[WIDGET_MIME]
    return data


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
        self.outputs = ({"output_type": "display_data", "metadata": {},
                         "data": {"application/vnd.plotly.v1+json": figure_json(figure),
                                  "text/plain": html.unescape(str(title)).split("<br>")[0]}},)
        self.redraws += 1


def figure_json(figure: go.Figure) -> dict:
    """The figure as strict JSON (NaN → null), as plotly's renderer and the comm need it."""
    return json.loads(figure.to_json())


class Refresher:
    """Calls ``refresh()`` every ``period`` seconds on a daemon thread, so the kernel stays free.

    ``refresh`` returns False to stop (the cluster stopped). An exception is reported through
    ``on_error`` as one line and the next tick goes on.
    """

    def __init__(self, refresh: Callable[[], bool], period: float, on_error: Callable[[str], None]):
        self.refresh, self.period, self.on_error = refresh, period, on_error
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gpugeek-refresh", daemon=True)

    def start(self) -> Refresher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and not self._stop.is_set()

    def _loop(self) -> None:
        while not self._stop.wait(self.period):      # the full period after each refresh
            try:
                if self.refresh() is False:
                    return
            except Exception as exc:  # noqa: BLE001 - a panel must outlive one failed look
                self.on_error(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
