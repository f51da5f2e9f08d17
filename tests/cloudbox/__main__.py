"""``make cloudbox``: the box in the foreground until ^C (or SIGTERM), its exports printed.

    sudo PYTHONPATH=tests .venv/bin/python -m cloudbox [--region us-east-1 ...]

Then, in another shell (or a notebook's kernel started with these set)::

    export AWS_ENDPOINT_URL=…    # the lines it printed
    python -c 'import gpugeek_jupyter as gg; gg.up("try", offer="aws/…", internal_ips=True, yes=True)'
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import netlab

from . import box


def main() -> None:
    parser = argparse.ArgumentParser(description="EC2 in a box on this machine, a host behind each instance")
    parser.add_argument("--region", action="append", dest="regions", help="a region the box serves "
                        f"(again for more; default {', '.join(box.REGIONS)})")
    args = parser.parse_args()
    if reason := netlab.why_not():
        raise SystemExit(f"cloudbox: {reason}")
    try:
        made = box.start(tuple(args.regions or box.REGIONS))
    except RuntimeError as exc:
        raise SystemExit(f"cloudbox: {exc}") from None
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    print(f"# EC2 in a box at {made.endpoint} (regions {', '.join(made.regions)}); "
          f"instances get hosts at their private addresses in {box.VPC}. Point the AWS SDK at it:")
    print(made.exports(), end="", flush=True)
    print(f"# the hosts' wheel index (for [hosts] pip_index_url in config.toml): {made.lab.index_url}", flush=True)
    try:
        while not stopped.wait(5):
            for error in made.fabric.errors[:]:
                print(f"# fabric: {error}", file=sys.stderr, flush=True)
                made.fabric.errors.remove(error)
    finally:
        made.down()
        left = made.leftovers()
        print("# the box is gone" if not left else f"# left over: {', '.join(left)}", flush=True)


if __name__ == "__main__":
    main()
