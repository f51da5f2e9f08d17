"""The keeper's process, started by the head's watchdog (``guard/keeping.py``):

    python -m gpugeek_jupyter.keeper.serve ORDER.json

ORDER names the head's GCS and address, the cluster's token file, the port to listen on (the
head's loopback alone: the laptop comes through its SSH tunnel — on a Slurm node the node's
address, where the tunnel from the login node reaches it, and the line takes no caller without the
cluster's token), the keeper's folder and the mirror the hosts install from.

It becomes a Ray driver of the cluster (the package on every node through Ray's ``py_modules``;
Ray's own log lines stay in Ray's logs, none reaches a cell), then serves the line. What a request's
handler prints goes to the cell that waits for it (``Said``), the rest into the keeper's log.
"""

from __future__ import annotations

import io
import json
import os
import platform
import signal
import sys
import threading
from pathlib import Path

from ..group.orphans import NAMESPACE
from ..line.messages import PROTOCOL, Hello, Welcome
from ..line.wire import Server, refusal
from ..versions import PACKAGE_VERSION, version_of
from .desk import Desk
from .shipped import Shipped


class Routed(io.TextIOBase):
    """``sys.stdout`` in the keeper: a handler's prints go to the kernel that asked (``say``), the
    rest to the log."""

    def __init__(self, log):
        self._log = log
        self._local = threading.local()

    def write(self, text: str) -> int:
        say = getattr(self._local, "say", None)
        if say is not None:
            say(text)
        else:
            self._log.write(text)
            self._log.flush()
        return len(text)

    def flush(self) -> None:
        self._log.flush()

    def on_behalf(self, caller, handle, request):
        self._local.say = caller.say
        try:
            return handle(request, caller)
        finally:
            self._local.say = None


def welcome(order: dict, hello: Hello):
    """The answer to a kernel's hello: this keeper's versions, or one line refusing another protocol."""
    import ray

    python = platform.python_version()
    refused = refusal(hello, PACKAGE_VERSION, python)
    if refused is not None:
        return refused
    print(f"keeper: kernel {hello.kernel} (gpugeek-jupyter {hello.package}, Python {hello.python}, Ray "
          f"{hello.ray}) is on the line", file=sys.stderr, flush=True)
    return Welcome(protocol=PROTOCOL, package=PACKAGE_VERSION, python=python, ray=ray.__version__,
                   torch=version_of("torch"), pid=os.getpid(), head=order["ip"])


def main(argv: list[str]) -> int:
    import ray

    order = json.loads(Path(argv[1]).read_text())
    home = Path(os.path.expanduser(order["home"]))
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    routed = Routed(sys.stdout)
    sys.stdout = routed
    token = Path(os.path.expanduser(order["token_path"])).read_text().strip()
    shipped = Shipped(home / "shipped")
    ray.init(address=order["gcs"], namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False,
             runtime_env=shipped.job_env())
    # the cluster's stop asks once: gone at once, not after Ray's own exit waits on a GCS that goes
    # too (what the keeper knows is on disk or the kernels', so nothing is lost)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    desk = Desk(order["gcs"], shipped, order.get("index_url"))
    where = order.get("host") or "127.0.0.1"
    server = Server((where, int(order["port"])), token, lambda hello: welcome(order, hello),
                    lambda request, caller: routed.on_behalf(caller, desk.handle, request),
                    log=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"keeper: serving the line at {where}:{server.address[1]} (pid {os.getpid()}, Python "
          f"{platform.python_version()}, Ray {ray.__version__})", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
