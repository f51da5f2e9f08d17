"""``CostDashboard``: where a cluster's dollars went — shown by ``%gpugeek cost``.

Cumulative $ by node type and pricing (with the spot saving), spend projected against the
budget, GPU utilisation with the idle $, and the cost table grouped as chosen. Everything is
redrawn from ``cost()`` — the ledger — every ``period`` seconds while the cluster lives. A cluster
with no $ to chart (free: every node at $0/h) gets one line instead of the two spend charts.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as w

from .. import api
from ..display import in_words
from ..views.cost import spend_note
from ..vocab import CostGrouping
from ._base import LiveFigure, LivePanel, Refresher, bundle

REFRESH_S = 5.0


class CostDashboard(LivePanel):
    def __init__(self, name: str, *, by: str = "node", report=None, period: float = REFRESH_S,
                 start: bool = True):
        self.name = name
        self.summary = w.HTML()
        self.by = w.ToggleButtons(options=[(v.replace("_", " "), v) for v in CostGrouping.values()], value=by,
                                  description="cost by", style={"button_width": "90px", "description_width": "initial"})
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.table = w.HTML()
        self.cost, self.budget, self.utilisation = LiveFigure(), LiveFigure(), LiveFigure()
        self.free = w.HTML()           # instead of the spend charts when there is no $ to chart
        self.message = w.HTML()
        self.by.observe(lambda _: self._safe_refresh(), names="value")
        self.refresh_button.on_click(lambda _: self._safe_refresh())
        super().__init__([self.summary, w.HBox([self.by, self.refresh_button]), self.table,
                          self.free, self.cost, self.budget, self.utilisation, self.message])
        self.add_class("gpugeek-cost-dashboard")
        self.report = None
        self.refresh(report)
        self.refresher = Refresher(self.refresh, period, self._error, key=("cost", name))
        self.refresher.on_superseded = self._say
        if start and self.report.live:
            self.refresher.start()

    def refresh(self, report=None) -> bool:
        """Redraw from the ledger; False once the cluster has stopped (nothing more to add)."""
        if report is None or report.by != self.by.value:     # the thread reads the ledger only
            report = api.cost(self.name, by=self.by.value, sync=threading.current_thread() is threading.main_thread())
        self.report = report
        self.summary.value = f"<b>{html.escape(report.summary())}</b>"
        self.table.value = in_words(report.table).to_html(index=False, float_format=lambda x: f"{x:,.4f}",
                                                classes="gpugeek-cost-table")
        note = spend_note(report.figure)
        self.free.value = f"<span class='gpugeek-free'>{html.escape(note)}</span>" if note else ""
        self.free.layout.display = None if note else "none"
        for figure, shown in ((self.cost, report.figure), (self.budget, report.budget_figure)):
            figure.layout.display = "none" if note else None
            if not note:
                figure.show(shown)
        self.utilisation.show(report.utilisation_figure)
        return report.live

    def _safe_refresh(self) -> None:
        self._act(self.refresh)        # not at the same time as the thread's refresh

    def _repr_mimebundle_(self, **kwargs) -> dict:
        return bundle(repr(self.report), self.report._repr_html_(), widget=self)
