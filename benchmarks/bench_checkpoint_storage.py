"""A checkpoint of a 100 MB state saved and restored (``torch.distributed.checkpoint``, as the
gg helper does it, through ``workers/storage.py``) to a local disk against S3.

    .venv/bin/python benchmarks/bench_checkpoint_storage.py [--rounds 5] [--mb 100]

S3 here is moto's server on 127.0.0.1 (what the tests use), so the figure is the cost of the S3
protocol path (s3fs, HTTP, the object store's own copy), not of a network: a real bucket adds
the link's bandwidth and latency on top. The two sides alternate round by round, the order
flipped every round; figures are medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

from gpugeek_jupyter.workers import storage

warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def one(place: storage.Place, state: dict, step: int) -> tuple[float, float]:
    """Seconds to save then load the state as one checkpoint."""
    began = time.perf_counter()
    path = place.step(step)
    dcp.save(state, checkpoint_id=path, no_dist=True)
    place.save_extra(path, 0, {"step": step})
    place.complete(path, step)
    saved = time.perf_counter() - began
    target = {k: torch.empty_like(v) for k, v in state.items()}
    began = time.perf_counter()
    latest = place.latest()
    dcp.load(target, checkpoint_id=latest, no_dist=True)
    place.load_extra(latest, 0)
    loaded = time.perf_counter() - began
    assert all(torch.equal(target[k], state[k]) for k in state), "the restored state differs"
    return saved, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    boto3.client("s3").create_bucket(Bucket="bench")
    folder = tempfile.mkdtemp(prefix="gpugeek-bench-ckpt-", dir="/var/tmp")
    try:
        n = args.mb * 2**20 // 4 // 4              # four float32 tensors of this many elements
        state = {f"layer{i}.weight": torch.randn(n) for i in range(4)}
        size = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
        places = {"local disk": storage.Place(f"{folder}/ckpt"), "S3 (moto, loopback)": storage.Place("s3://bench/ckpt")}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in places}
        for i in range(args.rounds):
            for name in (list(places) if i % 2 == 0 else list(reversed(places))):
                times[name].append(one(places[name], state, i + 1))
        print(f"a {size:.0f} MiB state, {args.rounds} rounds (medians; range)")
        med = {}
        for name, pairs in times.items():
            saves, loads = [p[0] for p in pairs], [p[1] for p in pairs]
            med[name] = (statistics.median(saves), statistics.median(loads))
            print(f"  {name:22s} save {med[name][0]:.2f} s ({min(saves):.2f}–{max(saves):.2f}), "
                  f"restore {med[name][1]:.2f} s ({min(loads):.2f}–{max(loads):.2f})")
        (ls, ll), (ss, sl) = med["local disk"], med["S3 (moto, loopback)"]
        print(f"  S3 / local: save {ss / ls:.1f}×, restore {sl / ll:.1f}×")
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
