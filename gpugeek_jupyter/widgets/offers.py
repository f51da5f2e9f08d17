"""``OfferPicker``: filter the GPU offers and see the table and price–performance chart follow;
"Plan" sizes a model against the filtered offers, "Provision" starts a cluster on the chosen one.

Every control calls the same API functions as the magics (``offers``, ``plan``, ``up``).
"""

from __future__ import annotations

import html

import ipywidgets as w
from IPython.display import display

from .. import api
from ..catalog.gpus import families
from ..catalog.offers import load_catalog
from ..catalog.residency import JURISDICTIONS, countries_in
from ..errors import GpugeekError
from ..views.pricing import dated_caption, price_performance
from ..vocab import Pricing, Strategy
from ._base import LiveFigure, bundle

ANY = "any"
SHOWN = 15
BACKENDS = ((f"{api.REHEARSE} — rehearse on this machine (simulated $)", api.REHEARSE),
            ("the offer's cloud — dry run (show the config)", "cloud-dry-run"),
            ("the offer's cloud — launch (costs money)", "cloud"))


class OfferPicker(w.VBox):
    def __init__(self, *, gpu: str | None = None, count: int | None = None, min_gpu_mem: float | None = None,
                 provider: str | None = None, pricing: str = "on-demand", max_price: float | None = None,
                 catalog: str | None = None, params: str = "1B", residency: str | None = None):
        self.catalog = catalog
        everything = load_catalog(catalog)
        counts = sorted(int(c) for c in everything["gpu_count"].unique())
        if gpu and gpu not in families():
            raise GpugeekError(f"--gpu {gpu!r}: the picker starts from one GPU family, like "
                               f"{', '.join(families()[:6])} — or none")
        if count is not None and str(count).strip() not in {str(c) for c in counts}:
            raise GpugeekError(f"--count {count!r} is not in the picker — give one of {', '.join(map(str, counts))}")
        self.gpu = w.Dropdown(options=[ANY, *families()], value=gpu or ANY, description="GPU")
        self.count = w.Dropdown(options=[ANY, *counts], value=int(count) if count else ANY,
                                description="GPUs/node")
        self.min_mem = w.BoundedFloatText(value=min_gpu_mem or 0, min=0, max=1024, step=8,
                                          description="min GiB/GPU")
        self.provider = w.Dropdown(options=[ANY, *sorted(everything["provider"].unique())],
                                   value=provider or ANY, description="provider")
        self.pricing = w.ToggleButtons(options=Pricing.values(), value=Pricing.parse(pricing, "--pricing").value,
                                       description="pricing", style={"button_width": "90px"})
        self.max_price = w.BoundedFloatText(value=max_price or 0, min=0, max=1e4, step=1,
                                            description="max $/h", tooltip="0: no limit")
        places = [ANY, *JURISDICTIONS]
        if residency and residency.upper() not in places:
            countries_in(residency)                       # one line if it is no jurisdiction at all
            places.append(residency.upper())
        self.residency = w.Dropdown(options=places, value=residency.upper() if residency else ANY,
                                    description="residency", tooltip="only offers in this jurisdiction")
        self.count_label = w.HTML()
        self.table = w.HTML()
        self.chart = LiveFigure()
        self.choice = w.Dropdown(description="offer", layout=w.Layout(width="640px"))
        self.params = w.Text(value=params, description="model size", tooltip="parameters, like 7B or 350M")
        self.plan_button = w.Button(description="Plan", icon="calculator")
        self.backend = w.Dropdown(options=BACKENDS, value=api.REHEARSE, description="on",
                                  layout=w.Layout(width="420px"))
        self.workers = w.BoundedIntText(value=1, min=1, max=64, description="nodes",
                                        layout=w.Layout(width="160px"))
        self.budget = w.BoundedFloatText(value=0, min=0, max=1e6, step=10, description="budget $",
                                         tooltip="0: no cap", layout=w.Layout(width="180px"))
        self.idle = w.BoundedFloatText(value=0, min=0, max=1e4, step=5, description="idle min",
                                       tooltip="0: no idle autostop", layout=w.Layout(width="180px"))
        self.provision_button = w.Button(description="Provision", button_style="primary", icon="play")
        self.output = w.Output()
        self.message = w.HTML()
        for control in (self.gpu, self.count, self.min_mem, self.provider, self.pricing, self.max_price,
                        self.residency):
            control.observe(lambda _: self.requery(), names="value")
        self.plan_button.on_click(lambda _: self._act(self.plan))
        self.provision_button.on_click(lambda _: self._act(self.provision))
        super().__init__([
            w.HBox([self.gpu, self.count, self.min_mem]),
            w.HBox([self.provider, self.max_price, self.residency]),
            self.pricing, self.count_label, self.table, self.chart, self.choice,
            w.HBox([self.params, self.plan_button]),
            w.HBox([self.backend, self.workers, self.budget, self.idle, self.provision_button]),
            self.message, self.output,
        ])
        self.add_class("gpugeek-offer-picker")
        self.offers = None
        self._confirming = False
        self.shown = None               # what a button gave back last (a Plan, a Cluster)
        self.queries = 0
        self.requery()

    def filters(self) -> dict:
        """The filters as ``offers()`` takes them."""
        return {
            "gpu": None if self.gpu.value == ANY else self.gpu.value,
            "count": None if self.count.value == ANY else int(self.count.value),
            "min_gpu_mem": self.min_mem.value or None,
            "provider": None if self.provider.value == ANY else self.provider.value,
            "pricing": self.pricing.value,
            "max_price": self.max_price.value or None,
            "catalog": self.catalog,
            "residency": None if self.residency.value == ANY else self.residency.value,
        }

    def requery(self) -> None:
        """Ask the catalog again with the current filters; table, chart and choices follow."""
        self.queries += 1
        try:
            frame = api.offers(**self.filters())
        except GpugeekError as exc:        # nothing matches: say why, keep the last view
            self._say(str(exc), error=True)
            self.offers = None
            self.choice.options = []
            return
        self.offers = frame
        self._say("")
        label = f"{len(frame)} offers, cheapest first by {self.pricing.value} $/h"
        if caption := dated_caption(frame):          # the prices' date; orange once over a week old
            colour = "darkorange" if frame.attrs.get("stale_warning") else "gray"
            label += f" · <span style='color:{colour}'>{html.escape(caption)}</span>"
        if note := frame.attrs.get("residency_note"):
            label += f" · {html.escape(note)}"
        self.count_label.value = label
        shown = frame.head(SHOWN)[["id", "gpu", "gpu_count", "gpu_mem_gib", "price", "price_per_gpu_hour",
                                   "peak_tflops", "up_with"]]
        self.table.value = shown.to_html(index=False, float_format=lambda x: f"{x:,.2f}",
                                         classes="gpugeek-offers")
        self.chart.show(price_performance(frame))
        said = (api.RENT_THERE, api.YOUR_IMAGE)      # what to know before choosing it
        choices = [(f"{r.id} — ${r.price:,.2f}/h" + (f" — {r.up_with}" if r.up_with.endswith(said) else ""),
                    r.id) for r in frame.head(100).itertuples()]
        self.choice.options = choices
        self.choice.value = choices[0][1]        # the cheapest, whatever was chosen before

    def plan(self):
        """Size a model of ``model size`` parameters against the filtered offers (sharded with
        FSDP over the chosen GPUs per node, if any)."""
        f = self.filters()
        result = api.plan(params=self.params.value, gpu=f["gpu"], provider=f["provider"], gpus=f["count"],
                      strategy=Strategy.FSDP if f["count"] and f["count"] > 1 else Strategy.DDP,
                      pricing=f["pricing"], catalog=f["catalog"], residency=f["residency"])
        self._show(result)
        return result

    def provision(self):
        """Start a cluster on the chosen offer: a sim rehearsal, a dry run, or the real cloud; for
        an offer no backend rents, the command that starts one on the box once rented there."""
        if not self.choice.value:
            raise GpugeekError("no offer chosen — widen the filters")
        offer = self.choice.value
        kind = self.backend.value
        row = self.offers.set_index("id").loc[offer]
        if kind == api.REHEARSE:
            backend = api.REHEARSE
        elif row["up_with"] == api.RENT_THERE:      # RunPod, Lambda, Vast…: rent it there, then ssh
            self._say(api.way_in(offer, row["provider"], pricing=self.pricing.value, price=row["price"],
                                     budget=self.budget.value or None, idle=self.idle.value or None))
            return None
        else:
            backend = row["up_with"].removesuffix(api.YOUR_IMAGE)     # up says what to do where it needs one
        if kind == "cloud":
            if not (self.budget.value or self.idle.value):
                raise GpugeekError("a cloud cluster bills until stopped — set a budget or idle minutes first")
            if not self._confirming:
                self._confirming = True
                self.provision_button.description = "Really launch?"
                self._say(f"click again to launch on {backend} — this costs real money "
                          f"(budget ${self.budget.value:,.2f}, idle stop {self.idle.value:g} min; 0 = none)")
                return None
        self._confirming = False
        self.provision_button.description = "Provision"
        self._say(f"starting {backend} cluster on {offer} …")
        cluster = api.up(backend=backend, offer=offer, workers=int(self.workers.value),
                     pricing=self.pricing.value, budget=self.budget.value or None,
                     idle=self.idle.value or None, dry_run=kind == "cloud-dry-run", yes=kind == "cloud",
                     catalog=self.catalog, residency=self.filters()["residency"])
        self._say("")
        self._show(cluster)
        return cluster

    def _act(self, action) -> None:
        try:
            action()
        except GpugeekError as exc:
            self._say(str(exc), error=True)

    def _show(self, thing) -> None:
        self.shown = thing
        self.output.clear_output()
        with self.output:
            display(thing)

    def _say(self, text: str, error: bool = False) -> None:
        style = " style='color:firebrick'" if error else ""
        self.message.value = f"<span{style}>{html.escape(text)}</span>" if text else ""

    def _repr_mimebundle_(self, **kwargs) -> dict:
        frame = self.offers
        text = (f"{len(frame)} offers\n{frame.head(SHOWN).to_string(index=False)}" if frame is not None
                else "no offers match")
        html_text = frame.head(SHOWN).to_html(index=False) if frame is not None else "no offers match"
        return bundle(text, html_text, widget=self)
