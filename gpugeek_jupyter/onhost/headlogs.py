"""What a head's watchdog and keeper left in their logs, and whether each still runs: read on the
head (this script sent over SSH to its ``python -``) when a kernel finds no keeper there, so that
the kernel says what failed instead of guessing.

    python - HOME      the end of each log in HOME (the watchdog's home on the head) and which of
                       the two runs there, as JSON

A Slurm cluster's is read on its login node, which shares the home but not the head's processes:
there ``guard.log`` (``onhost.py guard``'s answer once its watchdog ended) tells instead.

Standard library only, and Python 3.8+: it must run on whatever Python a host has.
"""

import json
import os
import sys

LOGS = ("watchdog.log", "guard.log", "keeper.log")
TAIL_BYTES = 16384
# each process by its boot's module and the order it was given, a file in HOME (guard/keeping.py,
# onhost/script.py's ``guard``)
RUNS = {"watchdog": ("gpugeek_jupyter.guard.headwatch", "order.json"),
        "keeper": ("gpugeek_jupyter.keeper.serve", "keeper.json")}


def tail(path):
    """The last lines of a log, or None where there is none."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    return lines[1:] if size > TAIL_BYTES else lines      # the first one read may be cut


def running(home):
    """Which of the two runs on this host, by its command line (a zombie has ended); None without /proc."""
    if not os.path.isdir("/proc"):
        return None
    found = dict.fromkeys(RUNS, False)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat") as f:
                ended = f.read().rpartition(")")[2].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        for name, (module, order) in RUNS.items():
            if not ended and os.path.join(home, order) in args and any(module in arg for arg in args):
                found[name] = True
    return found


def main(argv):
    home = os.path.expanduser(argv[0])
    answer = {"ok": True, "home": home, "logs": {name: tail(os.path.join(home, name)) for name in LOGS},
              "running": running(home)}
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
