"""``gpugeek up``: ``%gpugeek up`` from a terminal, with the same flags, read by the magic's own
parser, and the same API call — a process of its own (``cli.py`` hands it the rest of its line),
which connects to the cluster as a kernel would and ends once it is up; the cluster and its
watchdog outlive it.

    python -m gpugeek_jupyter.magics.terminal [NAME] [FLAGS]
"""

from __future__ import annotations

import sys

from IPython.core.error import UsageError

from .. import api
from ..errors import GpugeekError
from . import up


def main(argv: list[str]) -> int:
    parser = up.parser
    parser.prog = "gpugeek up"
    if {"-h", "--help"} & set(argv):
        print(parser.format_help().removeprefix("::").strip().replace("%gpugeek up", "gpugeek up", 1))
        return 0
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(2, f"up: {exc}")
    if args.plan:
        return _fail(2, "up: --plan names a plan kept in a notebook — from a terminal, give --gpu or --offer")
    flags = {k: v for k, v in vars(args).items() if k not in ("name", "plan", "no_install")}
    try:
        cluster = api.up(args.name, install=not args.no_install, **flags)
    except GpugeekError as exc:
        return _fail(1, str(exc))
    print(cluster)
    return 0


def _fail(status: int, message: str) -> int:
    print(f"gpugeek: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
