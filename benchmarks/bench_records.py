"""What the typed records of the cell line and the lead line cost a cell, against the bare tuples
they replaced and against pickling the records whole.

    .venv/bin/python benchmarks/bench_records.py [--rounds 7]

One cell's three messages on a line — rank 0's cell to another rank (``CellSent``), that rank's
answer (``CellAnswer``), a journal read on the keeper's lead line (``Asked`` of a ``DrainCell``) —
each built, pickled, read back and rebuilt, in three encodings, alternated within every round on
this shared, noisy machine: the tuples of before, the records sent flat (``line.flat``: their
fields as a tuple, what the code does), and the records pickled whole (their class named in every
message). Prints the median of the rounds' per-cell times, in µs.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import timeit

from gpugeek_jupyter.workers.lead import Asked, DrainCell
from gpugeek_jupyter.workers.line import CellAnswer, CellSent, flat

CALL = b"x" * 400       # a pickled CellCall of a short cell is about this size
RESULT = {"ok": True, "output": "", "samples": []}


def tuples() -> None:
    pickle.loads(pickle.dumps((7, CALL, None), protocol=5))
    pickle.loads(pickle.dumps((7, RESULT), protocol=5))
    pickle.loads(pickle.dumps((3, "drain_all", (0.0, 5, 7)), protocol=5))


def records_flat() -> None:
    CellSent(*pickle.loads(pickle.dumps(flat(CellSent(7, CALL, None)), protocol=5)))
    CellAnswer(*pickle.loads(pickle.dumps(flat(CellAnswer(7, RESULT)), protocol=5)))
    Asked.read(pickle.loads(pickle.dumps(Asked(3, DrainCell(0.0, 5, 7)).wire(), protocol=5)))


def records_whole() -> None:
    pickle.loads(pickle.dumps(CellSent(7, CALL, None), protocol=5))
    pickle.loads(pickle.dumps(CellAnswer(7, RESULT), protocol=5))
    pickle.loads(pickle.dumps(Asked(3, DrainCell(0.0, 5, 7)), protocol=5))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    ways = {"tuples (before)": tuples, "records, flat (now)": records_flat, "records, pickled whole": records_whole}
    seen: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            seen[name].append(min(timeit.repeat(way, number=args.number, repeat=3)) / args.number * 1e6)
    base = statistics.median(seen["tuples (before)"])
    for name, times in seen.items():
        median = statistics.median(times)
        print(f"{name:24} {median:6.2f} µs a cell ({min(times):.2f}–{max(times):.2f}), "
              f"{median - base:+6.2f} µs against the tuples")


if __name__ == "__main__":
    main()
