"""``ClusterPanel``: one cluster at a glance — nodes, GPUs, state, $ so far, $/h, budget gauge,
idle countdown — with scale and shut-down buttons. Shown by ``%gpugeek status``.

It refreshes itself every ``period`` seconds (≤ 2 s) from a background thread, reading the same
``status()`` the magic prints, so the panel and ``%gpugeek cost`` agree to the cent. The thread
reads only the ledger (the cluster's watchdog copies Ray's node table into it every few
seconds): a call into Ray from a second thread could hang on a head that is going away. Once the
cluster stops, every panel of it — older ones a newer panel took over from too — says so and
offers no button: a stopped cluster has nothing to scale or shut down.
"""

from __future__ import annotations

import html

import ipywidgets as w

from .. import api
from ..config import BUDGET_WARN_AT
from ..display import in_words
from ..units import duration
from ..vocab import ClusterPhase
from ._base import LivePanel, Refresher, bundle, lines_html

REFRESH_S = 2.0


class ClusterPanel(LivePanel):
    def __init__(self, name: str, *, period: float = REFRESH_S, start: bool = True):
        self.name = name
        self.header = w.HTML()
        self.money = w.HTML()
        self.gauge = w.FloatProgress(value=0, min=0, max=1, description="budget",
                                     layout=w.Layout(width="320px"))
        self.gauge_label = w.Label()
        self.idle = w.Label()
        self.nodes = w.HTML()
        self.workers = w.BoundedIntText(value=1, min=0, max=1000, description="workers",
                                        layout=w.Layout(width="160px"))
        self.scale_button = w.Button(description="Scale", icon="arrows-v")
        self.down_button = w.Button(description="Shut down", button_style="danger", icon="power-off")
        self.message = w.HTML()
        self._confirming = False
        self.scale_button.on_click(lambda _: self._act(self.scale))
        self.down_button.on_click(lambda _: self._act(self.shut_down))
        super().__init__([
            self.header, self.money, w.HBox([self.gauge, self.gauge_label]), self.idle, self.nodes,
            w.HBox([self.workers, self.scale_button, self.down_button]), self.message,
        ])
        self.add_class("gpugeek-cluster-panel")
        self.status = None
        self.refresh()
        self.refresher = Refresher(self.refresh, period, self._error, key=("cluster", name))
        self.refresher.on_superseded = self._say
        if start and self.status.state.live:
            self.refresher.start()

    # -- state ------------------------------------------------------------------------------------

    @property
    def live(self) -> bool:
        return self.status is not None and self.status.state not in (ClusterPhase.STOPPING, ClusterPhase.STOPPED)

    def refresh(self) -> bool:
        """Read the cluster's status once and show it; False once it has stopped (a cluster
        that is stopping is looked at again, so the panel ends on its final cost)."""
        first = self.status is None
        status = api.status(self.name, sync=first)     # later looks read the ledger only
        self.status = status
        sim = " <b style='color:#b35c00'>SIMULATED $</b>" if status.simulated else ""
        self.header.value = (f"<b>{html.escape(status.name)}</b> · {html.escape(status.backend)} · "
                             f"{html.escape(status.status)}{sim}")
        self.money.value = (f"<span class='gpugeek-spend'>${status.spent_usd:,.4f}</span> so far · "
                            f"${status.usd_per_hour:,.2f}/h · {len(status.nodes)} nodes · "
                            f"{status.gpus:g} GPUs" + (" declared" if status.simulated else ""))
        if status.budget_usd:
            used = status.spent_usd / status.budget_usd
            self.gauge.max, self.gauge.value = status.budget_usd, min(status.spent_usd, status.budget_usd)
            self.gauge.bar_style = ("danger" if used >= BUDGET_WARN_AT else
                                    "warning" if used >= BUDGET_WARN_AT / 2 else "success")
            left = status.budget_left_hours
            self.gauge_label.value = (f"{used:.0%} of ${status.budget_usd:,.2f}"
                                      + (f" · reached in {duration(left * 3600)}" if left else ""))
            self.gauge.layout.display = None
        else:
            self.gauge.layout.display = "none"
            self.gauge_label.value = "no budget cap"
        self.idle.value = self._idle_text(status)
        self.nodes.value = (in_words(status.nodes).to_html(index=False, classes="gpugeek-nodes")
                            if len(status.nodes) else "")
        workers = int((status.nodes["type"] != "head").sum()) if len(status.nodes) else 0
        if first:
            self.workers.value = workers
        for button in (self.scale_button, self.down_button, self.workers):
            button.disabled = not self.live
        if not self.live:
            self._confirming = False
            self.down_button.button_style = ""
            self.down_button.description = ("Stopped" if status.state is ClusterPhase.STOPPED
                                            else "Stopping…")
        return status.state.live

    @staticmethod
    def _idle_text(status) -> str:
        if not status.idle_minutes:
            return "no idle autostop"
        why = f" ({status.idle_why})" if status.idle_why else ""
        if status.idle_for_s is None:
            return f"autostop after {status.idle_minutes:g} min idle — busy now{why}"
        left = status.idle_minutes * 60 - status.idle_for_s
        return (f"idle for {duration(status.idle_for_s)}{why} — autostop in "
                f"{duration(max(0.0, left))}")

    # -- buttons ----------------------------------------------------------------------------------

    def scale(self) -> None:
        api.scale(int(self.workers.value), self.name)
        self._say(f"scaling to {self.workers.value} worker node(s)")

    def shut_down(self) -> None:
        """First click asks, second click stops the cluster (only the processes we started)."""
        if not self._confirming:
            self._confirming = True
            self.down_button.description = "Really shut down?"
            self._say("click again to stop the cluster and everything running on it")
            return
        self._confirming = False
        self.down_button.description = "Shut down"
        self._say("shutting down…")
        self.refresher.stop(wait=0)      # the click holds its lock: no refresh is in progress or can start
        api.down(self.name)
        self.refresh()
        self.refresher.end()             # the older panels of this cluster say stopped too
        self._say(f"stopped; final cost ${self.status.spent_usd:,.4f}"
                  + (" (simulated)" if self.status.simulated else ""))

    def _repr_mimebundle_(self, **kwargs) -> dict:
        lines = self.status.lines() if self.status else [self.name]
        return bundle("\n".join(lines), lines_html(lines), widget=self)
