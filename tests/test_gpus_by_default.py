"""A cell's workers take one GPU each where the cluster's machines have GPUs, and CPUs where they
have none: a GPU cluster whose cells ran on its CPU head billed its GPU machines for nothing. A cell
that asks for CPUs there (``--gpus-per-worker 0``) is told so in one line. (On AWS in a box, the
cell finds ``up --workers``'s warm group and runs on the GPU instances: tests/lab/test_aws_in_a_box.py.)"""

from __future__ import annotations

import pytest

from gpugeek_jupyter.backends.interface import capable
from gpugeek_jupyter.cells.jobs import on_its_gpus
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.provision.request import UpRequest, spec_of
from gpugeek_jupyter.workers.options import options


def _record(name: str, **asked):
    spec = spec_of(UpRequest.of(dict(name=name, **asked)))
    return registry.create(name, asked["backend"], spec.to_json(), simulated=False, budget_usd=None,
                           idle_minutes=None)


@pytest.mark.parametrize("asked, gpus", [
    (dict(backend="aws", gpu="T4", count=1), 1.0),                                    # a cloud's offer
    (dict(backend="sim", gpu="A100", count=8), 8.0),                                  # a rehearsal of one
    (dict(backend="ssh", hosts="root@10.0.0.9", usd_per_hour=1.0), 0.0),              # hosts not yet looked at
    (dict(backend="slurm", login="root@10.0.0.9", nodes=2, gpus_per_host=2, usd_per_hour=1.0), 2.0),
    (dict(backend="slurm", login="root@10.0.0.9", nodes=2, usd_per_hour=1.0), 0.0),  # no GRES asked
])
def test_a_cells_workers_take_a_gpu_each_where_the_machines_have_them(gpugeek_home, capsys, asked, gpus):
    record = _record("c", **asked)
    assert capable(record).worker_gpus(record) == gpus
    opts = on_its_gpus(options(workers=2), record, asked=None)
    assert opts.gpus_per_worker == (1.0 if gpus else 0.0)
    assert capsys.readouterr().out == ""


def test_cpus_asked_for_on_a_gpu_cluster_are_said_once(gpugeek_home, capsys):
    record = _record("g", backend="aws", gpu="A100", count=8)
    opts = on_its_gpus(options(workers=2, gpus_per_worker=0), record, asked=0)
    assert opts.gpus_per_worker == 0.0
    said = capsys.readouterr().out.strip()
    assert said == "note: the workers run on CPUs (--gpus-per-worker 0), though the cluster's machines have 8 GPUs " \
                   "each", said
    kept = on_its_gpus(options(workers=2, gpus_per_worker=0.5), record, asked=0.5)
    assert kept.gpus_per_worker == 0.5 and capsys.readouterr().out == ""
