"""REST handlers under ``<base_url>/gpugeek/``: what JupyterLab's status bar and sidebar call.

Every handler is an ``APIHandler`` behind ``@tornado.web.authenticated`` (403 without the server's
token); DELETE is also XSRF-checked by jupyter_server. A wrong request gets a status and a JSON
``{"message": ...}`` of one line — never a traceback; only a bug in here is a 500.
"""

from __future__ import annotations

import asyncio
import json

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from prometheus_client import CONTENT_TYPE_LATEST

from ..cluster.registry import NAME
from ..errors import GpugeekError
from ..guard import board

# the catalog's columns, named for the front end
OFFER_FIELDS = {"id": "offer_id", "provider": "provider", "instance_type": "instance_type", "gpu": "gpu",
                "variant": "variant", "gpu_count": "gpus", "gpu_mem_gib": "gpu_mem_gib",
                "region": "region", "pricing": "pricing", "price": "usd_per_hour",
                "price_per_gpu_hour": "usd_per_gpu_hour"}
MAX_OFFERS = 200


class _Handler(APIHandler):
    # jupyter_server's authorizer sees reads (GET) and writes (DELETE) of "gpugeek"
    auth_resource = "gpugeek"

    def reply(self, data: dict, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def fail(self, status: int, message: str) -> None:
        self.reply({"message": message}, status)


class ClustersHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    def get(self) -> None:
        board.catch_up(wait=False)       # a remote cluster's head asked in the background, never here
        self.reply(board.overview())


class ClusterHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    def get(self, name: str) -> None:
        if not NAME.fullmatch(name):
            return self.fail(404, f"no cluster named {name!r}")
        cluster_id = self.get_query_argument("id", None)
        if cluster_id is not None and not cluster_id.isdigit():
            return self.fail(400, f"id={cluster_id!r}: give the cluster's numeric id")
        try:
            board.catch_up(name, wait=False)
            self.reply(board.detail(name, cluster_id=int(cluster_id) if cluster_id else None))
        except board.NotFound as exc:
            self.fail(404, str(exc))

    @tornado.web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        if not NAME.fullmatch(name):
            return self.fail(404, f"no cluster named {name!r}")
        # stopping takes seconds (grace periods, `ray down` on clouds): off the event loop
        try:
            self.reply(await asyncio.to_thread(board.stop, name))
        except board.NotFound as exc:
            self.fail(404, str(exc))
        except GpugeekError as exc:   # already stopped, still starting, or stopping elsewhere
            self.fail(409, str(exc))


class OffersHandler(_Handler):
    @tornado.web.authenticated
    @authorized
    def get(self) -> None:
        from ..catalog import fresh, offers
        from ..errors import NoMatchingOffers

        dated = fresh.current().attrs()     # the prices' date and, when over a week old, a warning
        arg = self.get_query_argument
        try:
            limit = int(arg("limit", "20"))
            if not 1 <= limit <= MAX_OFFERS:
                raise ValueError
        except ValueError:
            return self.fail(400, f"limit={arg('limit')!r}: give a whole number from 1 to {MAX_OFFERS}")
        try:
            frame = offers.find_offers(gpu=arg("gpu", None) or None, count=arg("count", None) or None,
                                       provider=arg("provider", None) or None,
                                       region=arg("region", None) or None,
                                       residency=arg("residency", None) or None,
                                       pricing=arg("pricing", "on-demand"), top=limit)
        except NoMatchingOffers as exc:
            return self.reply({"offers": [], "count": 0, "message": str(exc), **dated})
        except GpugeekError as exc:
            return self.fail(400, str(exc))
        dated = {key: frame.attrs.get(key) for key in dated}      # of the offers shown
        dated["unknown_regions"] = frame.attrs.get("unknown_regions", [])   # left out by residency
        frame = frame[list(OFFER_FIELDS)].rename(columns=OFFER_FIELDS)
        rows = json.loads(frame.to_json(orient="records"))
        note = ("reserved prices are estimates: on-demand less the configured discount"
                if arg("pricing", "on-demand") == "reserved" else None)
        self.reply({"offers": rows, "count": len(rows), "note": note, **dated})


class MetricsHandler(_Handler):
    """Prometheus scrapes here, with the server's token (``Authorization: Bearer …`` or
    ``token …``); without one it gets 403 like every API call."""

    def update_api_activity(self) -> None:
        """A scrape every few seconds is not someone using the server: it must not keep an idle
        server from being culled."""

    @tornado.web.authenticated
    @authorized
    def get(self) -> None:
        from .metrics import scrape

        self.finish(scrape(), set_content_type=CONTENT_TYPE_LATEST)


def routes(base_url: str) -> list[tuple]:
    from jupyter_server.utils import url_path_join

    return [
        (url_path_join(base_url, "gpugeek", "clusters") + "/?", ClustersHandler),
        (url_path_join(base_url, "gpugeek", "clusters", "([^/]+)") + "/?", ClusterHandler),
        (url_path_join(base_url, "gpugeek", "offers"), OffersHandler),
        (url_path_join(base_url, "gpugeek", "metrics"), MetricsHandler),
    ]
