"""``gpugeek``: list, price and stop clusters from a terminal — no Jupyter, no kernel needed.

When JupyterLab is gone (a crashed server, a closed laptop, a colleague's shell), the clusters it
started may still be billing. This reads the same registry and ledger as the Lab sidebar
(``guard/board.py``: SQLite; no pandas, Ray, IPython or Jupyter on its path) and stops a
cluster the way the sidebar does, by the processes we started. ``gpugeek clusters`` answers in
a fraction of a second (``benchmarks/bench_cli.py``).

    gpugeek up [NAME] [--backend slurm --login … | --hosts … | …]   (the flags of ``%gpugeek up``)
    gpugeek clusters [--json]
    gpugeek status NAME [--json]
    gpugeek cost [NAME] [--json]
    gpugeek down NAME [--forget] | --all [--yes]
    gpugeek log [NAME] [--since 2h] [--json]
    gpugeek check [WAY …] [--region R] [--login USER@HOST] [--hosts …] [--ssh-key KEY]

A bad argument gets one line and exit status 2; a stop that fails, 1; a ``check`` that finds a
way not ready, 1. ``up`` becomes a process
of its own (``magics/terminal.py``) that parses with ``%gpugeek up``'s own declaration and calls
the API as a kernel does: the cluster it starts outlives it, as one started from a notebook
outlives its kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .errors import GpugeekError
from .units import duration, parse_duration

BY = "the terminal"     # who stopped it, in the stop reason: "down (from the terminal)"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (and exit 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} — see `{self.prog} --help`\n")


class _Version(argparse.Action):
    """The installed version, read only when asked (the package root is not imported here)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import version

        parser.exit(0, f"gpugeek-jupyter {version('gpugeek-jupyter')}\n")


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="gpugeek", description="List, price and stop gpugeek clusters without Jupyter.")
    top.add_argument("--version", action=_Version, nargs=0, help="print the installed version")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("up", add_help=False, prefix_chars="\0",
                        help="start a cluster, or re-attach to a live one: `%%gpugeek up`'s flags "
                             "(`gpugeek up --help` lists them)").add_argument("flags", nargs=argparse.REMAINDER)
    each = commands.add_parser("clusters", help="the live clusters, then the latest stopped ones")
    each.add_argument("--json", action="store_true", help="print JSON")
    one = commands.add_parser("status", help="one cluster: its nodes, utilisation and latest events")
    one.add_argument("name", metavar="NAME", help="the cluster's name")
    one.add_argument("--json", action="store_true", help="print JSON")
    cost = commands.add_parser("cost", help="what every cluster run cost (or every run of NAME, by node)")
    cost.add_argument("name", metavar="NAME", nargs="?", help="one cluster's runs, by node (default: every cluster)")
    cost.add_argument("--json", action="store_true", help="print JSON")
    down = commands.add_parser("down", help="stop a cluster (only the processes we started), or --all")
    down.add_argument("name", metavar="NAME", nargs="?", help="the cluster to stop")
    down.add_argument("--all", action="store_true", help="stop every live cluster")
    down.add_argument("--yes", action="store_true", help="do not ask before stopping them all")
    down.add_argument("--forget", action="store_true",
                      help="close the record of a remote cluster whose machines are gone (its nodes end when "
                           "it was last heard from)")
    log = commands.add_parser("log", help="the ledger's events, oldest first")
    log.add_argument("name", metavar="NAME", nargs="?", help="one cluster's events (default: every cluster's)")
    log.add_argument("--since", metavar="SPAN", help="only the last SPAN: 90s, 30m, 2h, 7d")
    log.add_argument("--json", action="store_true", help="print JSON")
    ready = commands.add_parser("check", help="whether each way to get machines is ready (launches nothing)")
    ready.add_argument("ways", metavar="WAY", nargs="*",
                       help="the backends to look at: aws, slurm, … (default: every one with something to look at)")
    ready.add_argument("--region", help="aws: the region to look in (default: AWS_DEFAULT_REGION or your profile's)")
    ready.add_argument("--login", help="slurm: the login node to look at, [USER@]HOST[:PORT]")
    ready.add_argument("--hosts", help="ssh: your machines to look at, comma-separated [USER@]HOST[:PORT]")
    ready.add_argument("--ssh-key", help="the private key for --login and --hosts")
    return top


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args.flags)
    if args.command == "check":
        return _check(args)
    from .guard import board
    from .meter import ledger

    ledger.acting_as("terminal")
    try:
        if args.command == "down":
            if bool(args.name) == args.all:
                parser.error("down: name one cluster, or give --all")
            if args.forget:
                if args.all:
                    parser.error("down --forget: name the one cluster whose machines are gone")
                print(board.forget(args.name, by=BY)["message"])
                return 0
            return _down_all(board, args.yes) if args.all else _down(board, args.name)
        return {"clusters": _clusters, "status": _status, "cost": _cost, "log": _log}[args.command](board, args)
    except board.NotFound as exc:
        return _fail(2, str(exc))
    except GpugeekError as exc:
        return _fail(1, str(exc))
    except BrokenPipeError:          # `gpugeek log | head`: the reader has gone, which is fine
        sys.stdout = open(os.devnull, "w")   # noqa: SIM115 - so the exit's flush does not fail too
        return 0


def _up(argv: list[str]) -> int:
    """``%gpugeek up`` from a terminal, in a process of its own as a kernel would be
    (``magics/terminal.py``): this command reaches no kernel's connection, and loads nothing of it."""
    os.execv(sys.executable, [sys.executable, "-m", "gpugeek_jupyter.magics.terminal", *argv])
    return 1      # (execv returns only by raising)


def _check(args) -> int:
    """One line a way; 0 when every one looked at is ready. Loads the backends' registry and the
    SDKs it asks, never a kernel's rooms or Ray."""
    from .backends.interface import BACKENDS
    from .backends.readiness import check

    try:
        found = check(BACKENDS, args.ways, region=args.region, login=args.login, ssh_key=args.ssh_key, hosts=args.hosts)
    except GpugeekError as exc:
        return _fail(2, str(exc))
    print(found)
    return 0 if found.ready else 1


def _guard(cluster: dict) -> str:
    """Who enforces the limits, in the clusters table: the head's watchdog, this machine's, none."""
    if not cluster["live"]:
        return ""
    by = {"head": "head", "here": "here"}.get(cluster["guard_by"], "NONE")
    return by + (" (failing)" if cluster["guard_failing"] else "")


def _fail(status: int, message: str) -> int:
    print(f"gpugeek: {message}", file=sys.stderr)
    return status


# -- what each command prints ----------------------------------------------------------------------

def _clusters(board, args) -> int:
    board.catch_up()
    seen = board.overview()
    if args.json:
        return _json(seen)
    if not seen["clusters"]:
        print("no clusters yet")
        return 0
    rows = [[c["name"], c["backend"], c["state"] + (" (orphan)" if c["orphan"] else ""), _when(c["created"]),
             str(c["nodes"]), _gpus(c["gpus"]), _usd(c["usd_per_hour"]) + "/h" if c["live"] else "—",
             _usd(c["spent_usd"]), _budget(c), _guard(c), "simulated $" if c["simulated"] else ""]
            for c in seen["clusters"]]
    _table(["NAME", "BACKEND", "STATE", "STARTED", "NODES", "GPUS", "RATE", "SPENT", "BUDGET", "GUARD", ""], rows)
    print(f"{seen['live']} live · {_usd(seen['spent_usd'])} so far · {_usd(seen['usd_per_hour'])}/h")
    return 0


def _status(board, args) -> int:
    board.catch_up(args.name)
    seen = board.detail(args.name)
    if args.json:
        return _json(seen)
    print(f"{seen['name']} ({seen['backend']}, id {seen['id']}): {seen['status']}")
    print(f"{seen['nodes']} nodes · {_gpus(seen['gpus'])} GPUs · {_usd(seen['spent_usd'])} spent · "
          f"{_usd(seen['usd_per_hour'])}/h · budget {_budget(seen)}")
    if seen["live"]:
        print(f"guarded by {seen['guarded_by'] or 'nothing: budget and idle stop are not enforced'}")
    if seen["node_rows"]:
        print()
        _table(["NODE", "TYPE", "GPUS", "PRICING", "RATE", "UP", "COST"],
               [[n["node"][-12:], n["type"], _gpus(n["gpus"]), n["pricing"], _usd(n["usd_per_hour"]) + "/h",
                 duration(n["up_s"]) + ("" if n["alive"] else " (ended)"), _usd(n["usd"])] for n in seen["node_rows"]])
    if seen["utilisation"]:
        print()
        _table(["NODE", "DEVICE", "BUSY", "MEMORY"],
               [[u["node"][-12:], "host" if u["gpu"] is None else f"gpu{u['gpu']}", _pct(u["util_pct"]),
                 _pct(u["mem_pct"])] for u in seen["utilisation"]])
    if seen["events"]:
        print()
        _table(["AT", "EVENT", ""], [[_when(e["at"]), e["kind"], e["message"]] for e in reversed(seen["events"])])
    return 0


def _cost(board, args) -> int:
    board.catch_up(args.name)
    if args.name:
        runs = board.every_run(args.name)
        nodes = {run["id"]: board.detail(args.name, cluster_id=run["id"])["node_rows"] for run in runs}
        if args.json:
            return _json({"runs": [{**run, "node_rows": nodes[run["id"]]} for run in runs],
                          "total_usd": sum(r["spent_usd"] for r in runs)})
        rows = [[str(run["id"]), n["node"][-12:], n["type"], n["pricing"], _usd(n["usd_per_hour"]) + "/h",
                 duration(n["up_s"]), _usd(n["usd"])] for run in runs for n in nodes[run["id"]]]
        _table(["RUN", "NODE", "TYPE", "PRICING", "RATE", "UP", "COST"], rows)
    else:
        runs = board.every_run()
        if args.json:
            return _json({"runs": runs, "total_usd": sum(r["spent_usd"] for r in runs)})
        _table(["RUN", "NAME", "BACKEND", "STARTED", "STATE", "COST", ""],
               [[str(r["id"]), r["name"], r["backend"], _when(r["created"]), r["state"], _usd(r["spent_usd"]),
                 "simulated $" if r["simulated"] else ""] for r in runs])
    real = sum(r["spent_usd"] for r in runs if not r["simulated"])
    simulated = sum(r["spent_usd"] for r in runs if r["simulated"])
    print(f"total {_usd(real)}" + (f" (and {_usd(simulated)} simulated)" if simulated else "")
          + " — from the ledger: each node's lifetime × its $/h")
    return 0


def _log(board, args) -> int:
    try:
        since = time.time() - parse_duration(args.since, "--since") if args.since else None
    except GpugeekError as exc:
        return _fail(2, str(exc))
    events = board.events(args.name, since)
    if args.json:
        return _json(events)
    if not events:
        print("no events" + (f" for {args.name!r}" if args.name else "") + (f" in the last {args.since}"
                                                                             if args.since else ""))
        return 0
    _table(["AT", "CLUSTER", "EVENT", "WHO", "FROM", "$ THEN", "WHAT"],
           [[_when(e["at"]), e["cluster"], e["kind"], f"{e['user'] or '?'}, {e['client'] or '?'}", e["host"] or "?",
             "—" if e["usd"] is None else _usd(e["usd"]), e["message"] + (f"  {e['options']}" if e["options"] else "")]
            for e in events])
    return 0


def _down(board, name: str) -> int:
    try:
        print(board.stop(name, by=BY)["message"])
    except board.AlreadyStopped as exc:      # the kill switch's job is done
        print(str(exc))
    return 0


def _down_all(board, yes: bool) -> int:
    live = [c for c in board.overview()["clusters"] if c["live"]]
    if not live:
        print("no live clusters")
        return 0
    listed = ", ".join(f"{c['name']} ({c['backend']}, {_usd(c['usd_per_hour'])}/h)" for c in live)
    if not yes:
        if not sys.stdin.isatty():
            return _fail(2, f"down --all would stop {listed}: add --yes to stop them without being asked")
        if input(f"Stop {len(live)} live cluster{'s' if len(live) > 1 else ''}: {listed}? [y/N] ").strip().lower() \
                not in ("y", "yes"):
            print("nothing stopped")
            return 0
    failed = 0
    for c in live:
        try:
            _down(board, c["name"])
        except GpugeekError as exc:      # say it, and go on stopping the rest
            failed += 1
            _fail(1, str(exc))
    return 1 if failed else 0


# -- formatting --------------------------------------------------------------------------------------

def _json(data) -> int:
    print(json.dumps(data, indent=2, default=str))
    return 0


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def _gpus(value: float) -> str:
    return f"{value:g}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} %"


def _budget(cluster: dict) -> str:
    if cluster["budget_usd"] is None:
        return "—"
    return f"{_usd(cluster['budget_usd'])} ({cluster['budget_used'] * 100:.0f} % used)"


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


if __name__ == "__main__":
    sys.exit(main())
