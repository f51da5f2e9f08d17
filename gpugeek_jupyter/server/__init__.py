"""The jupyter_server extension: a small REST API over the cluster registry and ledger.

Enabled by the wheel's ``jupyter_server_config.d/gpugeek_jupyter.json``; JupyterLab's status bar
and sidebar (``labextension/``) read it. See ``handlers`` for the routes.

Runs on: the Jupyter server.
May import: `guard/`, `cluster/`, `meter/`, `catalog/`, the ground floor — never `kernel/`.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpugeek_jupyter.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from ..meter import ledger
    from .handlers import routes

    ledger.acting_as("Jupyter server")     # the events it writes: a shut down from the sidebar
    web_app = serverapp.web_app
    web_app.add_handlers(".*$", routes(web_app.settings["base_url"]))
    serverapp.log.info("gpugeek_jupyter: REST API at %sgpugeek/", web_app.settings["base_url"])
